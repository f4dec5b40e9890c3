//! shaders/wgsl/gated_act.wgsl: the gated MLP's activation, elementwise.

use bytemuck::{Pod, Zeroable};

use super::super::device::Gpu;
use super::super::pipelines::wgsl_kernel;
use super::WG;
use crate::Result;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct Params {
    /// Outputs.
    pub n: u32,
    /// 0: SiLU, 1: GELU-tanh, 2: clamped SwiGLU, 3: sigmoid, 4: product, 5: relu^2.
    pub act: u32,
    pub alpha: f32,
    pub limit: f32,
    /// 1 where gate and up alternate in `gate` (gpt-oss's checkpoints; `up` not read).
    pub interleaved: u32,
    pub _pad: [u32; 3],
}

wgsl_kernel!(
    "gated_act",
    libs: ["num"],
    bindings: [R, R, RW],
    params: Params,
    form: Plain,
);

pub(crate) fn gated_act(
    gpu: &Gpu,
    p: &Params,
    gate: &wgpu::Buffer,
    up: &wgpu::Buffer,
    y: &wgpu::Buffer,
) -> Result<()> {
    gpu.run(
        &KERNEL,
        bytemuck::bytes_of(p),
        &[gate, up, y],
        gpu.grid((p.n as u64).div_ceil(WG)),
    )
}
