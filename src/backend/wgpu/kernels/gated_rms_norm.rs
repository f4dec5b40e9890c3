//! shaders/wgsl/gated_rms_norm.wgsl: gated DeltaNet's RMSNormGated, one head per workgroup.

use bytemuck::{Pod, Zeroable};

use super::super::device::Gpu;
use super::super::pipelines::wgsl_kernel;
use crate::Result;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct Params {
    pub heads: u32,
    /// Values a head (the weight's length).
    pub d: u32,
    pub eps: f32,
    pub _pad: u32,
}

wgsl_kernel!(
    "gated_rms_norm",
    libs: [],
    bindings: [R, R, R, RW],
    params: Params,
    form: Plain,
);

pub(crate) fn gated_rms_norm(
    gpu: &Gpu,
    p: &Params,
    (x, gate): (&wgpu::Buffer, &wgpu::Buffer),
    weight: &wgpu::Buffer,
    y: &wgpu::Buffer,
) -> Result<()> {
    gpu.run(
        &KERNEL,
        bytemuck::bytes_of(p),
        &[x, gate, weight, y],
        gpu.grid(p.heads as u64),
    )
}
