//! shaders/wgsl/scatter_add.wgsl: an expert's output rows, weighted, added into the mixture's
//! accumulator.

use bytemuck::{Pod, Zeroable};

use super::super::device::Gpu;
use super::super::pipelines::wgsl_kernel;
use super::WG;
use crate::Result;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct Params {
    pub n_rows: u32,
    pub cols: u32,
    /// Rows of the accumulator (rows named past it are skipped; the host checks them).
    pub acc_rows: u32,
    pub _pad: u32,
}

wgsl_kernel!(
    "scatter_add",
    libs: ["num"],
    bindings: [RW, R, R, R],
    params: Params,
    form: Plain,
);

pub(crate) fn scatter_add(
    gpu: &Gpu,
    p: &Params,
    acc: &wgpu::Buffer,
    y: &wgpu::Buffer,
    rows: &wgpu::Buffer,
    weights: &wgpu::Buffer,
) -> Result<()> {
    let n = p.n_rows as u64 * p.cols as u64;
    gpu.run(
        &KERNEL,
        bytemuck::bytes_of(p),
        &[acc, y, rows, weights],
        gpu.grid(n.div_ceil(WG)),
    )
}
