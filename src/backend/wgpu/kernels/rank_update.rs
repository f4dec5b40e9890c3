//! shaders/wgsl/rank_update.wgsl: merges one vocabulary tile into each row's running ranking
//! of its k largest logits.

use bytemuck::{Pod, Zeroable};

use super::super::device::Gpu;
use super::super::pipelines::wgsl_kernel;
use crate::Result;

/// The most `k` a ranking holds (`K_MAX` of the shader).
pub const K_MAX: usize = 20;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct Params {
    pub rows: u32,
    pub width: u32,
    pub v0: u32,
    pub ld: u32,
    pub k: u32,
    /// The tile is the first: what `ranking` holds is not read.
    pub first: u32,
    pub _pad: [u32; 2],
}

wgsl_kernel!(
    "rank_update",
    libs: ["num"],
    bindings: [R, RW],
    params: Params,
    form: Plain,
);

/// `ranking`: per row, `k` f32 logits then their `k` u32 ids.
pub(crate) fn rank_update(
    gpu: &Gpu,
    p: &Params,
    logits: &wgpu::Buffer,
    ranking: &wgpu::Buffer,
) -> Result<()> {
    if p.k == 0 || p.k as usize > K_MAX {
        return Err(crate::Error::InvalidArgument(format!(
            "rank_update: a ranking of {} tokens (1 to {K_MAX} are supported)",
            p.k
        )));
    }
    gpu.run(
        &KERNEL,
        bytemuck::bytes_of(p),
        &[logits, ranking],
        gpu.grid(p.rows as u64),
    )
}
