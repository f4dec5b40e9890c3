//! `bias_add.cu`: f32 GEMM output plus bias, rounded once to bf16.

use cudarc::driver::PushKernelArg;

use super::{Kernels, Stream, elementwise, i32_arg, launch};
use crate::Result;

pub fn run(
    k: &Kernels,
    s: &Stream,
    out: u64,
    y: u64,
    bias: u64,
    rows: usize,
    cols: usize,
) -> Result<()> {
    let (r, c) = (i32_arg(rows, "rows")?, i32_arg(cols, "cols")?);
    let mut b = s.launch_builder(&k.bias_add);
    b.arg(&out).arg(&y).arg(&bias).arg(&r).arg(&c);
    launch(b, elementwise(rows * cols)?, "bias_add")
}
