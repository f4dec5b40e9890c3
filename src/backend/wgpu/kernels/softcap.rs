//! shaders/wgsl/softcap.wgsl: `cap * tanh(x / cap)` in place on a logits tile.

use bytemuck::{Pod, Zeroable};

use super::super::device::Gpu;
use super::super::pipelines::wgsl_kernel;
use super::WG;
use crate::Result;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct Params {
    pub n: u32,
    pub cap: f32,
    pub _pad: [u32; 2],
}

wgsl_kernel!(
    "softcap",
    libs: ["num"],
    bindings: [RW],
    params: Params,
    form: Plain,
);

pub(crate) fn softcap(gpu: &Gpu, p: &Params, x: &wgpu::Buffer) -> Result<()> {
    gpu.run(
        &KERNEL,
        bytemuck::bytes_of(p),
        &[x],
        gpu.grid((p.n as u64).div_ceil(WG)),
    )
}
