//! shaders/wgsl/silu_mul.wgsl: elementwise.

use bytemuck::{Pod, Zeroable};

use super::super::device::Gpu;
use super::super::pipelines::KernelId;
use super::WG;
use crate::Result;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct Params {
    pub n: u32,
    pub _pad: [u32; 3],
}

pub(crate) fn silu_mul(
    gpu: &Gpu,
    p: &Params,
    gate: &wgpu::Buffer,
    up: &wgpu::Buffer,
    y: &wgpu::Buffer,
) -> Result<()> {
    gpu.run(
        KernelId::SiluMul,
        bytemuck::bytes_of(p),
        &[gate, up, y],
        gpu.grid((p.n as u64).div_ceil(WG)),
    )
}
