//! `rms_norm.cu`: one block per row.

use cudarc::driver::PushKernelArg;

use super::{Kernels, Stream, i32_arg, launch, per_row};
use crate::Result;

#[allow(clippy::too_many_arguments)]
pub fn run(
    k: &Kernels,
    s: &Stream,
    out: u64,
    x: u64,
    weight: u64,
    rows: usize,
    cols: usize,
    eps: f32,
    f32_input: bool,
) -> Result<()> {
    let c = i32_arg(cols, "cols")?;
    let f = if f32_input {
        &k.rms_norm_f32in
    } else {
        &k.rms_norm
    };
    let mut b = s.launch_builder(f);
    b.arg(&out).arg(&x).arg(&weight).arg(&c).arg(&eps);
    launch(b, per_row(rows), "rms_norm")
}
