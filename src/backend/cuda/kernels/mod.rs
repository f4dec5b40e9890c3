//! One launch wrapper per `shaders/cuda/*.cu` file. Wrappers take raw device addresses
//! (`u64`, offsets already applied) so callers can pass row ranges of a buffer; the backend
//! owns every buffer and keeps it alive until the stream has used it.

pub mod act_quant;
pub mod attention;
pub mod bias_add;
pub mod combine_experts;
pub mod copy_columns;
pub mod dequant;
pub mod elementwise;
pub mod expert_down;
pub mod expert_gate_up;
pub mod expert_tiles;
pub mod gather_rows;
pub mod lm_head_lse;
pub mod nll;
pub mod qk_norm_rope;
pub mod rms_norm;
pub mod rope;
pub mod route;
pub mod scatter_add;
pub mod softcap;
pub mod split_bf16;
pub mod split_columns;
pub mod split_gemm;
pub mod spread_rows;

use std::mem::MaybeUninit;
use std::sync::Arc;

use cudarc::driver::sys::{
    self, CUtensorMapDataType, CUtensorMapFloatOOBfill, CUtensorMapInterleave,
    CUtensorMapL2promotion, CUtensorMapSwizzle,
};
use cudarc::driver::{CudaContext, CudaFunction, CudaStream, DeviceRepr, LaunchArgs, LaunchConfig};

use super::nvrtc::{self, Source};
use crate::{Error, Result};
use attention::{FlashAttention, Operands};

/// Threads per block of the elementwise and per-row kernels.
const THREADS: u32 = 256;

macro_rules! source {
    ($name:literal, $exact:expr) => {
        source!($name, $exact, false)
    };
    ($name:literal, $exact:expr, $arch_specific:expr) => {
        Source {
            name: $name,
            code: include_str!(concat!("../../../../shaders/cuda/", $name, ".cu")),
            exact: $exact,
            arch_specific: $arch_specific,
        }
    };
}

/// Every kernel source: whether it must be compiled without FMA contraction, and whether it
/// targets exactly Hopper (`flash_attention_sm90`, `expert_gate_up`, `expert_down`,
/// `lm_head_lse`, `split_gemm`: loaded on sm_90 only; `flash_attention` needs sm_80).
const SOURCES: [Source; 26] = [
    source!("dequant", true),
    source!("act_quant", true),
    source!("bias_add", false),
    source!("rms_norm", false),
    source!("rope", false),
    source!("qk_norm_rope", false),
    source!("elementwise", false),
    source!("gather_rows", false),
    source!("spread_rows", false),
    source!("scatter_add", false),
    source!("combine_experts", false),
    source!("copy_columns", false),
    source!("route", true),
    source!("attention", false),
    source!("nll", false),
    source!("softcap", false),
    source!("split_bf16", true),
    source!("split_rows_f16", true),
    source!("split_columns_f16", true),
    source!("weight_f16", false),
    source!("flash_attention", false),
    source!("flash_attention_sm90", false, true),
    source!("expert_gate_up", false, true),
    source!("expert_down", false, true),
    source!("lm_head_lse", false, true),
    source!("split_gemm", false, true),
];

/// The kernel sources a device of compute capability `cc` loads.
pub fn source_names(cc: (i32, i32)) -> Vec<&'static str> {
    SOURCES
        .iter()
        .filter(|s| loaded_on(s, cc))
        .map(|s| s.name)
        .collect()
}

/// Compiles source `name` for compute capability `cc` with NVRTC, without a device or cache.
pub fn compile(name: &str, cc: (i32, i32)) -> Result<()> {
    nvrtc::compile(source(name)?, cc).map(drop)
}

fn source(name: &str) -> Result<&'static Source> {
    SOURCES
        .iter()
        .find(|s| s.name == name)
        .ok_or_else(|| Error::backend("cuda", format!("no kernel source {name}.cu")))
}

/// Whether a device of compute capability `cc` loads `src` (the one rule `Kernels::load`
/// follows).
fn loaded_on(src: &Source, cc: (i32, i32)) -> bool {
    match src.name {
        // mma.sync on bf16 and cp.async need sm_80; an architecture-specific source (wgmma)
        // is exactly sm_90's.
        "flash_attention" => cc.0 >= 8,
        _ => !src.arch_specific || cc == (9, 0),
    }
}

/// Element type of a device tensor: activations are bf16 or f32; parameter vectors and the
/// residual stream are f32.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dt {
    Bf16 = 0,
    F32 = 1,
}

impl Dt {
    pub fn bytes(self) -> usize {
        match self {
            Dt::Bf16 => 2,
            Dt::F32 => 4,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Dt::Bf16 => "bf16",
            Dt::F32 => "f32",
        }
    }
}

/// A kernel with one entry point per activation type (`<name>_bf16`, `<name>_f32`).
pub struct Typed {
    pub bf16: CudaFunction,
    pub f32: CudaFunction,
}

impl Typed {
    pub fn get(&self, dt: Dt) -> &CudaFunction {
        match dt {
            Dt::Bf16 => &self.bf16,
            Dt::F32 => &self.f32,
        }
    }
}

/// A kernel with one entry point per (input, output) type pair (`<name>_<in>_<out>`): the ops
/// whose output may feed a linear that quantizes its input (which then wants it in f32), and
/// the row gather that widens the embedding into the f32 residual stream.
pub struct InOut {
    /// Indexed `[input][output]`, bf16 first.
    fns: [[CudaFunction; 2]; 2],
}

impl InOut {
    pub fn get(&self, input: Dt, output: Dt) -> &CudaFunction {
        &self.fns[input as usize][output as usize]
    }
}

/// The device's multiprocessors: a persistent kernel's blocks.
pub fn multiprocessors(ctx: &Arc<CudaContext>) -> Result<usize> {
    let n = ctx
        .attribute(
            cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
        )
        .map_err(|e| Error::backend("cuda", format!("multiprocessor count: {e:?}")))?;
    Ok(n.max(1) as usize)
}

/// Every kernel function, loaded once per device.
pub struct Kernels {
    pub dequant_int: dequant::KernelPair,
    pub dequant_int4: dequant::KernelPair,
    pub dequant_fp4: dequant::KernelPair,
    pub dequant_unpacked: dequant::KernelPair,
    pub act_quant: InOut,
    pub bias_add: Typed,
    /// Input: the f32 residual stream or an activation.
    pub rms_norm: InOut,
    /// Input: the update added to the f32 residual stream before the norm.
    pub add_rms_norm: InOut,
    /// `rms_norm` and `add_rms_norm` by input type, the output as three bf16 planes.
    pub rms_norm_planes: Typed,
    pub add_rms_norm_planes: Typed,
    pub rope: Typed,
    pub qk_norm_rope: Typed,
    /// `f32 += bf16` and `f32 += f32`.
    pub add_assign: Typed,
    pub gated_act: InOut,
    pub to_bf16: CudaFunction,
    /// Input: the table (embedding) or the final hidden states (scored rows).
    pub gather_rows: InOut,
    /// A mixture's input rows written to their routed places.
    pub spread_rows: Typed,
    /// Input: an expert's output rows; the accumulator is f32.
    pub scatter_add: Typed,
    /// Input: the experts' output rows; the accumulator is f32.
    pub combine_experts: Typed,
    /// Input: any activation or an f32 tensor.
    pub copy_columns: InOut,
    /// `route_topk_128`, `_256` and `_512`: for up to that many experts.
    pub route_topk: [CudaFunction; 3],
    pub route_fill: CudaFunction,
    pub attention: InOut,
    /// Tensor-core attention for head_dim 64, 128, 192 and 256 (sm_80 and later only; the
    /// sizes whose shared memory the device has).
    pub flash_attention: Option<FlashAttention>,
    /// The same for 64 and 128 on Hopper's wgmma (sm_90 only; the architecture-specific
    /// target).
    pub flash_attention_sm90: Option<FlashAttention>,
    /// `flash_attention.cu` on f32 q, k and v split into f16 planes (`--dtype f32-grade`):
    /// head_dim 64 and 128 where the shared memory allows.
    pub flash_attention_split: Option<FlashAttention>,
    /// A mixture's gathered gate/up products and SiLU in one kernel (sm_90 only).
    pub expert_gate_up: Option<expert_gate_up::ExpertGateUp>,
    /// A mixture's grouped down products in one kernel (sm_90 only).
    pub expert_down: Option<expert_down::ExpertDown>,
    /// The lm_head GEMM with the log-sum-exp in its epilogue (sm_90 only).
    pub lm_head_lse: Option<lm_head_lse::LmHeadLse>,
    pub lse_tile: CudaFunction,
    pub nll_finish: CudaFunction,
    pub nll_from_slices: CudaFunction,
    pub kld_tile: CudaFunction,
    pub softcap: CudaFunction,
    pub split_bf16: CudaFunction,
    pub split_rows_f16: CudaFunction,
    pub split_gated_rows_f16: CudaFunction,
    pub column_top: CudaFunction,
    pub split_columns_f16: CudaFunction,
    pub weight_f16: CudaFunction,
    /// `--dtype f32-grade`'s GEMMs of bf16-valued weights on f16 planes with promoted
    /// accumulation (sm_90 only).
    pub split_gemm: Option<split_gemm::SplitGemm>,
}

impl Kernels {
    pub fn load(
        ctx: &Arc<CudaContext>,
        cc: (i32, i32),
        sources: Option<&std::path::Path>,
    ) -> Result<Self> {
        let module = |name: &str| nvrtc::load(ctx, source(name)?, cc, sources);
        let loads = |name: &str| source(name).map(|s| loaded_on(s, cc));
        let func = |m: &Arc<cudarc::driver::CudaModule>, name: &str| {
            m.load_function(name)
                .map_err(|e| Error::backend("cuda", format!("kernel {name}: {e:?}")))
        };
        let typed = |m: &Arc<cudarc::driver::CudaModule>, name: &str| -> Result<Typed> {
            Ok(Typed {
                bf16: func(m, &format!("{name}_bf16"))?,
                f32: func(m, &format!("{name}_f32"))?,
            })
        };
        let in_out = |m: &Arc<cudarc::driver::CudaModule>, name: &str| -> Result<InOut> {
            let f = |i: Dt, o: Dt| func(m, &format!("{name}_{}_{}", i.name(), o.name()));
            Ok(InOut {
                fns: [
                    [f(Dt::Bf16, Dt::Bf16)?, f(Dt::Bf16, Dt::F32)?],
                    [f(Dt::F32, Dt::Bf16)?, f(Dt::F32, Dt::F32)?],
                ],
            })
        };
        let dequant = module("dequant")?;
        let pair = |name: &str| -> Result<dequant::KernelPair> {
            Ok(dequant::KernelPair {
                one: typed(&dequant, name)?,
                experts: typed(&dequant, &format!("{name}_experts"))?,
            })
        };
        let act = module("act_quant")?;
        let bias = module("bias_add")?;
        let norm = module("rms_norm")?;
        let rope = module("rope")?;
        let qk_norm_rope = module("qk_norm_rope")?;
        let elem = module("elementwise")?;
        let gather = module("gather_rows")?;
        let spread = module("spread_rows")?;
        let scatter = module("scatter_add")?;
        let combine = module("combine_experts")?;
        let copy = module("copy_columns")?;
        let route = module("route")?;
        let attn = module("attention")?;
        let nll = module("nll")?;
        let softcap = module("softcap")?;
        let split = module("split_bf16")?;
        let columns = module("split_columns_f16")?;
        let max_smem = ctx
            .attribute(
                cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
            )
            .map_err(|e| Error::backend("cuda", format!("shared memory per block: {e:?}")))?
            as usize;
        let flash = |m: &Arc<cudarc::driver::CudaModule>, name, operands, dims: &[usize]| {
            FlashAttention::load(m, name, operands, dims, max_smem)
        };
        let (flash_attention, flash_attention_split) = if loads("flash_attention")? {
            let m = module("flash_attention")?;
            let planes = |planes| Operands::Pointers { row_pad: 8, planes };
            (
                Some(flash(
                    &m,
                    "flash_attention",
                    planes(1),
                    &[64, 128, 192, 256],
                )?),
                Some(flash(&m, "flash_attention_split", planes(2), &[64, 128])?),
            )
        } else {
            (None, None)
        };
        let flash_attention_sm90 = if loads("flash_attention_sm90")? {
            let m = module("flash_attention_sm90")?;
            Some(flash(
                &m,
                "flash_attention_sm90",
                Operands::TensorMaps {
                    blocks: multiprocessors(ctx)?,
                },
                &[64, 128],
            )?)
        } else {
            None
        };
        let expert_gate_up = if loads("expert_gate_up")? {
            expert_gate_up::ExpertGateUp::load(ctx, &module("expert_gate_up")?, max_smem)?
        } else {
            None
        };
        let expert_down = if loads("expert_down")? {
            expert_down::ExpertDown::load(ctx, &module("expert_down")?, max_smem)?
        } else {
            None
        };
        let lm_head_lse = if loads("lm_head_lse")? {
            lm_head_lse::LmHeadLse::load(ctx, &module("lm_head_lse")?, max_smem)?
        } else {
            None
        };
        let split_gemm = if loads("split_gemm")? {
            split_gemm::SplitGemm::load(ctx, &module("split_gemm")?, max_smem)?
        } else {
            None
        };
        let attention = in_out(&attn, "attention")?;
        attention::allow_cuda_core_smem(&attention)?;
        let split_rows = module("split_rows_f16")?;
        let split_gated_rows_f16 = func(&split_rows, "split_gated_rows_f16")?;
        let gated_row = (split_gemm::GATED_ROW_MAX * 4).min(max_smem);
        attention::set_smem(&split_gated_rows_f16, gated_row, "split_gated_rows_f16")?;
        Ok(Self {
            dequant_int: pair("dequant_int")?,
            dequant_int4: pair("dequant_int4")?,
            dequant_fp4: pair("dequant_fp4")?,
            dequant_unpacked: pair("dequant_unpacked")?,
            act_quant: in_out(&act, "act_quant")?,
            bias_add: typed(&bias, "bias_add")?,
            rms_norm: in_out(&norm, "rms_norm")?,
            add_rms_norm: in_out(&norm, "add_rms_norm")?,
            rms_norm_planes: typed(&norm, "rms_norm_planes")?,
            add_rms_norm_planes: typed(&norm, "add_rms_norm_planes")?,
            rope: typed(&rope, "rope")?,
            qk_norm_rope: typed(&qk_norm_rope, "qk_norm_rope")?,
            add_assign: typed(&elem, "add_assign")?,
            gated_act: in_out(&elem, "gated_act")?,
            to_bf16: func(&elem, "to_bf16")?,
            gather_rows: in_out(&gather, "gather_rows")?,
            spread_rows: typed(&spread, "spread_rows")?,
            scatter_add: typed(&scatter, "scatter_add")?,
            combine_experts: typed(&combine, "combine_experts")?,
            copy_columns: in_out(&copy, "copy_columns")?,
            route_topk: [
                func(&route, "route_topk_128")?,
                func(&route, "route_topk_256")?,
                func(&route, "route_topk_512")?,
            ],
            route_fill: func(&route, "route_fill")?,
            attention,
            flash_attention,
            flash_attention_sm90,
            flash_attention_split,
            expert_gate_up,
            expert_down,
            lm_head_lse,
            lse_tile: func(&nll, "lse_tile")?,
            nll_finish: func(&nll, "nll_finish")?,
            nll_from_slices: func(&nll, "nll_from_slices")?,
            kld_tile: func(&nll, "kld_tile")?,
            softcap: func(&softcap, "softcap")?,
            split_bf16: func(&split, "split_bf16")?,
            split_rows_f16: func(&split_rows, "split_rows_f16")?,
            split_gated_rows_f16,
            column_top: func(&columns, "column_top")?,
            split_columns_f16: func(&columns, "split_columns_f16")?,
            weight_f16: func(&module("weight_f16")?, "weight_f16")?,
            split_gemm,
        })
    }
}

/// One thread per element.
fn elementwise(n: usize) -> Result<LaunchConfig> {
    let blocks = n.div_ceil(THREADS as usize);
    if blocks > i32::MAX as usize {
        return Err(Error::backend(
            "cuda",
            format!("{n} elements is too many for one launch"),
        ));
    }
    Ok(LaunchConfig {
        grid_dim: (blocks.max(1) as u32, 1, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    })
}

/// One block per row.
fn per_row(rows: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (rows.max(1) as u32, 1, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// Launches a built argument list, naming the kernel in the error.
fn launch(mut args: LaunchArgs, cfg: LaunchConfig, name: &str) -> Result<()> {
    // SAFETY: every wrapper pushes exactly the arguments of its kernel's C signature, and the
    // addresses come from live buffers of the right size (checked by the backend).
    unsafe { args.launch(cfg) }
        .map(|_| ())
        .map_err(|e| Error::backend("cuda", format!("launching {name}: {e:?}")))
}

/// `i32` kernel argument from a size, refusing what does not fit.
fn i32_arg(v: usize, what: &str) -> Result<i32> {
    i32::try_from(v).map_err(|_| Error::backend("cuda", format!("{what} = {v} exceeds i32")))
}

pub type Stream = Arc<CudaStream>;

/// A `CUtensorMap`, passed by value as a kernel's `__grid_constant__ TensorMap`
/// (hopper.cuh).
#[repr(C, align(64))]
pub struct TensorMap(sys::CUtensorMap);

// SAFETY: a plain 128-byte value, the layout of the kernels' TensorMap parameter.
unsafe impl DeviceRepr for TensorMap {}

/// The tensor map of a row-major bf16 matrix of `rows` x `width` at `ptr`, read in boxes of
/// `boxes` (columns, rows) with 128-byte swizzling; rows past the end arrive as zeros.
fn tensor_map(
    ptr: u64,
    width: usize,
    rows: usize,
    boxes: [u32; 2],
    what: &str,
) -> Result<TensorMap> {
    tensor_map_ld(ptr, [width, width], rows, boxes, what)
}

/// `tensor_map` of rows `ld` values apart (a multiple of 8: TMA wants 16-byte rows), of which
/// the first `width` are read; columns past `width` arrive as zeros too.
fn tensor_map_ld(
    ptr: u64,
    [width, ld]: [usize; 2],
    rows: usize,
    boxes: [u32; 2],
    what: &str,
) -> Result<TensorMap> {
    let dims = [width as u64, rows as u64];
    let row_bytes = [ld as u64 * 2];
    let steps = [1u32, 1];
    let mut map = MaybeUninit::<sys::CUtensorMap>::zeroed();
    // SAFETY: every array has the length the rank (2) asks for, and `map` is written before
    // it is read; the driver only records the address, which the caller keeps alive.
    let r = unsafe {
        sys::cuTensorMapEncodeTiled(
            map.as_mut_ptr(),
            CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
            2,
            ptr as *mut std::ffi::c_void,
            dims.as_ptr(),
            row_bytes.as_ptr(),
            boxes.as_ptr(),
            steps.as_ptr(),
            CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
            CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B,
            CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
        )
    };
    r.result().map_err(|e| {
        Error::backend(
            "cuda",
            format!("TMA tensor map of {what} ({rows} x {width} bf16 at {ptr:#x}): {e:?}"),
        )
    })?;
    // SAFETY: written by the successful call above.
    Ok(TensorMap(unsafe { map.assume_init() }))
}
