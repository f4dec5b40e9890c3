//! `flash_attention_sm90.cu` (Hopper's wgmma) or `flash_attention.cu` (mma.sync, sm_80 and
//! later), both for bf16 and head_dim 64 or 128, and `attention.cu` (CUDA cores, f32 and any
//! other head_dim): causal GQA attention with an online softmax.

use cudarc::driver::sys::CUfunction_attribute;
use cudarc::driver::{CudaFunction, LaunchConfig, PushKernelArg};

use super::{Dt, FlashAttention, Kernels, Stream, i32_arg, launch};
use crate::backend::AttnShape;
use crate::{Error, Result};

/// Must match WARPS, ROWS, KT and MAXT in attention.cu.
const WARPS: usize = 4;
const ROWS: usize = 4;
const KEY_TILE: usize = 32;
const MAX_HEAD_DIM: usize = 256;
/// Must match FA_WARPS, FA_BM and FA_BN in flash_attention.cu and FH_WARPS, FH_BM and FH_BN
/// in flash_attention_sm90.cu.
const FA_WARPS: usize = 8;
const FA_ROWS: usize = 128;
const FA_KEYS: usize = 64;

fn set_smem(f: &CudaFunction, bytes: usize, name: &str) -> Result<()> {
    f.set_attribute(
        CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
        bytes as i32,
    )
    .map_err(|e| Error::backend("cuda", format!("{name} shared memory {bytes}: {e:?}")))
}

/// The tensor-core kernel `run` uses for bf16 head_dim 64 and 128: the wgmma one where the
/// device has it, unless `portable` asks for the mma.sync one.
pub fn flash_kernel(k: &Kernels, portable: bool) -> Option<&FlashAttention> {
    match (&k.flash_attention_sm90, &k.flash_attention) {
        (Some(sm90), _) if !portable => Some(sm90),
        (_, portable) => portable.as_ref(),
    }
}

/// `types` is (q, k and v, out).
#[allow(clippy::too_many_arguments)]
pub fn run(
    k: &Kernels,
    portable: bool,
    s: &Stream,
    types: (Dt, Dt),
    out: u64,
    (q, kk, v): (u64, u64, u64),
    seq_start: u64,
    tokens: usize,
    shape: AttnShape,
) -> Result<()> {
    let d = shape.head_dim;
    if d > MAX_HEAD_DIM || shape.kv_heads == 0 || !shape.heads.is_multiple_of(shape.kv_heads) {
        return Err(Error::unsupported(
            "attention",
            "shape",
            format!("{shape:?}: head_dim <= {MAX_HEAD_DIM} and heads a multiple of kv_heads"),
        ));
    }
    let (t, h, kvh, dd) = (
        i32_arg(tokens, "tokens")?,
        i32_arg(shape.heads, "heads")?,
        i32_arg(shape.kv_heads, "kv_heads")?,
        i32_arg(d, "head_dim")?,
    );
    let flash = match (flash_kernel(k, portable), types.0, d) {
        (Some(f), Dt::Bf16, 64) => Some((f, f.d64.get(types.1))),
        (Some(f), Dt::Bf16, 128) => Some((f, f.d128.get(types.1))),
        _ => None,
    };
    if let Some((kernel, f)) = flash {
        // Q rows, then two stages of a key tile and a value tile (rows of bf16).
        let smem = (FA_ROWS + 2 * 2 * FA_KEYS) * (d + kernel.row_pad) * 2;
        set_smem(f, smem, kernel.name)?;
        let scale_log2 = (std::f64::consts::LOG2_E / (d as f64).sqrt()) as f32;
        let mut b = s.launch_builder(f);
        b.arg(&out).arg(&q).arg(&kk).arg(&v).arg(&seq_start);
        b.arg(&t).arg(&h).arg(&kvh).arg(&scale_log2);
        let cfg = LaunchConfig {
            grid_dim: (tokens.div_ceil(FA_ROWS) as u32, shape.heads as u32, 1),
            block_dim: ((FA_WARPS * 32) as u32, 1, 1),
            shared_mem_bytes: smem as u32,
        };
        return launch(b, cfg, kernel.name);
    }
    let f = k.attention.get(types.0, types.1);
    let smem = (2 * KEY_TILE * (d + 1) + WARPS * ROWS * d) * 4;
    set_smem(f, smem, "attention")?;
    let scale = (1.0 / (d as f64).sqrt()) as f32;
    let mut b = s.launch_builder(f);
    b.arg(&out).arg(&q).arg(&kk).arg(&v).arg(&seq_start);
    b.arg(&t).arg(&h).arg(&kvh).arg(&dd).arg(&scale);
    let cfg = LaunchConfig {
        grid_dim: (tokens.div_ceil(WARPS * ROWS) as u32, shape.heads as u32, 1),
        block_dim: ((WARPS * 32) as u32, 1, 1),
        shared_mem_bytes: smem as u32,
    };
    launch(b, cfg, "attention")
}
