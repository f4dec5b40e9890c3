//! `gather_rows.cu`: rows picked by index (embedding lookup, scored hidden rows).

use cudarc::driver::PushKernelArg;

use super::{Dt, Kernels, Stream, elementwise, i32_arg, launch};
use crate::Result;

/// Gathers rows of a `table_dt` table into `out_dt` rows.
#[allow(clippy::too_many_arguments)]
pub fn run(
    k: &Kernels,
    s: &Stream,
    (table_dt, out_dt): (Dt, Dt),
    out: u64,
    table: u64,
    ids: u64,
    n_ids: usize,
    cols: usize,
) -> Result<()> {
    let (n, c) = (i32_arg(n_ids, "rows")?, i32_arg(cols, "cols")?);
    let mut b = s.launch_builder(k.gather_rows.get(table_dt, out_dt));
    b.arg(&out).arg(&table).arg(&ids).arg(&n).arg(&c);
    launch(b, elementwise(n_ids * cols)?, "gather_rows")
}
