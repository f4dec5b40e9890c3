//! `gather_rows.cu`: rows picked by index (embedding lookup, scored hidden rows).

use cudarc::driver::PushKernelArg;

use super::{
    Dt, InOut, Kernels, Loader, Module, Source, Stream, cuda_source, elementwise, i32_arg, launch,
};
use crate::Result;
use crate::backend::Shaped;
use crate::backend::cuda::CudaTensor;

/// `gather_rows.cu`'s entry points.
struct Entries(InOut);

impl Module for Entries {
    const SOURCE: Source<'static> = cuda_source!("gather_rows");

    fn load(l: &Loader) -> Result<Option<Self>> {
        Ok(Some(Self(l.in_out("gather_rows")?)))
    }
}

/// Row `ids[i]` of `table` (rows of `out.cols` values of `table_dt`) times `scale`, and times
/// `row_scales[i]` (f32) where that address is not 0, into row `i` of `out`.
pub fn run(
    k: &Kernels,
    s: &Stream,
    out: &CudaTensor,
    (table, table_dt): (u64, Dt),
    ids: u64,
    (scale, row_scales): (f32, u64),
) -> Result<()> {
    let [n_ids, cols] = out.shape();
    let (n, c) = (i32_arg(n_ids, "rows")?, i32_arg(cols, "cols")?);
    let op = out.ptr();
    let entries = k.get::<Entries>()?;
    let mut b = s.launch_builder(entries.0.get(table_dt, out.dtype));
    b.arg(&op)
        .arg(&table)
        .arg(&ids)
        .arg(&n)
        .arg(&c)
        .arg(&scale)
        .arg(&row_scales);
    // 8 values a thread where rows are whole 16-byte chunks (gather_rows.cu).
    let per = if cols.is_multiple_of(8) { 8 } else { 1 };
    launch(b, elementwise(n_ids * cols / per)?, "gather_rows")
}
