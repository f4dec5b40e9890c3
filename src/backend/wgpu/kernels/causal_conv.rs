//! shaders/wgsl/causal_conv.wgsl: gated DeltaNet's causal convolution and SiLU, elementwise.

use bytemuck::{Pod, Zeroable};

use super::super::device::Gpu;
use super::super::pipelines::wgsl_kernel;
use super::WG;
use crate::Result;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct Params {
    /// Outputs: tokens times channels.
    pub n: u32,
    pub channels: u32,
    pub taps: u32,
    pub _pad: u32,
}

wgsl_kernel!(
    "causal_conv",
    libs: [],
    bindings: [R, R, R, RW],
    params: Params,
    form: Plain,
);

/// `y = silu(conv(x))`; `layout` is the batch's sequence buffer (`WgpuSequences`).
pub(crate) fn causal_conv(
    gpu: &Gpu,
    p: &Params,
    x: &wgpu::Buffer,
    weight: &wgpu::Buffer,
    layout: &wgpu::Buffer,
    y: &wgpu::Buffer,
) -> Result<()> {
    gpu.run(
        &KERNEL,
        bytemuck::bytes_of(p),
        &[x, weight, layout, y],
        gpu.grid((p.n as u64).div_ceil(WG)),
    )
}
