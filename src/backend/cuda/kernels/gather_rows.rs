//! `gather_rows.cu`: rows picked by index (embedding lookup, scored hidden rows).

use cudarc::driver::PushKernelArg;

use super::{Dt, Kernels, Stream, elementwise, i32_arg, launch};
use crate::{Error, Result};

/// Gathers rows of a `table_dt` table into `out_dt` rows: bf16 -> bf16, f32 -> f32, or a bf16
/// table widened to f32.
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
    let f = match (table_dt, out_dt) {
        (a, b) if a == b => k.gather_rows.get(a),
        (Dt::Bf16, Dt::F32) => &k.gather_rows_bf16_f32,
        _ => {
            return Err(Error::backend(
                "cuda",
                "gather_rows: an f32 table is not narrowed to bf16",
            ));
        }
    };
    let mut b = s.launch_builder(f);
    b.arg(&out).arg(&table).arg(&ids).arg(&n).arg(&c);
    launch(b, elementwise(n_ids * cols)?, "gather_rows")
}
