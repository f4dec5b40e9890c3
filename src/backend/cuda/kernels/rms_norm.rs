//! `rms_norm.cu`: one block per row.

use cudarc::driver::PushKernelArg;

use super::{Dt, Kernels, Stream, i32_arg, launch, per_row};
use crate::{Error, Result};

/// Normalizes `rows` rows of `x` (type `in_dt`) into `out` (type `out_dt`): bf16 -> bf16,
/// f32 -> f32, or the f32 residual stream into bf16.
#[allow(clippy::too_many_arguments)]
pub fn run(
    k: &Kernels,
    s: &Stream,
    (in_dt, out_dt): (Dt, Dt),
    out: u64,
    x: u64,
    weight: u64,
    rows: usize,
    cols: usize,
    eps: f32,
) -> Result<()> {
    let c = i32_arg(cols, "cols")?;
    let f = match (in_dt, out_dt) {
        (a, b) if a == b => k.rms_norm.get(a),
        (Dt::F32, Dt::Bf16) => &k.rms_norm_f32_bf16,
        _ => {
            return Err(Error::backend(
                "cuda",
                "rms_norm: a bf16 input is not widened to f32",
            ));
        }
    };
    let mut b = s.launch_builder(f);
    b.arg(&out).arg(&x).arg(&weight).arg(&c).arg(&eps);
    launch(b, per_row(rows), "rms_norm")
}
