//! `rope.cu`: rotate-half RoPE in place.

use cudarc::driver::PushKernelArg;

use super::{Kernels, Stream, elementwise, i32_arg, launch};
use crate::Result;
use crate::backend::cuda::CudaTensor;

/// Rotates the first `rotary_dim` values of each head of `x` `[tokens, heads * head_dim]` in
/// place by the u32 `positions` of its tokens.
pub fn run(
    k: &Kernels,
    s: &Stream,
    x: &CudaTensor,
    positions: u64,
    (cos, sin): (&CudaTensor, &CudaTensor),
    (head_dim, rotary_dim): (usize, usize),
) -> Result<()> {
    let (tokens, heads) = (x.rows, x.cols / head_dim.max(1));
    let (t, h, d, r) = (
        i32_arg(tokens, "tokens")?,
        i32_arg(heads, "heads")?,
        i32_arg(head_dim, "head_dim")?,
        i32_arg(rotary_dim, "rotary_dim")?,
    );
    let (xp, cp, sp) = (x.ptr(), cos.ptr(), sin.ptr());
    let mut b = s.launch_builder(k.rope.get(x.dtype));
    b.arg(&xp)
        .arg(&positions)
        .arg(&cp)
        .arg(&sp)
        .arg(&t)
        .arg(&h)
        .arg(&d)
        .arg(&r);
    // One thread per 8 pairs where rotary_dim / 2 is a multiple of 8 (rope.cu), else per pair.
    let half = rotary_dim / 2;
    let per = if half.is_multiple_of(8) { 8 } else { 1 };
    launch(b, elementwise(tokens * heads * (half / per))?, "rope")
}
