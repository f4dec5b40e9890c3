//! `rope.cu`: rotate-half RoPE in place.

use cudarc::driver::PushKernelArg;

use super::{Dt, Kernels, Stream, elementwise, i32_arg, launch};
use crate::Result;

#[allow(clippy::too_many_arguments)]
pub fn run(
    k: &Kernels,
    s: &Stream,
    dt: Dt,
    x: u64,
    positions: u64,
    cos: u64,
    sin: u64,
    tokens: usize,
    heads: usize,
    head_dim: usize,
) -> Result<()> {
    let (t, h, d) = (
        i32_arg(tokens, "tokens")?,
        i32_arg(heads, "heads")?,
        i32_arg(head_dim, "head_dim")?,
    );
    let mut b = s.launch_builder(k.rope.get(dt));
    b.arg(&x)
        .arg(&positions)
        .arg(&cos)
        .arg(&sin)
        .arg(&t)
        .arg(&h)
        .arg(&d);
    // One thread per 8 pairs where head_dim / 2 is a multiple of 8 (rope.cu), else per pair.
    let half = head_dim / 2;
    let per = if half.is_multiple_of(8) { 8 } else { 1 };
    launch(b, elementwise(tokens * heads * (half / per))?, "rope")
}
