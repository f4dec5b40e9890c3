//! `causal_conv.cu`: the recurrent layers' depthwise causal convolution (with its bias and
//! SiLU where the layer has them), a thread a channel and `TOKENS_A_THREAD` tokens.

use cudarc::driver::{LaunchConfig, PushKernelArg};

use super::{
    InOut, Kernels, Loader, Module, Source, Stream, THREADS, cuda_source, i32_arg, launch,
};
use crate::backend::cuda::CudaTensor;
use crate::{Error, Result};

/// Consecutive tokens a thread convolves (CONV_TOKENS).
const TOKENS_A_THREAD: usize = 16;

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
    let (channels, taps) = (i32_arg(x.cols, "channels")?, i32_arg(weight.cols, "taps")?);
    let (yp, xp, wp, tokens) = (y.ptr(), x.ptr(), weight.ptr(), x.rows as i64);
    let (bp, silu) = (bias.map_or(0, CudaTensor::ptr), i32::from(silu));
    let entries = k.get::<Entries>()?;
    let mut b = s.launch_builder(entries.0.get(x.dtype, y.dtype));
    b.arg(&yp)
        .arg(&xp)
        .arg(&wp)
        .arg(&bp)
        .arg(&seq_start)
        .arg(&tokens)
        .arg(&channels)
        .arg(&taps)
        .arg(&silu);
    // Token runs along x (up to 2^31 - 1 blocks), channel blocks along y.
    let token_blocks = x.rows.div_ceil(TOKENS_A_THREAD);
    if token_blocks > i32::MAX as usize {
        return Err(Error::backend(
            "cuda",
            format!("causal_conv: {} tokens is too many for one launch", x.rows),
        ));
    }
    let cfg = LaunchConfig {
        grid_dim: (
            token_blocks.max(1) as u32,
            x.cols.div_ceil(THREADS as usize).max(1) as u32,
            1,
        ),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    launch(b, cfg, "causal_conv")
}
