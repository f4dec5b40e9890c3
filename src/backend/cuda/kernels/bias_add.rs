//! `bias_add.cu`: f32 GEMM output plus bias, rounded once to the activation type.

use cudarc::driver::PushKernelArg;

use super::{Dt, Kernels, Stream, elementwise, i32_arg, launch};
use crate::Result;

/// `out` (of type `dt`; may be `y` itself when f32) = `y` + `bias` per row.
#[allow(clippy::too_many_arguments)]
pub fn run(
    k: &Kernels,
    s: &Stream,
    dt: Dt,
    out: u64,
    y: u64,
    bias: u64,
    rows: usize,
    cols: usize,
) -> Result<()> {
    let (r, c) = (i32_arg(rows, "rows")?, i32_arg(cols, "cols")?);
    let mut b = s.launch_builder(k.bias_add.get(dt));
    b.arg(&out).arg(&y).arg(&bias).arg(&r).arg(&c);
    launch(b, elementwise(rows * cols)?, "bias_add")
}
