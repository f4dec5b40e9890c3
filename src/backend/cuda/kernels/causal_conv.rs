//! `causal_conv.cu`: the recurrent layers' depthwise causal convolution (with its bias and
//! SiLU where the layer has them), a thread a value.

use cudarc::driver::PushKernelArg;

use super::{
    InOut, Kernels, Loader, Module, Source, Stream, cuda_source, elementwise, i32_arg, launch,
};
use crate::Result;
use crate::backend::Shaped;
use crate::backend::cuda::CudaTensor;

/// `causal_conv.cu`'s entry points by (input, output) type.
struct Entries(InOut);

impl Module for Entries {
    const SOURCE: Source<'static> = cuda_source!("causal_conv");

    fn load(l: &Loader) -> Result<Option<Self>> {
        Ok(Some(Self(l.in_out("causal_conv")?)))
    }
}

/// `y = act(conv(x) + bias)` over `x` `[tokens, channels]` with the f32 `weight` `[channels,
/// taps]` and `bias` `[1, channels]`, each token's taps stopping at its sequence's first token
/// (`seq_start`, u32 per token); `act` SiLU where `silu`, else none.
#[allow(clippy::too_many_arguments)]
pub fn run(
    k: &Kernels,
    s: &Stream,
    y: &CudaTensor,
    x: &CudaTensor,
    weight: &CudaTensor,
    bias: Option<&CudaTensor>,
    silu: bool,
    seq_start: u64,
) -> Result<()> {
    let n = x.len();
    let (channels, taps) = (i32_arg(x.cols, "channels")?, i32_arg(weight.cols, "taps")?);
    let (yp, xp, wp, n64) = (y.ptr(), x.ptr(), weight.ptr(), n as i64);
    let (bp, silu) = (bias.map_or(0, CudaTensor::ptr), i32::from(silu));
    let entries = k.get::<Entries>()?;
    let mut b = s.launch_builder(entries.0.get(x.dtype, y.dtype));
    b.arg(&yp)
        .arg(&xp)
        .arg(&wp)
        .arg(&bp)
        .arg(&seq_start)
        .arg(&n64)
        .arg(&channels)
        .arg(&taps)
        .arg(&silu);
    launch(b, elementwise(n)?, "causal_conv")
}
