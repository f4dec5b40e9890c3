//! `rope.cu`: rotate-half RoPE in place, one thread per rotated pair.

use cudarc::driver::PushKernelArg;

use super::{Kernels, Stream, elementwise, i32_arg, launch};
use crate::Result;

#[allow(clippy::too_many_arguments)]
pub fn run(
    k: &Kernels,
    s: &Stream,
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
    let mut b = s.launch_builder(&k.rope);
    b.arg(&x)
        .arg(&positions)
        .arg(&cos)
        .arg(&sin)
        .arg(&t)
        .arg(&h)
        .arg(&d);
    launch(b, elementwise(tokens * heads * (head_dim / 2))?, "rope")
}
