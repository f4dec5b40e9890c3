//! shaders/wgsl/rms_norm.wgsl: one row per workgroup.

use bytemuck::{Pod, Zeroable};

use super::super::device::Gpu;
use super::super::pipelines::wgsl_kernel;
use crate::Result;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct Params {
    pub rows: u32,
    pub cols: u32,
    pub eps: f32,
    pub _pad: u32,
}

wgsl_kernel!(
    "rms_norm",
    libs: ["num"],
    bindings: [R, R, RW],
    params: Params,
    form: Plain,
);

pub(crate) fn rms_norm(
    gpu: &Gpu,
    p: &Params,
    x: &wgpu::Buffer,
    weight: &wgpu::Buffer,
    y: &wgpu::Buffer,
) -> Result<()> {
    gpu.run(
        &KERNEL,
        bytemuck::bytes_of(p),
        &[x, weight, y],
        gpu.grid(p.rows as u64),
    )
}
