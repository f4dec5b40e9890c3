//! shaders/wgsl/gather.wgsl: rows of a dense table (one row block per dispatch).

use bytemuck::{Pod, Zeroable};

use super::super::device::Gpu;
use super::super::pipelines::wgsl_kernel;
use super::WG;
use crate::Result;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct Params {
    pub n_ids: u32,
    pub cols: u32,
    /// Table rows held by the bound buffer: [row0, row1).
    pub row0: u32,
    pub row1: u32,
    pub dtype: u32,
    /// Every value is multiplied by it (1 for plain gathers).
    pub scale: f32,
    /// 1: row `r` is also multiplied by `scales[r]`.
    pub row_scales: u32,
    pub _pad: u32,
}

wgsl_kernel!(
    "gather",
    libs: ["num"],
    bindings: [R, R, R, RW],
    params: Params,
    form: Plain,
);

/// `scales`: one f32 a row where `p.row_scales` is 1 (any buffer otherwise: not read).
pub(crate) fn gather(
    gpu: &Gpu,
    p: &Params,
    table: &wgpu::Buffer,
    ids: &wgpu::Buffer,
    scales: &wgpu::Buffer,
    y: &wgpu::Buffer,
) -> Result<()> {
    let n = p.n_ids as u64 * p.cols as u64;
    gpu.run(
        &KERNEL,
        bytemuck::bytes_of(p),
        &[table, ids, scales, y],
        gpu.grid(n.div_ceil(WG)),
    )
}
