//! `split_bf16.cu`: an f32 matrix as bf16 high parts and residuals, for `--dtype split-bf16`.

use cudarc::driver::PushKernelArg;

use super::{Kernels, Stream, elementwise, i32_arg, launch};
use crate::Result;

/// Which operand a split is for. Of `x · wᵀ`: three column blocks per row, `[hi | hi | lo]`
/// for the activations and `[hi | lo | hi]` for the weights, so the GEMM over them sums
/// hi·hi + hi·lo + lo·hi. Of attention: two planes, all rows' high parts, then their residuals.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Operand {
    Activations = 0,
    Weights = 1,
    Planes = 2,
}

/// Writes the `[rows, cols]` f32 matrix at `input` to `out` as `3 * rows * cols` bf16
/// (`2 * rows * cols` as planes).
pub fn run(
    k: &Kernels,
    s: &Stream,
    out: u64,
    input: u64,
    [rows, cols]: [usize; 2],
    operand: Operand,
) -> Result<()> {
    let (r, c) = (i32_arg(rows, "rows")?, i32_arg(cols, "cols")?);
    let layout = operand as i32;
    let mut b = s.launch_builder(&k.split_bf16);
    b.arg(&out).arg(&input).arg(&r).arg(&c).arg(&layout);
    launch(b, elementwise(rows * cols)?, "split_bf16")
}
