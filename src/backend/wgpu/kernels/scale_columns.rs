//! shaders/wgsl/scale_columns.wgsl: x[i] *= s[i % cols], in place.

use bytemuck::{Pod, Zeroable};

use super::super::device::Gpu;
use super::super::pipelines::wgsl_kernel;
use super::WG;
use crate::Result;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct Params {
    pub n: u32,
    pub cols: u32,
    pub _pad: [u32; 2],
}

wgsl_kernel!(
    "scale_columns",
    libs: [],
    bindings: [RW, R],
    params: Params,
    form: Plain,
);

pub(crate) fn scale_columns(
    gpu: &Gpu,
    p: &Params,
    x: &wgpu::Buffer,
    scales: &wgpu::Buffer,
) -> Result<()> {
    gpu.run(
        &KERNEL,
        bytemuck::bytes_of(p),
        &[x, scales],
        gpu.grid((p.n as u64).div_ceil(WG)),
    )
}
