//! `bias_add.cu`: f32 GEMM output plus bias, rounded once to the activation type.

use cudarc::driver::PushKernelArg;

use super::{Kernels, Stream, elementwise, i32_arg, launch};
use crate::Result;
use crate::backend::Shaped;
use crate::backend::cuda::CudaTensor;

/// `out` (of type `dt`; may be `y` itself when f32) = `y` + `bias` per row.
/// `out = y + bias` row by row, rounded once to `out`'s type; `y` holds `out.shape()` f32
/// values, `bias` one f32 per column.
pub fn run(k: &Kernels, s: &Stream, out: &CudaTensor, y: u64, bias: u64) -> Result<()> {
    let [rows, cols] = out.shape();
    let (r, c) = (i32_arg(rows, "rows")?, i32_arg(cols, "cols")?);
    let op = out.ptr();
    let mut b = s.launch_builder(k.bias_add.get(out.dtype));
    b.arg(&op).arg(&y).arg(&bias).arg(&r).arg(&c);
    launch(b, elementwise(rows * cols)?, "bias_add")
}
