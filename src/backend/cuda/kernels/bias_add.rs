//! `bias_add.cu`: f32 GEMM output plus bias, rounded once to the activation type.

use cudarc::driver::PushKernelArg;

use super::{
    Kernels, Loader, Module, Source, Stream, Typed, cuda_source, elementwise, i32_arg, launch,
};
use crate::Result;
use crate::backend::Shaped;
use crate::backend::cuda::CudaTensor;

/// `bias_add.cu`'s entry points.
struct Entries(Typed);

impl Module for Entries {
    const SOURCE: Source<'static> = cuda_source!("bias_add");

    fn load(l: &Loader) -> Result<Option<Self>> {
        Ok(Some(Self(l.typed("bias_add")?)))
    }
}

/// `out` (of type `dt`; may be `y` itself when f32) = `y` + `bias` per row.
/// `out = y + bias` row by row, rounded once to `out`'s type; `y` holds `out.shape()` f32
/// values, `bias` one f32 per column.
pub fn run(k: &Kernels, s: &Stream, out: &CudaTensor, y: u64, bias: u64) -> Result<()> {
    let [rows, cols] = out.shape();
    let (r, c) = (i32_arg(rows, "rows")?, i32_arg(cols, "cols")?);
    let op = out.ptr();
    let entries = k.get::<Entries>()?;
    let mut b = s.launch_builder(entries.0.get(out.dtype));
    b.arg(&op).arg(&y).arg(&bias).arg(&r).arg(&c);
    launch(b, elementwise(rows * cols)?, "bias_add")
}
