//! shaders/wgsl/add.wgsl: x += y, elementwise.

use bytemuck::{Pod, Zeroable};

use super::super::device::Gpu;
use super::super::pipelines::wgsl_kernel;
use super::WG;
use crate::Result;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct Params {
    pub n: u32,
    pub _pad: [u32; 3],
}

wgsl_kernel!(
    "add",
    libs: ["num"],
    bindings: [RW, R],
    params: Params,
    form: Plain,
);

pub(crate) fn add(gpu: &Gpu, p: &Params, x: &wgpu::Buffer, y: &wgpu::Buffer) -> Result<()> {
    gpu.run(
        &KERNEL,
        bytemuck::bytes_of(p),
        &[x, y],
        gpu.grid((p.n as u64).div_ceil(WG)),
    )
}
