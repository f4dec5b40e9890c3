//! shaders/wgsl/causal_conv.wgsl: the recurrent layers' depthwise causal convolution (with
//! its bias and SiLU where the layer has them), elementwise.

use bytemuck::{Pod, Zeroable};

use super::super::device::Gpu;
use super::super::pipelines::wgsl_kernel;
use super::WG;
use crate::Result;

/// `Params::flags`: SiLU after the sum.
pub const SILU: u32 = 1;
/// `Params::flags`: the bias buffer is read.
pub const BIAS: u32 = 2;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct Params {
    /// Outputs: tokens times channels.
    pub n: u32,
    pub channels: u32,
    pub taps: u32,
    /// `SILU | BIAS`.
    pub flags: u32,
}

wgsl_kernel!(
    "causal_conv",
    libs: [],
    bindings: [R, R, R, R, RW],
    params: Params,
    form: Plain,
);

/// `y = act(conv(x) + bias)`; `bias` is any buffer where `p.flags` lacks `BIAS`; `layout` is
/// the batch's sequence buffer (`WgpuSequences`).
pub(crate) fn causal_conv(
    gpu: &Gpu,
    p: &Params,
    [x, weight, bias]: [&wgpu::Buffer; 3],
    layout: &wgpu::Buffer,
    y: &wgpu::Buffer,
) -> Result<()> {
    gpu.run(
        &KERNEL,
        bytemuck::bytes_of(p),
        &[x, weight, bias, layout, y],
        gpu.grid((p.n as u64).div_ceil(WG)),
    )
}
