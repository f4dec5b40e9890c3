//! `split_bf16.cu`: an f32 matrix as bf16 high parts and residuals, for `--dtype split-bf16`.

use cudarc::driver::PushKernelArg;

use super::{Kernels, Stream, elementwise, i32_arg, launch};
use crate::Result;

/// Which operand a split is for. Of `x · wᵀ`: two column blocks per row, `[hi | lo]` for the
/// activations and `[lo | hi]` for the weights, so a GEMM over them sums hi·lo + lo·hi (and
/// one over their first and second halves hi·hi). Of attention, or of products with a weight
/// whose values are bf16: two planes, all rows' high parts, then their residuals.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Operand {
    Activations,
    Weights,
    Planes,
}

impl Operand {
    /// The kernel's (residual first, parts as planes).
    fn layout(self) -> (i32, i32) {
        match self {
            Operand::Activations => (0, 0),
            Operand::Weights => (1, 0),
            Operand::Planes => (0, 1),
        }
    }
}

/// Writes the `[rows, cols]` f32 matrix at `input` to `out` as `2 * rows * cols` bf16.
pub fn run(
    k: &Kernels,
    s: &Stream,
    out: u64,
    input: u64,
    [rows, cols]: [usize; 2],
    operand: Operand,
) -> Result<()> {
    let (r, c) = (i32_arg(rows, "rows")?, i32_arg(cols, "cols")?);
    let (lo_first, planes) = operand.layout();
    let mut b = s.launch_builder(&k.split_bf16);
    b.arg(&out)
        .arg(&input)
        .arg(&r)
        .arg(&c)
        .arg(&lo_first)
        .arg(&planes);
    launch(b, elementwise(rows * cols)?, "split_bf16")
}
