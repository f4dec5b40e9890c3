//! `act_quant.cu`: a linear's declared input-activation fake quantization, rounding in the
//! output (activation) type.

use cudarc::driver::PushKernelArg;

use super::{Dt, Kernels, Stream, i32_arg, launch, per_row};
use crate::Result;
use crate::numerics::ActQuant;

/// Writes the fake-quantized copy of `x` `[rows, cols]` into `out`; `types` is (x, out).
#[allow(clippy::too_many_arguments)]
pub fn run(
    k: &Kernels,
    s: &Stream,
    types: (Dt, Dt),
    out: u64,
    x: u64,
    rows: usize,
    cols: usize,
    aq: ActQuant,
) -> Result<()> {
    let (mode, param): (i32, f32) = match aq {
        ActQuant::Fp8PerToken => (0, 0.0),
        ActQuant::Fp8Static { scale } => (1, scale),
        ActQuant::Int8PerToken => (2, 0.0),
        ActQuant::Nvfp4 { global_scale } => (3, global_scale),
    };
    let cols = i32_arg(cols, "in_features")?;
    let mut b = s.launch_builder(k.act_quant.get(types.0, types.1));
    b.arg(&out).arg(&x).arg(&cols).arg(&mode).arg(&param);
    launch(b, per_row(rows), "act_quant")
}
