//! `attention.cu`: causal GQA attention with an online softmax over key tiles.

use cudarc::driver::sys::CUfunction_attribute;
use cudarc::driver::{LaunchConfig, PushKernelArg};

use super::{Kernels, Stream, i32_arg, launch};
use crate::backend::AttnShape;
use crate::{Error, Result};

/// Must match WARPS, ROWS, KT and MAXT in attention.cu.
const WARPS: usize = 4;
const ROWS: usize = 4;
const KEY_TILE: usize = 32;
const MAX_HEAD_DIM: usize = 256;

pub fn run(
    k: &Kernels,
    s: &Stream,
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
    let smem = (2 * KEY_TILE * (d + 1) + WARPS * ROWS * d) * 4;
    k.attention
        .set_attribute(
            CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            smem as i32,
        )
        .map_err(|e| Error::backend("cuda", format!("attention shared memory {smem}: {e:?}")))?;
    let scale = (1.0 / (d as f64).sqrt()) as f32;
    let (t, h, kvh, dd) = (
        i32_arg(tokens, "tokens")?,
        i32_arg(shape.heads, "heads")?,
        i32_arg(shape.kv_heads, "kv_heads")?,
        i32_arg(d, "head_dim")?,
    );
    let mut b = s.launch_builder(&k.attention);
    b.arg(&out).arg(&q).arg(&kk).arg(&v).arg(&seq_start);
    b.arg(&t).arg(&h).arg(&kvh).arg(&dd).arg(&scale);
    let cfg = LaunchConfig {
        grid_dim: (tokens.div_ceil(WARPS * ROWS) as u32, shape.heads as u32, 1),
        block_dim: ((WARPS * 32) as u32, 1, 1),
        shared_mem_bytes: smem as u32,
    };
    launch(b, cfg, "attention")
}
