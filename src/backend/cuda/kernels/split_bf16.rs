//! `split_bf16.cu`: an f32 matrix as bf16 high parts and residuals, for f32 operands on bf16
//! tensor cores (`--dtype f32-grade`, and the bf16 path's router).

use cudarc::driver::{CudaFunction, PushKernelArg};

use super::{Kernels, Loader, Module, Source, Stream, cuda_source, elementwise, i32_arg, launch};
use crate::Result;

/// `split_bf16.cu`'s entry points.
struct Entries(CudaFunction);

impl Module for Entries {
    const SOURCE: Source<'static> = cuda_source!("split_bf16");

    fn load(l: &Loader) -> Result<Option<Self>> {
        Ok(Some(Self(l.func("split_bf16")?)))
    }
}

/// Which operand a split is for. Of `x · wᵀ`: two column blocks per row, `[hi | lo]` for the
/// activations and `[lo | hi]` for the weights, so a GEMM over them sums hi·lo + lo·hi (and
/// one over their first and second halves hi·hi). Of products with a weight
/// whose values are bf16: two planes, all rows' high parts, then their residuals. `Exact`:
/// three planes whose sum is the input exactly, the high parts apart from the two residual
/// planes (at `residuals`), which follow each other.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Operand {
    Activations,
    Weights,
    Planes,
    Exact { residuals: u64 },
}

/// Writes the `[rows, cols]` f32 matrix at `input` to `out` as `2 * rows * cols` bf16 (for
/// `Exact`, `rows * cols` at `out` and `2 * rows * cols` at its `residuals`).
pub fn run(
    k: &Kernels,
    s: &Stream,
    out: u64,
    input: u64,
    [rows, cols]: [usize; 2],
    operand: Operand,
) -> Result<()> {
    let (r, c) = (i32_arg(rows, "rows")?, i32_arg(cols, "cols")?);
    let plane = (rows * cols * 2) as u64;
    // (residual first, parts as planes, where the residuals go, how many parts)
    let (lo_first, planes, rest, parts) = match operand {
        Operand::Activations => (0i32, 0i32, out, 2i32),
        Operand::Weights => (1, 0, out, 2),
        Operand::Planes => (0, 1, out + plane, 2),
        Operand::Exact { residuals } => (0, 1, residuals, 3),
    };
    let entries = k.get::<Entries>()?;
    let mut b = s.launch_builder(&entries.0);
    b.arg(&out)
        .arg(&rest)
        .arg(&input)
        .arg(&r)
        .arg(&c)
        .arg(&lo_first)
        .arg(&planes)
        .arg(&parts);
    launch(b, elementwise(rows * cols)?, "split_bf16")
}
