//! How a WGSL kernel is declared (`wgsl_kernel!`, by its launcher in `kernels/`), assembled
//! into modules (`Kernel::source`, with the adapter's `TileConfig`) and compiled at first use
//! (`Pipelines`).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Mutex;

use crate::backend::options::ShaderChecks;
use crate::{Error, Result};

/// The largest head_dim the tiled attention kernel holds (attention.wgsl's HD_MAX).
pub(crate) const HD_MAX: usize = 128;
/// The largest head_dim attention.wgsl holds in its slices of HD_MAX columns, and the widest
/// values sparse_attention.wgsl holds.
pub(crate) const HD_WIDE: usize = 512;
/// The widest keys sparse_attention.wgsl holds (its HD_KEYS): latent attention's 512 + 64.
pub(crate) const HD_SPARSE: usize = 576;
/// Keys per staged attention tile (the shader's KT).
pub(crate) const KEY_TILE: usize = 32;

/// `include_str!` of files under `shaders/wgsl/`, concatenated.
macro_rules! wgsl {
    ($($file:literal),+) => {
        concat!($(include_str!(concat!("../../../shaders/wgsl/", $file))),+)
    };
}

/// Declares the kernel of the launcher this is written in, `KERNEL`: the file
/// `shaders/wgsl/<name>.wgsl` (entry point `<name>`) after the `shaders/wgsl/lib/` files it
/// uses, its storage bindings 1.. in order (`R` read, `RW` read-write; binding 0 is always
/// the uniform `Params`), the Rust mirror of its `Params`, and its `Form`. Under `cargo test`
/// it also checks the kernel with naga in every form and tile shape (`naga_checks`).
macro_rules! wgsl_kernel {
    (
        $name:literal,
        libs: [$($lib:literal),*],
        bindings: [$($access:ident),*],
        params: $params:ty,
        form: $form:ident $(,)?
    ) => {
        pub(crate) const KERNEL: $crate::backend::wgpu::pipelines::Kernel =
            $crate::backend::wgpu::pipelines::Kernel {
                name: $name,
                libs: concat!(
                    $(include_str!(concat!("../../../../shaders/wgsl/lib/", $lib, ".wgsl")),)*
                ),
                file: include_str!(concat!("../../../../shaders/wgsl/", $name, ".wgsl")),
                bindings: &[$($crate::backend::wgpu::pipelines::Access::$access),*],
                params_size: std::mem::size_of::<$params>(),
                form: $crate::backend::wgpu::pipelines::Form::$form,
            };

        #[cfg(test)]
        #[test]
        fn kernel_validates_and_translates() {
            $crate::backend::wgpu::pipelines::naga_checks::check(&KERNEL);
        }
    };
}
pub(crate) use wgsl_kernel;

/// A WGSL kernel, as its launcher in `kernels/<name>.rs` declares it (`wgsl_kernel!`).
#[derive(Debug)]
pub struct Kernel {
    /// The file stem and entry point.
    pub name: &'static str,
    /// The library files it uses.
    pub libs: &'static str,
    /// The kernel file.
    pub file: &'static str,
    /// Storage bindings 1.. in order.
    pub bindings: &'static [Access],
    /// Bytes of its uniform `Params` (the Rust mirror; naga_checks holds it to the WGSL).
    pub params_size: usize,
    pub form: Form,
}

/// Which modules a kernel is compiled into.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Form {
    /// One module.
    Plain,
    /// One module on cooperative matrices and f16 (built only where `Gpu::coop`).
    Coop,
    /// A dequantizing matmul: its file holds the format's weight functions, and the tile body
    /// it runs comes from its way of summing, one module each (`MatmulSum`).
    Matmul,
    /// split_gemm.wgsl: a module with the weights' residual plane, one for weights whose
    /// values hold at most f16's 11 significant bits (bf16 or f16 values, as every format
    /// rounded to a 16-bit model dtype gives: their residuals are exactly zero, and x_hi w_lo
    /// is skipped), and one of a single product x_hi w_hi (the one-product mode).
    WeightResidual,
    /// A row reduction over lib/row_sums.wgsl's segments: a module for each segment width
    /// (`Variant::Segment`), the width a constant so that its loops' bounds are.
    Segments,
}

/// One module of a kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Variant {
    /// A `Plain` or `Coop` kernel's module.
    Only,
    Sum(MatmulSum),
    WeightResidual(bool),
    /// split_gemm.wgsl's single product of the high planes.
    OneProduct,
    /// A `Segments` kernel's module for rows of this many invocations (a power of two, at
    /// most 256: `kernels::rms_norm::row_invocations`).
    Segment(u32),
}

impl Kernel {
    /// Every module its form compiles it into.
    pub fn variants(&self) -> Vec<Variant> {
        match self.form {
            Form::Plain | Form::Coop => vec![Variant::Only],
            Form::Matmul => [Running, PerStep, Split].map(Variant::Sum).to_vec(),
            Form::WeightResidual => vec![
                Variant::WeightResidual(true),
                Variant::WeightResidual(false),
                Variant::OneProduct,
            ],
            Form::Segments => (0..=8).map(|b| Variant::Segment(1 << b)).collect(),
        }
    }

    /// Whether module `v` needs f16, cooperative matrices and f16 packing (`Gpu::coop`).
    pub fn needs_coop(&self, v: Variant) -> bool {
        matches!(self.form, Form::Coop | Form::WeightResidual) || v == Variant::Sum(Split)
    }

    /// How module `v` sums over K: a matmul's own way, `Running` for the rest (which ignore
    /// it).
    pub fn sum(&self, v: Variant) -> MatmulSum {
        match v {
            Variant::Sum(sum) => sum,
            _ => Running,
        }
    }

    /// The full WGSL of module `v`: the tile-shape header of `tiles`, for a matmul the shared
    /// helpers and tile body of its way of summing, then the kernel's own libraries and file
    /// (`file` in place of the built-in one where given: `BackendOptions::wgpu_sources`).
    pub fn source(&self, v: Variant, tiles: &TileConfig, file: Option<&str>) -> String {
        // Extensions come before any declaration.
        let mut s = if self.needs_coop(v) {
            "enable f16;\nenable wgpu_cooperative_matrix;\n".to_string()
        } else {
            String::new()
        };
        s.push_str(&tiles.header(self.sum(v)));
        // The planes split_gemm.wgsl multiplies: the weights' residual, the activations'.
        let residuals = match v {
            Variant::WeightResidual(w) => Some((w, true)),
            Variant::OneProduct => Some((false, false)),
            _ => None,
        };
        if let Some((w, x)) = residuals {
            s.push_str(&format!(
                "const W_RESIDUAL: bool = {w};\nconst X_RESIDUAL: bool = {x};\n"
            ));
        }
        if let Variant::Segment(seg) = v {
            s.push_str(&format!("const SEG: u32 = {seg}u;\n"));
        }
        if let Variant::Sum(sum) = v {
            s.push_str(match sum {
                Split => wgsl!(
                    "lib/num.wgsl",
                    "lib/weights.wgsl",
                    "lib/planes.wgsl",
                    "lib/weight_planes.wgsl"
                ),
                Running | PerStep => wgsl!("lib/num.wgsl", "lib/weights.wgsl", "lib/matmul.wgsl"),
            });
        }
        s.push_str(self.libs);
        s.push_str(file.unwrap_or(self.file));
        s
    }
}

/// How a storage binding is declared in WGSL (`read` or `read_write`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    R,
    RW,
}

/// How a matmul kernel sums its products over the input features (K).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MatmulSum {
    /// One running f32 sum per output, in K steps of `TileConfig::mm_bk`: the fewest
    /// registers (on an H200 this lets two 256-thread workgroups share a multiprocessor).
    Running,
    /// Each K step of `TileConfig::mm_bk_per_step` summed on its own, then added to the total:
    /// the rounding error grows with K / BK + BK rather than K, closer to the f64 reference.
    /// For linears whose input was fake-quantized, where tiny differences in one layer's
    /// output flip the next layer's quantized values. Twice the accumulator registers.
    PerStep,
    /// f32-grade on cooperative matrices: the activations (split_rows.wgsl) and the weights
    /// (the format kernel compiled with lib/weight_planes.wgsl) as f16 high parts and
    /// residuals, multiplied by split_gemm.wgsl, three tensor-core products summed in f32 (two
    /// for weights of bf16 or f16 values). Only on adapters that offer them (`Gpu::coop`); its
    /// kernels are built there alone.
    Split,
}

use MatmulSum::{PerStep, Running, Split};

/// Workgroup memory of split_gemm.wgsl, the most of its modules': f16 tiles of 128 tokens and
/// 128 features, rows of 32 + 8 halves, of the staged planes (its f32-grade module with the
/// weights' residual stages four), and one 16 x 16 f32 accumulator for each of 8 subgroups.
pub const SPLIT_GEMM_WORKGROUP_BYTES: u32 = split_gemm_workgroup_bytes(4, 32);

/// split_gemm.wgsl's workgroup memory with `planes` tiles of rows of `k_step` + 8 halves (the
/// 16-byte stand-ins of the planes it does not stage aside).
const fn split_gemm_workgroup_bytes(planes: u32, k_step: u32) -> u32 {
    planes * 128 * (k_step + 8) * 2 + 8 * 256 * 4
}

/// Tile shapes of the matmul and attention kernels, chosen per adapter and compiled into every
/// module as a header of WGSL `const`s. (Pipeline-overridable constants cannot size the
/// function-scope register tiles, and naga lowers a const header to the same code.)
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TileConfig {
    /// Matmul threads along output features (x) and tokens (y): each thread computes an 8x8
    /// block, so the workgroup tile is (8 mm_ty) tokens x (8 mm_tx) features.
    pub mm_tx: u32,
    pub mm_ty: u32,
    /// Input features staged in shared memory per step (a multiple of 8 and of mm_ty), for the
    /// `Running` and the `PerStep` sum.
    pub mm_bk: u32,
    pub mm_bk_per_step: u32,
    /// Query tokens per attention workgroup (16 or 32; 4 threads each).
    pub attn_qb: u32,
}

impl TileConfig {
    /// 64x64 matmul tiles of 64 threads, 16 queries per attention workgroup: GPUs with less
    /// workgroup memory or fewer invocations a workgroup than `MEDIUM` needs.
    pub const SMALL: TileConfig = TileConfig {
        mm_tx: 8,
        mm_ty: 8,
        mm_bk: 16,
        mm_bk_per_step: 16,
        attn_qb: 16,
    };
    /// 128x128 matmul tiles of 256 threads with 16-deep K steps (32-deep with the per-step
    /// sum, whose extra accumulators keep it to one workgroup per multiprocessor anyway: on
    /// an H200 the deeper step was the faster there, the shallower one without it), 32
    /// queries per attention workgroup: discrete GPUs with at least 48 KiB of workgroup memory.
    pub const LARGE: TileConfig = TileConfig {
        mm_tx: 16,
        mm_ty: 16,
        mm_bk: 16,
        mm_bk_per_step: 32,
        attn_qb: 32,
    };
    /// `LARGE` tiles with 16-deep K steps and 16 queries per attention workgroup: GPUs with
    /// less workgroup memory than `LARGE` needs, and CPU adapters (lavapipe ran Qwen3-0.6B
    /// 1.19x faster on them than on `SMALL`'s; docs/performance.md, session 66).
    pub const MEDIUM: TileConfig = TileConfig {
        mm_bk_per_step: 16,
        attn_qb: 16,
        ..Self::LARGE
    };
    /// Every config `for_adapter` may pick, largest first.
    pub const CANDIDATES: [TileConfig; 3] = [Self::LARGE, Self::MEDIUM, Self::SMALL];

    /// Tokens and output features of one matmul workgroup's tile.
    pub fn mm_tile(&self) -> (u32, u32) {
        (8 * self.mm_ty, 8 * self.mm_tx)
    }

    /// K step of the matmuls that sum this way (the weight planes kernels have none: 0).
    pub fn bk(&self, sum: MatmulSum) -> u32 {
        match sum {
            Running => self.mm_bk,
            PerStep => self.mm_bk_per_step,
            Split => 0,
        }
    }

    /// Bytes of workgroup memory of the matmul kernels that sum this way (their
    /// `var<workgroup>` arrays, each padded to 16 bytes; `naga_checks` holds this
    /// against naga's layout).
    pub fn matmul_workgroup_bytes(&self, sum: MatmulSum) -> u32 {
        let (bm, bn) = self.mm_tile();
        match sum {
            // x and weight tiles: bk rows of bm (bn) f32 plus one vec4 of padding.
            Running | PerStep => self.bk(sum) * (bm + 4 + bn + 4) * 4,
            // The weight planes kernels use none.
            Split => 0,
        }
    }

    /// Bytes of workgroup memory of the larger matmul variant and of the attention kernel.
    pub fn workgroup_bytes(&self) -> (u32, u32) {
        let mm = self
            .matmul_workgroup_bytes(Running)
            .max(self.matmul_workgroup_bytes(PerStep));
        let (hd, kt, qb) = (HD_MAX as u32, KEY_TILE as u32, self.attn_qb);
        let attn = hd * (qb / 2 + 1) * 8   // Q^T in vec2 query pairs, one padding pair
            + hd * (kt + 4) * 4             // K^T / V in vec4 key quads, one padding quad
            + kt * qb * 4                   // scores
            + 2 * qb * 4                    // row start, correction per query
            + 4 * qb * 8                    // each thread's maxima of a query pair, then sums
            + 16; // the first key
        (mm, attn)
    }

    /// Whether the kernels compiled with this config respect the WGSL shapes they assume
    /// and fit the adapter's limits.
    pub fn check(&self, limits: &wgpu::Limits) -> std::result::Result<(), String> {
        let (tx, ty) = (self.mm_tx, self.mm_ty);
        if !(tx.is_power_of_two() && ty.is_power_of_two() && tx >= 4 && ty >= 4) {
            return Err(format!(
                "matmul threads {tx}x{ty}: powers of two >= 4 wanted"
            ));
        }
        for bk in [self.mm_bk, self.mm_bk_per_step] {
            if bk == 0 || bk % 8 != 0 || bk % ty != 0 || (2 * bk) % tx != 0 {
                return Err(format!(
                    "matmul K step {bk}: a multiple of 8, {ty} and {tx}/2 wanted"
                ));
            }
            // Staged activation quads (2 bk / tx) and weight chunks (bk / ty) per thread.
            if 2 * bk / tx > 4 || bk / ty > 2 {
                return Err(format!(
                    "matmul K step {bk}: at most 4 quads and 2 chunks per thread ({tx}x{ty} threads)"
                ));
            }
        }
        if self.attn_qb != 16 && self.attn_qb != 32 {
            return Err(format!("attention query tile {}: 16 or 32", self.attn_qb));
        }
        let threads = (tx * ty).max(4 * self.attn_qb);
        if threads > limits.max_compute_invocations_per_workgroup
            || tx * ty > limits.max_compute_workgroup_size_x
            || 4 * self.attn_qb > limits.max_compute_workgroup_size_x
        {
            return Err(format!(
                "{threads} threads per workgroup exceed the adapter's limit"
            ));
        }
        let (mm, attn) = self.workgroup_bytes();
        if mm.max(attn) > limits.max_compute_workgroup_storage_size {
            return Err(format!(
                "{} bytes of workgroup memory exceed the adapter's {}",
                mm.max(attn),
                limits.max_compute_workgroup_storage_size
            ));
        }
        Ok(())
    }

    /// The largest config the adapter takes: `LARGE` on GPUs with the memory for it, at most
    /// `MEDIUM` on CPU adapters, `SMALL` on small GPUs (`BackendOptions::wgpu_tiles` overrides:
    /// tuning).
    pub fn for_adapter(
        info: &wgpu::AdapterInfo,
        limits: &wgpu::Limits,
    ) -> std::result::Result<Self, String> {
        // CPU adapters take at most MEDIUM: LARGE's 32-query attention and deeper per-step
        // sums were chosen on GPUs and never measured on a CPU.
        let cpu = info.device_type == wgpu::DeviceType::Cpu;
        Self::CANDIDATES
            .into_iter()
            .filter(|c| !(cpu && *c == Self::LARGE))
            .find(|c| c.check(limits).is_ok())
            .ok_or_else(|| "no matmul/attention tile shape fits this adapter".to_string())
    }

    /// The WGSL `const` header that sizes the kernels, for matmuls that sum as `sum` says.
    pub fn header(&self, sum: MatmulSum) -> String {
        format!(
            "// Tile shape chosen for the adapter (pipelines.rs TileConfig).\n\
             const MM_TX: u32 = {}u;\nconst MM_TY: u32 = {}u;\nconst MM_BK: u32 = {}u;\n\
             const MM_PER_STEP_SUM: bool = {};\nconst ATTN_QB: u32 = {}u;\n",
            self.mm_tx,
            self.mm_ty,
            self.bk(sum),
            sum == PerStep,
            self.attn_qb
        )
    }
}

/// A compiled module: its pipeline and bind group layout.
pub(crate) type Pipeline = (wgpu::ComputePipeline, wgpu::BindGroupLayout);

/// Each kernel module compiled when first dispatched, inside a validation error scope (shader
/// or layout errors surface as errors naming the kernel).
pub(crate) struct Pipelines {
    tiles: TileConfig,
    coop: bool,
    checks: ShaderChecks,
    /// `BackendOptions::wgpu_sources`: a folder whose `<name>.wgsl` files replace the built-in
    /// kernel files.
    sources: Option<PathBuf>,
    built: Mutex<HashMap<(&'static str, Variant), Pipeline>>,
}

impl Pipelines {
    pub(crate) fn new(
        tiles: TileConfig,
        coop: bool,
        checks: ShaderChecks,
        sources: Option<PathBuf>,
    ) -> Self {
        Self {
            tiles,
            coop,
            checks,
            sources,
            built: Mutex::new(HashMap::new()),
        }
    }

    /// Module `variant` of `kernel`, compiled on `device` if this is its first use.
    pub(crate) fn get(
        &self,
        device: &wgpu::Device,
        kernel: &'static Kernel,
        variant: Variant,
    ) -> Result<Pipeline> {
        if kernel.needs_coop(variant) && !self.coop {
            return Err(Error::backend(
                "wgpu",
                format!("kernel {} needs cooperative matrices", kernel.name),
            ));
        }
        let mut built = self
            .built
            .lock()
            .map_err(|_| Error::backend("wgpu", "pipeline table lock poisoned"))?;
        if let Some(p) = built.get(&(kernel.name, variant)) {
            return Ok(p.clone());
        }
        let file = match &self.sources {
            Some(dir) => {
                let path = dir.join(format!("{}.wgsl", kernel.name));
                match std::fs::read_to_string(&path) {
                    Ok(text) => Some(text),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
                    Err(e) => return Err(Error::io(&path, e)),
                }
            }
            None => None,
        };
        let source = kernel.source(variant, &self.tiles, file.as_deref());
        let p = build_one(device, kernel, source, self.checks)?;
        built.insert((kernel.name, variant), p.clone());
        Ok(p)
    }
}

fn build_one(
    device: &wgpu::Device,
    kernel: &Kernel,
    source: String,
    checks: ShaderChecks,
) -> Result<Pipeline> {
    let name = kernel.name;
    let scope = device.push_error_scope(wgpu::ErrorFilter::Validation);
    let desc = wgpu::ShaderModuleDescriptor {
        label: Some(name),
        source: wgpu::ShaderSource::Wgsl(source.into()),
    };
    // Forced loop bounding (a counter in every loop iteration, against compilers that treat an
    // infinite loop as undefined) and integer-division guards are off by default: see
    // `ShaderChecks::Indices`.
    let checks = match checks {
        ShaderChecks::Indices => wgpu::ShaderRuntimeChecks {
            force_loop_bounding: false,
            int_div_checks: false,
            ..wgpu::ShaderRuntimeChecks::checked()
        },
        ShaderChecks::All => wgpu::ShaderRuntimeChecks::checked(),
        #[cfg(debug_assertions)]
        ShaderChecks::None => wgpu::ShaderRuntimeChecks::unchecked(),
    };
    // SAFETY: the kernels' loops terminate and divide by non-zero values only (see above);
    // out-of-range indices are clamped in every release build.
    let module = unsafe { device.create_shader_module_trusted(desc, checks) };
    let mut entries = vec![wgpu::BindGroupLayoutEntry {
        binding: 0,
        visibility: wgpu::ShaderStages::COMPUTE,
        ty: wgpu::BindingType::Buffer {
            ty: wgpu::BufferBindingType::Uniform,
            has_dynamic_offset: false,
            min_binding_size: None,
        },
        count: None,
    }];
    entries.extend(
        kernel
            .bindings
            .iter()
            .enumerate()
            .map(|(i, a)| wgpu::BindGroupLayoutEntry {
                binding: i as u32 + 1,
                visibility: wgpu::ShaderStages::COMPUTE,
                ty: wgpu::BindingType::Buffer {
                    ty: wgpu::BufferBindingType::Storage {
                        read_only: *a == Access::R,
                    },
                    has_dynamic_offset: false,
                    min_binding_size: None,
                },
                count: None,
            }),
    );
    let layout = device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
        label: Some(name),
        entries: &entries,
    });
    let pipeline_layout = device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
        label: Some(name),
        bind_group_layouts: &[Some(&layout)],
        immediate_size: 0,
    });
    let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
        label: Some(name),
        layout: Some(&pipeline_layout),
        module: &module,
        entry_point: Some(name),
        compilation_options: wgpu::PipelineCompilationOptions::default(),
        cache: None,
    });
    if let Some(e) = pollster::block_on(scope.pop()) {
        return Err(Error::backend(
            "wgpu",
            format!("compiling kernel `{name}`: {e}"),
        ));
    }
    Ok((pipeline, layout))
}

/// What `wgsl_kernel!` checks of each kernel under `cargo test`: every module, assembled as
/// the backend compiles it with every tile shape an adapter may be given, parsed and
/// validated with naga (the version wgpu uses) and written out as SPIR-V, MSL and HLSL (a
/// shader that would break on Vulkan, Metal or DX12 fails without a GPU); its uniform `Params`
/// of the size of its Rust mirror; its bindings as declared; the workgroup memory
/// `TileConfig` counts for it as naga lays it out.
#[cfg(test)]
pub(crate) mod naga_checks {
    use naga::back::{hlsl, msl, spv};
    use naga::valid::{Capabilities, ValidationFlags, Validator};

    use super::{
        Access, Form, Kernel, MatmulSum, SPLIT_GEMM_WORKGROUP_BYTES, TileConfig, Variant,
        split_gemm_workgroup_bytes,
    };

    pub(crate) fn check(kernel: &Kernel) {
        for tiles in TileConfig::CANDIDATES {
            for v in kernel.variants() {
                let (module, info) = validate(kernel, v, &tiles);
                translates(kernel, v, &module, &info);
                let mut layouter = naga::proc::Layouter::default();
                layouter
                    .update(module.to_ctx())
                    .expect("layout of the module's types");
                bindings_match(kernel, v, &module, &layouter);
                workgroup_bytes_match(kernel, v, &tiles, &module, &layouter);
                if kernel.needs_coop(v) {
                    coop_workgroup_words(kernel, v, &module, &layouter);
                }
            }
        }
    }

    fn validate(
        kernel: &Kernel,
        v: Variant,
        tiles: &TileConfig,
    ) -> (naga::Module, naga::valid::ModuleInfo) {
        let name = kernel.name;
        let source = kernel.source(v, tiles, None);
        let module = naga::front::wgsl::parse_str(&source)
            .unwrap_or_else(|e| panic!("{name} {v:?} {tiles:?}: {}", e.emit_to_string(&source)));
        // The cooperative-matrix modules need what `Gpu::open` requests for them.
        let caps = if kernel.needs_coop(v) {
            Capabilities::COOPERATIVE_MATRIX
                | Capabilities::SHADER_FLOAT16
                | Capabilities::SHADER_FLOAT16_IN_FLOAT32
        } else {
            Capabilities::empty()
        };
        let info = Validator::new(ValidationFlags::all(), caps)
            .validate(&module)
            .unwrap_or_else(|e| panic!("{name} {v:?} {tiles:?}: {}", e.emit_to_string(&source)));
        assert!(
            module.entry_points.iter().any(|e| e.name == name),
            "{name}: no entry point named {name}"
        );
        (module, info)
    }

    fn translates(
        kernel: &Kernel,
        v: Variant,
        module: &naga::Module,
        info: &naga::valid::ModuleInfo,
    ) {
        let name = kernel.name;
        spv::write_vec(module, info, &spv::Options::default(), None)
            .unwrap_or_else(|e| panic!("{name} {v:?}: SPIR-V: {e}"));
        let mut out = String::new();
        // wgpu offers cooperative matrices on Vulkan and Metal (MSL 2.3): naga has no HLSL
        // for them.
        let coop = kernel.needs_coop(v);
        let options = msl::Options {
            lang_version: if coop {
                (2, 3)
            } else {
                msl::Options::default().lang_version
            },
            ..Default::default()
        };
        msl::Writer::new(&mut out)
            .write(module, info, &options, &msl::PipelineOptions::default())
            .unwrap_or_else(|e| panic!("{name} {v:?}: MSL: {e}"));
        if !coop {
            let mut out = String::new();
            let options = hlsl::Options::default();
            hlsl::Writer::new(&mut out, &options, &hlsl::PipelineOptions::default())
                .write(module, info, None)
                .unwrap_or_else(|e| panic!("{name} {v:?}: HLSL: {e}"));
        }
    }

    /// Binding 0 the uniform `Params` of the Rust mirror's size, then the declared storage
    /// bindings with their access (a split matmul's weight-planes module leaves x and bias,
    /// bindings 1 and 3, undeclared: `matmul::split` binds placeholders there).
    fn bindings_match(
        kernel: &Kernel,
        v: Variant,
        module: &naga::Module,
        layouter: &naga::proc::Layouter,
    ) {
        let name = kernel.name;
        let mut bound: Vec<_> = module
            .global_variables
            .iter()
            .filter_map(|(_, g)| g.binding.as_ref().map(|b| (b.group, b.binding as usize, g)))
            .collect();
        bound.sort_by_key(|&(group, binding, _)| (group, binding));
        let numbers: Vec<usize> = bound.iter().map(|&(_, b, _)| b).collect();
        let all: Vec<usize> = (0..=kernel.bindings.len()).collect();
        if v == Variant::Sum(MatmulSum::Split) {
            assert!(
                !numbers.contains(&1) && !numbers.contains(&3),
                "{name} {v:?}"
            );
        } else {
            assert_eq!(numbers, all, "{name}: bindings 0..");
        }
        for (group, i, g) in bound {
            assert!(
                group == 0 && i < all.len(),
                "{name}: binding {group}/{i} undeclared"
            );
            if i == 0 {
                assert_eq!(g.space, naga::AddressSpace::Uniform, "{name}: binding 0");
                assert_eq!(
                    layouter[g.ty].size as usize, kernel.params_size,
                    "{name}: WGSL Params vs Rust Params size"
                );
                continue;
            }
            let want = match kernel.bindings[i - 1] {
                Access::R => naga::StorageAccess::LOAD,
                Access::RW => naga::StorageAccess::LOAD | naga::StorageAccess::STORE,
            };
            assert_eq!(
                g.space,
                naga::AddressSpace::Storage { access: want },
                "{name} {v:?}: binding {i}"
            );
        }
    }

    /// The workgroup memory `TileConfig` counts (from which a config is judged to fit an
    /// adapter) is what naga lays out (each variable padded to 16 bytes).
    fn workgroup_bytes_match(
        kernel: &Kernel,
        v: Variant,
        tiles: &TileConfig,
        module: &naga::Module,
        layouter: &naga::proc::Layouter,
    ) {
        let bytes: u32 = module
            .global_variables
            .iter()
            .filter(|(_, g)| g.space == naga::AddressSpace::WorkGroup)
            .map(|(_, g)| layouter[g.ty].size.next_multiple_of(16))
            .sum();
        let (matmul, attention) = tiles.workgroup_bytes();
        let want = match (kernel.form, kernel.name) {
            (Form::Matmul, _) => tiles.matmul_workgroup_bytes(kernel.sum(v)),
            // The staged planes: four at K steps of 32; three where the weights have no
            // residual; the high planes alone at K steps of 64 in the one-product module.
            (Form::WeightResidual, _) => match v {
                Variant::WeightResidual(true) => split_gemm_workgroup_bytes(4, 32),
                Variant::WeightResidual(false) => split_gemm_workgroup_bytes(3, 32) + 16,
                _ => split_gemm_workgroup_bytes(2, 64) + 2 * 16,
            },
            (_, "attention") => attention,
            _ => return,
        };
        assert_eq!(bytes, want, "{} {v:?} {tiles:?}", kernel.name);
        if kernel.form == Form::Matmul {
            assert!(
                bytes <= matmul,
                "{} {v:?}: larger than TileConfig's",
                kernel.name
            );
        }
    }

    /// A cooperative-matrix module's workgroup variables: each a whole number of 16-byte words
    /// (NVIDIA's Vulkan driver places them in an order of its own and shifts the cooperative
    /// loads and stores of an array that does not start 16-byte aligned by the misalignment),
    /// all within the workgroup memory `coop_offered` asks of an adapter.
    fn coop_workgroup_words(
        kernel: &Kernel,
        v: Variant,
        module: &naga::Module,
        layouter: &naga::proc::Layouter,
    ) {
        let mut total = 0;
        for (_, g) in module.global_variables.iter() {
            if g.space == naga::AddressSpace::WorkGroup {
                let size = layouter[g.ty].size;
                assert!(
                    size.is_multiple_of(16),
                    "{} {v:?}: workgroup variable {:?} of {size} bytes",
                    kernel.name,
                    g.name
                );
                total += size;
            }
        }
        assert!(
            total <= SPLIT_GEMM_WORKGROUP_BYTES,
            "{} {v:?}: {total} bytes of workgroup memory",
            kernel.name
        );
    }

    /// Every .wgsl file is a kernel declared by the launcher of its name, or a library one
    /// of them uses.
    #[test]
    fn every_wgsl_file_belongs_to_a_kernel() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let launchers = root.join("src/backend/wgpu/kernels");
        let read = |p: &std::path::Path| std::fs::read_to_string(p).expect("read");
        let mut declarations = read(&root.join("src/backend/wgpu/pipelines.rs"));
        for e in std::fs::read_dir(&launchers).expect("kernels/") {
            declarations.push_str(&read(&e.expect("dir entry").path()));
        }
        let stems = |dir: std::path::PathBuf| -> Vec<String> {
            std::fs::read_dir(dir)
                .expect("shaders/wgsl")
                .map(|e| e.expect("dir entry").path())
                .filter(|p| p.extension().is_some_and(|x| x == "wgsl"))
                .map(|p| p.file_stem().unwrap().to_string_lossy().into_owned())
                .collect()
        };
        for stem in stems(root.join("shaders/wgsl")) {
            let launcher = read(&launchers.join(format!("{stem}.rs")));
            assert!(
                launcher.contains("wgsl_kernel!(") && launcher.contains(&format!("\"{stem}\",")),
                "kernels/{stem}.rs does not declare {stem}.wgsl"
            );
        }
        for stem in stems(root.join("shaders/wgsl/lib")) {
            assert!(
                declarations.contains(&format!("\"{stem}\""))
                    || declarations.contains(&format!("lib/{stem}.wgsl")),
                "lib/{stem}.wgsl is used by no kernel"
            );
        }
    }
}
