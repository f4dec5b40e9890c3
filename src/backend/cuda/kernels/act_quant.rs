//! `act_quant.cu`: a linear's declared input-activation fake quantization, rounding in the
//! output (activation) type.

use cudarc::driver::PushKernelArg;

use super::{Kernels, Stream, i32_arg, launch, per_row};
use crate::Result;
use crate::backend::Shaped;
use crate::backend::cuda::CudaTensor;
use crate::numerics::ActQuant;

/// Writes the fake-quantized copy of `x` into `out` (same shape, `out`'s type).
pub fn run(k: &Kernels, s: &Stream, out: &CudaTensor, x: &CudaTensor, aq: ActQuant) -> Result<()> {
    let [rows, cols] = x.shape();
    let (mode, param) = aq.kernel_code();
    let mode = mode as i32;
    let cols = i32_arg(cols, "in_features")?;
    let (op, xp) = (out.ptr(), x.ptr());
    let mut b = s.launch_builder(k.act_quant.get(x.dtype, out.dtype));
    b.arg(&op).arg(&xp).arg(&cols).arg(&mode).arg(&param);
    launch(b, per_row(rows), "act_quant")
}
