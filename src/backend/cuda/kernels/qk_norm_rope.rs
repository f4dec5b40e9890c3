//! `qk_norm_rope.cu`: per-head RMSNorm then RoPE over whole heads, in place, in one pass.

use cudarc::driver::PushKernelArg;

use super::{
    Kernels, Loader, Module, Source, Stream, Typed, cuda_source, elementwise, i32_arg, launch,
};
use crate::Result;
use crate::backend::cuda::CudaTensor;

/// `qk_norm_rope.cu`'s entry points.
struct Entries(Typed);

impl Module for Entries {
    const SOURCE: Source<'static> = cuda_source!("qk_norm_rope");

    fn load(l: &Loader) -> Result<Option<Self>> {
        Ok(Some(Self(l.typed("qk_norm_rope")?)))
    }
}

/// Whether heads of `head_dim` values fit the kernel: a multiple of 16 (8 values of each half
/// a thread), at most 32 threads a head, their count a power of two (they share a warp).
pub fn fits(head_dim: usize) -> bool {
    head_dim.is_multiple_of(16) && (head_dim / 16).is_power_of_two() && head_dim <= 512
}

/// Norms each `head_dim`-wide head of `x` with the f32 `weight` and `eps`, then rotates it by
/// its token's u32 position (`positions`) with the f32 `cos`/`sin` tables, in place.
pub fn run(
    k: &Kernels,
    s: &Stream,
    x: &CudaTensor,
    (weight, eps): (u64, f32),
    positions: u64,
    (cos, sin): (u64, u64),
    head_dim: usize,
) -> Result<()> {
    let rows = (x.rows * x.cols / head_dim) as i64;
    let (heads, d) = (
        i32_arg(x.cols / head_dim, "heads")?,
        i32_arg(head_dim, "head_dim")?,
    );
    let xp = x.ptr();
    let entries = k.get::<Entries>()?;
    let mut b = s.launch_builder(entries.0.get(x.dtype));
    b.arg(&xp)
        .arg(&weight)
        .arg(&positions)
        .arg(&cos)
        .arg(&sin)
        .arg(&rows)
        .arg(&heads)
        .arg(&d)
        .arg(&eps);
    launch(
        b,
        elementwise(rows as usize * (head_dim / 16))?,
        "qk_norm_rope",
    )
}
