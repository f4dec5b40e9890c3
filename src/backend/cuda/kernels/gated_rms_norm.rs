//! `gated_rms_norm.cu`: the recurrent layers' gated RMSNorm (gated DeltaNet's, Mamba-2's,
//! Kimi Delta Attention's), a warp per group.

use cudarc::driver::{LaunchConfig, PushKernelArg};

use super::{InOut, Kernels, Loader, Module, Source, Stream, cuda_source, i32_arg, launch};
use crate::Result;
use crate::backend::cuda::CudaTensor;
use crate::backend::{NormGate, Shaped};

/// `gated_rms_norm.cu`'s entry points by (input, output) type.
struct Entries(InOut);

impl Module for Entries {
    const SOURCE: Source<'static> = cuda_source!("gated_rms_norm");

    fn load(l: &Loader) -> Result<Option<Self>> {
        Ok(Some(Self(l.in_out("gated_rms_norm")?)))
    }
}

/// Groups a block (a warp each; the kernel's 8).
const GROUPS_A_BLOCK: usize = 8;

/// `y = rms_norm(x) * weight` over each `group`-wide group of `x`, gated as `how` says;
/// `weight` repeats along the row.
#[allow(clippy::too_many_arguments)]
pub fn run(
    k: &Kernels,
    s: &Stream,
    y: &CudaTensor,
    (x, gate): (&CudaTensor, &CudaTensor),
    weight: &CudaTensor,
    group: usize,
    how: NormGate,
    eps: f32,
) -> Result<()> {
    let groups = x.len() / group.max(1);
    let (dp, g64) = (i32_arg(group, "group width")?, groups as i64);
    let (wlen, mode) = (i32_arg(weight.len(), "weight")?, how as i32);
    let (yp, xp, gp, wp) = (y.ptr(), x.ptr(), gate.ptr(), weight.ptr());
    let entries = k.get::<Entries>()?;
    let mut b = s.launch_builder(entries.0.get(x.dtype, y.dtype));
    b.arg(&yp)
        .arg(&xp)
        .arg(&gp)
        .arg(&wp)
        .arg(&g64)
        .arg(&dp)
        .arg(&wlen)
        .arg(&mode)
        .arg(&eps);
    let cfg = LaunchConfig {
        grid_dim: (groups.div_ceil(GROUPS_A_BLOCK).max(1) as u32, 1, 1),
        block_dim: (32 * GROUPS_A_BLOCK as u32, 1, 1),
        shared_mem_bytes: 0,
    };
    launch(b, cfg, "gated_rms_norm")
}
