//! Every compute pipeline, built once at backend creation and looked up by a typed kernel id.
//! Shader or layout errors surface there as errors naming the kernel, before any long run.

use std::collections::HashMap;

use crate::backend::options::ShaderChecks;
use crate::{Error, Result};

/// The largest head_dim the tiled attention kernel holds (attention.wgsl's HD_MAX).
pub(crate) const HD_MAX: usize = 128;
/// The largest head_dim attention_wide.wgsl holds (its HD_WIDE).
pub(crate) const HD_WIDE: usize = 256;
/// Keys per staged attention tile (the shader's KT).
pub(crate) const KEY_TILE: usize = 32;

macro_rules! wgsl {
    ($($file:literal),+) => {
        concat!($(include_str!(concat!("../../../shaders/wgsl/", $file))),+)
    };
}

/// One kernel = one `shaders/wgsl/<name>.wgsl` file (entry point `<name>`) = one wrapper in
/// `kernels/<name>.rs`; the matmuls are compiled once per way of summing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KernelId {
    MatmulDense(MatmulSum),
    MatmulPackedInt(MatmulSum),
    MatmulFp4(MatmulSum),
    MatmulUnpacked8(MatmulSum),
    ActQuant,
    RmsNorm,
    Rope,
    Attention,
    AttentionWide,
    GatedAct,
    Softcap,
    Add,
    Gather,
    ScatterAdd,
    CopyColumns,
    LseUpdate,
    KldAccum,
    SplitRows,
    /// With the weights' residual plane (`true`), or for weights whose values hold at most
    /// f16's 11 significant bits (bf16 or f16 values, as every format rounded to a 16-bit
    /// model dtype gives): their residuals are exactly zero, and x_hi w_lo is skipped.
    SplitGemm(bool),
}

/// How a storage binding is declared in WGSL (`read` or `read_write`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    Read,
    ReadWrite,
}

use Access::{Read as R, ReadWrite as RW};

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

impl KernelId {
    pub const ALL: [KernelId; 28] = [
        KernelId::MatmulDense(Running),
        KernelId::MatmulDense(PerStep),
        KernelId::MatmulDense(Split),
        KernelId::MatmulPackedInt(Running),
        KernelId::MatmulPackedInt(PerStep),
        KernelId::MatmulPackedInt(Split),
        KernelId::MatmulFp4(Running),
        KernelId::MatmulFp4(PerStep),
        KernelId::MatmulFp4(Split),
        KernelId::MatmulUnpacked8(Running),
        KernelId::MatmulUnpacked8(PerStep),
        KernelId::MatmulUnpacked8(Split),
        KernelId::ActQuant,
        KernelId::RmsNorm,
        KernelId::Rope,
        KernelId::Attention,
        KernelId::AttentionWide,
        KernelId::GatedAct,
        KernelId::Softcap,
        KernelId::Add,
        KernelId::Gather,
        KernelId::ScatterAdd,
        KernelId::CopyColumns,
        KernelId::LseUpdate,
        KernelId::KldAccum,
        KernelId::SplitRows,
        KernelId::SplitGemm(true),
        KernelId::SplitGemm(false),
    ];

    /// The WGSL file stem and entry point.
    pub fn name(self) -> &'static str {
        match self {
            KernelId::MatmulDense(_) => "matmul_dense",
            KernelId::MatmulPackedInt(_) => "matmul_packed_int",
            KernelId::MatmulFp4(_) => "matmul_fp4",
            KernelId::MatmulUnpacked8(_) => "matmul_unpacked8",
            KernelId::ActQuant => "act_quant",
            KernelId::RmsNorm => "rms_norm",
            KernelId::Rope => "rope",
            KernelId::Attention => "attention",
            KernelId::AttentionWide => "attention_wide",
            KernelId::GatedAct => "gated_act",
            KernelId::Softcap => "softcap",
            KernelId::Add => "add",
            KernelId::Gather => "gather",
            KernelId::ScatterAdd => "scatter_add",
            KernelId::CopyColumns => "copy_columns",
            KernelId::LseUpdate => "lse_update",
            KernelId::KldAccum => "kld_accum",
            KernelId::SplitRows => "split_rows",
            KernelId::SplitGemm(_) => "split_gemm",
        }
    }

    /// How this kernel sums over K: the matmuls' own way, `Running` for the rest (which
    /// ignore it).
    pub fn sum(self) -> MatmulSum {
        match self {
            KernelId::MatmulDense(sum)
            | KernelId::MatmulPackedInt(sum)
            | KernelId::MatmulFp4(sum)
            | KernelId::MatmulUnpacked8(sum) => sum,
            _ => Running,
        }
    }

    /// Whether this kernel belongs to the split matmuls (built only where `Gpu::coop`: they
    /// need f16, cooperative matrices and f16 packing).
    pub fn needs_coop(self) -> bool {
        self.sum() == Split || matches!(self, KernelId::SplitRows | KernelId::SplitGemm(_))
    }

    /// The full WGSL module: the tile-shape header of `tiles`, shared helpers from
    /// `shaders/wgsl/lib/` (for a matmul, the tile body of its way of summing), then the
    /// kernel file.
    pub fn source(self, tiles: &TileConfig) -> String {
        // Extensions come before any declaration.
        let mut s = if self.needs_coop() {
            "enable f16;\nenable wgpu_cooperative_matrix;\n".to_string()
        } else {
            String::new()
        };
        s.push_str(&tiles.header(self.sum()));
        if let KernelId::SplitGemm(residual) = self {
            s.push_str(&format!("const W_RESIDUAL: bool = {residual};\n"));
        }
        if self.is_matmul() {
            s.push_str(match self.sum() {
                Split => wgsl!(
                    "lib/num.wgsl",
                    "lib/weights.wgsl",
                    "lib/planes.wgsl",
                    "lib/weight_planes.wgsl"
                ),
                Running | PerStep => wgsl!("lib/num.wgsl", "lib/weights.wgsl", "lib/matmul.wgsl"),
            });
        }
        s.push_str(self.body());
        s
    }

    /// A dequantizing matmul: its file holds the format's weight functions, and the tile body
    /// it runs comes from its way of summing (`source`).
    fn is_matmul(self) -> bool {
        matches!(
            self,
            KernelId::MatmulDense(_)
                | KernelId::MatmulPackedInt(_)
                | KernelId::MatmulFp4(_)
                | KernelId::MatmulUnpacked8(_)
        )
    }

    fn body(self) -> &'static str {
        match self {
            KernelId::MatmulDense(_) => wgsl!("matmul_dense.wgsl"),
            KernelId::MatmulPackedInt(_) => wgsl!("lib/scaled.wgsl", "matmul_packed_int.wgsl"),
            KernelId::MatmulFp4(_) => wgsl!("matmul_fp4.wgsl"),
            KernelId::MatmulUnpacked8(_) => wgsl!("lib/scaled.wgsl", "matmul_unpacked8.wgsl"),
            KernelId::ActQuant => wgsl!("lib/num.wgsl", "lib/quant.wgsl", "act_quant.wgsl"),
            KernelId::RmsNorm => wgsl!("lib/num.wgsl", "rms_norm.wgsl"),
            KernelId::Rope => wgsl!("lib/num.wgsl", "rope.wgsl"),
            KernelId::Attention => wgsl!("lib/num.wgsl", "attention.wgsl"),
            KernelId::AttentionWide => wgsl!("lib/num.wgsl", "attention_wide.wgsl"),
            KernelId::GatedAct => wgsl!("lib/num.wgsl", "gated_act.wgsl"),
            KernelId::Softcap => wgsl!("lib/num.wgsl", "softcap.wgsl"),
            KernelId::Add => wgsl!("lib/num.wgsl", "add.wgsl"),
            KernelId::Gather => wgsl!("lib/num.wgsl", "gather.wgsl"),
            KernelId::ScatterAdd => wgsl!("lib/num.wgsl", "scatter_add.wgsl"),
            KernelId::CopyColumns => wgsl!("lib/num.wgsl", "copy_columns.wgsl"),
            KernelId::LseUpdate => wgsl!("lib/num.wgsl", "lse_update.wgsl"),
            KernelId::KldAccum => wgsl!("lib/num.wgsl", "kld_accum.wgsl"),
            KernelId::SplitRows => wgsl!("lib/planes.wgsl", "split_rows.wgsl"),
            KernelId::SplitGemm(_) => wgsl!("lib/planes.wgsl", "split_gemm.wgsl"),
        }
    }

    /// Storage bindings 1.. in order (binding 0 is always the uniform `Params`).
    pub fn storage_bindings(self) -> &'static [Access] {
        match self {
            // Matmuls: x, y, bias (shaders/wgsl/lib/matmul.wgsl), then the weight's buffers.
            KernelId::MatmulDense(_) => &[R, RW, R, R],
            KernelId::MatmulPackedInt(_) => &[R, RW, R, R, R, R, R],
            KernelId::MatmulFp4(_) | KernelId::MatmulUnpacked8(_) => &[R, RW, R, R, R, R],
            KernelId::ActQuant => &[R, RW],
            KernelId::RmsNorm => &[R, R, RW],
            KernelId::Rope => &[RW, R, R, R],
            KernelId::Attention | KernelId::AttentionWide => &[R, R, R, R, R, RW],
            KernelId::GatedAct => &[R, R, RW],
            KernelId::Softcap => &[RW],
            KernelId::Add => &[RW, R],
            KernelId::Gather => &[R, R, RW],
            KernelId::ScatterAdd => &[RW, R, R, R],
            KernelId::CopyColumns => &[R, RW],
            KernelId::LseUpdate => &[R, R, RW, RW],
            KernelId::KldAccum => &[R, R, R, R, RW, RW],
            KernelId::SplitRows => &[R, RW],
            // x planes, y, bias, weight planes.
            KernelId::SplitGemm(_) => &[R, RW, R, R],
        }
    }
}

/// Workgroup memory of split_gemm.wgsl: high and residual f16 tiles of 128 tokens and 128
/// features, rows of 32 + 8 halves, and one 16 x 16 f32 accumulator for each of 8 subgroups.
pub const SPLIT_GEMM_WORKGROUP_BYTES: u32 = 2 * (128 + 128) * 40 * 2 + 8 * 256 * 4;

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
    /// 64x64 matmul tiles of 64 threads, 16 queries per attention workgroup: CPU adapters
    /// (lavapipe) and GPUs with 32 KiB of workgroup memory or less.
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
    /// less workgroup memory than `LARGE` needs.
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
    /// `var<workgroup>` arrays, each padded to 16 bytes; tests/suite/shaders.rs checks this
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
            + 4 * qb * 4                    // row start, 2 corrections, sum per query
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

    /// The largest config the adapter takes: `LARGE` on GPUs with the memory for it, `SMALL`
    /// on CPU adapters and small GPUs (`BackendOptions::wgpu_tiles` overrides: tuning).
    pub fn for_adapter(
        info: &wgpu::AdapterInfo,
        limits: &wgpu::Limits,
    ) -> std::result::Result<Self, String> {
        if info.device_type == wgpu::DeviceType::Cpu {
            return Ok(Self::SMALL);
        }
        Self::CANDIDATES
            .into_iter()
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

pub(crate) struct Pipelines {
    map: HashMap<KernelId, (wgpu::ComputePipeline, wgpu::BindGroupLayout)>,
}

impl Pipelines {
    /// Compiles every kernel inside a validation error scope (the cooperative-matrix ones
    /// only with `coop`).
    pub(crate) fn build(
        device: &wgpu::Device,
        tiles: &TileConfig,
        coop: bool,
        checks: ShaderChecks,
    ) -> Result<Self> {
        let mut map = HashMap::new();
        for kernel in KernelId::ALL
            .into_iter()
            .filter(|k| coop || !k.needs_coop())
        {
            map.insert(kernel, build_one(device, kernel, tiles, checks)?);
        }
        Ok(Self { map })
    }

    pub(crate) fn get(
        &self,
        kernel: KernelId,
    ) -> Result<(&wgpu::ComputePipeline, &wgpu::BindGroupLayout)> {
        self.map
            .get(&kernel)
            .map(|(p, l)| (p, l))
            .ok_or_else(|| Error::backend("wgpu", format!("kernel {} not built", kernel.name())))
    }
}

fn build_one(
    device: &wgpu::Device,
    kernel: KernelId,
    tiles: &TileConfig,
    checks: ShaderChecks,
) -> Result<(wgpu::ComputePipeline, wgpu::BindGroupLayout)> {
    let name = kernel.name();
    let scope = device.push_error_scope(wgpu::ErrorFilter::Validation);
    let desc = wgpu::ShaderModuleDescriptor {
        label: Some(name),
        source: wgpu::ShaderSource::Wgsl(kernel.source(tiles).into()),
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
    entries.extend(kernel.storage_bindings().iter().enumerate().map(|(i, a)| {
        wgpu::BindGroupLayoutEntry {
            binding: i as u32 + 1,
            visibility: wgpu::ShaderStages::COMPUTE,
            ty: wgpu::BindingType::Buffer {
                ty: wgpu::BufferBindingType::Storage {
                    read_only: *a == Access::Read,
                },
                has_dynamic_offset: false,
                min_binding_size: None,
            },
            count: None,
        }
    }));
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
