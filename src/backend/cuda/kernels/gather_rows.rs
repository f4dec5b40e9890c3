//! `gather_rows.cu`: bf16 rows picked by index (embedding lookup, scored hidden rows).

use cudarc::driver::PushKernelArg;

use super::{Kernels, Stream, elementwise, i32_arg, launch};
use crate::Result;

/// Gathers rows into bf16 (`f32_out == false`) or widened to f32.
#[allow(clippy::too_many_arguments)]
pub fn run(
    k: &Kernels,
    s: &Stream,
    out: u64,
    table: u64,
    ids: u64,
    n_ids: usize,
    cols: usize,
    f32_out: bool,
) -> Result<()> {
    let (n, c) = (i32_arg(n_ids, "rows")?, i32_arg(cols, "cols")?);
    let f = if f32_out {
        &k.gather_rows_f32
    } else {
        &k.gather_rows
    };
    let mut b = s.launch_builder(f);
    b.arg(&out).arg(&table).arg(&ids).arg(&n).arg(&c);
    launch(b, elementwise(n_ids * cols)?, "gather_rows")
}
