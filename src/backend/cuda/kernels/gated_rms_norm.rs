//! `gated_rms_norm.cu`: gated DeltaNet's RMSNormGated, a warp per head.

use cudarc::driver::{LaunchConfig, PushKernelArg};

use super::{InOut, Kernels, Loader, Module, Source, Stream, cuda_source, i32_arg, launch};
use crate::Result;
use crate::backend::Shaped;
use crate::backend::cuda::CudaTensor;

/// `gated_rms_norm.cu`'s entry points by (input, output) type.
struct Entries(InOut);

impl Module for Entries {
    const SOURCE: Source<'static> = cuda_source!("gated_rms_norm");

    fn load(l: &Loader) -> Result<Option<Self>> {
        Ok(Some(Self(l.in_out("gated_rms_norm")?)))
    }
}

/// Heads a block (a warp each; the kernel's 8).
const HEADS_A_BLOCK: usize = 8;

/// `y = rms_norm(x) * weight * silu(gate)` over each `weight.cols`-wide head of `x`.
pub fn run(
    k: &Kernels,
    s: &Stream,
    y: &CudaTensor,
    (x, gate): (&CudaTensor, &CudaTensor),
    weight: &CudaTensor,
    eps: f32,
) -> Result<()> {
    let d = weight.cols;
    let heads = x.len() / d.max(1);
    let (dp, h64) = (i32_arg(d, "head width")?, heads as i64);
    let (yp, xp, gp, wp) = (y.ptr(), x.ptr(), gate.ptr(), weight.ptr());
    let entries = k.get::<Entries>()?;
    let mut b = s.launch_builder(entries.0.get(x.dtype, y.dtype));
    b.arg(&yp)
        .arg(&xp)
        .arg(&gp)
        .arg(&wp)
        .arg(&h64)
        .arg(&dp)
        .arg(&eps);
    let cfg = LaunchConfig {
        grid_dim: (heads.div_ceil(HEADS_A_BLOCK).max(1) as u32, 1, 1),
        block_dim: (32 * HEADS_A_BLOCK as u32, 1, 1),
        shared_mem_bytes: 0,
    };
    launch(b, cfg, "gated_rms_norm")
}
