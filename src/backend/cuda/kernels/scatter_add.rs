//! `scatter_add.cu`: an expert's output rows, weighted, added into the mixture's f32
//! accumulator.

use cudarc::driver::PushKernelArg;

use super::{
    Kernels, Loader, Module, Source, Stream, Typed, cuda_source, elementwise, i32_arg, launch,
};
use crate::Result;
use crate::backend::Shaped;
use crate::backend::cuda::CudaTensor;

/// `scatter_add.cu`'s entry points.
struct Entries(Typed);

impl Module for Entries {
    const SOURCE: Source<'static> = cuda_source!("scatter_add");

    fn load(l: &Loader) -> Result<Option<Self>> {
        Ok(Some(Self(l.typed("scatter_add")?)))
    }
}

/// `acc[rows[i]] += weights[i] * y[i]` for every row `i` of `y`; `rows` and `weights` are
/// device addresses of `y.rows()` u32 / f32 values (checked against `acc` by the backend).
pub fn run(
    k: &Kernels,
    s: &Stream,
    acc: &CudaTensor,
    y: &CudaTensor,
    rows: u64,
    weights: u64,
) -> Result<()> {
    let [n_rows, cols] = y.shape();
    let (n, c) = (i32_arg(n_rows, "rows")?, i32_arg(cols, "cols")?);
    let (ap, yp) = (acc.ptr(), y.ptr());
    let entries = k.get::<Entries>()?;
    let mut b = s.launch_builder(entries.0.get(y.dtype));
    b.arg(&ap).arg(&yp).arg(&rows).arg(&weights).arg(&n).arg(&c);
    // 8 values a thread where rows are whole 16-byte chunks (scatter_add.cu).
    let per = if cols.is_multiple_of(8) { 8 } else { 1 };
    launch(b, elementwise(n_rows * cols / per)?, "scatter_add")
}
