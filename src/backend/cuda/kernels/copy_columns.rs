//! `copy_columns.cu`: column blocks of one tensor into another.

use cudarc::driver::PushKernelArg;

use super::{
    InOut, Kernels, Loader, Module, Source, Stream, cuda_source, elementwise, i32_arg, launch,
};
use crate::Result;
use crate::backend::cuda::CudaTensor;
use crate::backend::{ColumnBlocks, Shaped};

/// `copy_columns.cu`'s entry points.
struct Entries(InOut);

impl Module for Entries {
    const SOURCE: Source<'static> = cuda_source!("copy_columns");

    fn load(l: &Loader) -> Result<Option<Self>> {
        Ok(Some(Self(l.in_out("copy_columns")?)))
    }
}

/// The blocks `at` names of every row of `src` into `out` (same rows; checked by the caller).
pub fn run(
    k: &Kernels,
    s: &Stream,
    out: &CudaTensor,
    src: &CudaTensor,
    at: ColumnBlocks,
) -> Result<()> {
    let [rows, out_cols] = out.shape();
    let args = [
        i32_arg(rows, "rows")?,
        i32_arg(src.cols, "source cols")?,
        i32_arg(out_cols, "cols")?,
        i32_arg(at.blocks, "blocks")?,
        i32_arg(at.width, "block width")?,
        i32_arg(at.from, "source column")?,
        i32_arg(at.from_stride, "source stride")?,
        i32_arg(at.to, "column")?,
        i32_arg(at.to_stride, "stride")?,
    ];
    let (op, sp) = (out.ptr(), src.ptr());
    let entries = k.get::<Entries>()?;
    let mut b = s.launch_builder(entries.0.get(src.dtype, out.dtype));
    b.arg(&op).arg(&sp);
    for a in &args {
        b.arg(a);
    }
    launch(b, elementwise(rows * at.blocks * at.width)?, "copy_columns")
}
