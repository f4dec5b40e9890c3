//! shaders/wgsl/gated_rms_norm.wgsl: the recurrent layers' gated RMSNorm (gated DeltaNet's,
//! Mamba-2's, Kimi Delta Attention's), a group per segment of invocations (as rms_norm.rs).

use bytemuck::{Pod, Zeroable};

use super::super::device::Gpu;
use super::super::pipelines::wgsl_kernel;
use crate::Result;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct Params {
    pub groups: u32,
    /// Values a group.
    pub d: u32,
    pub eps: f32,
    /// The weight's length (it repeats along the row).
    pub wlen: u32,
    /// `NormGate`'s number: 0 normed, then gated by silu (gated DeltaNet); 1 gated by silu,
    /// then normed (Mamba-2); 2 normed, then gated by sigmoid (Kimi Delta Attention).
    pub mode: u32,
    pub _pad: [u32; 3],
}

wgsl_kernel!(
    "gated_rms_norm",
    libs: ["row_sums"],
    bindings: [R, R, R, RW],
    params: Params,
    form: Segments,
);

pub(crate) fn gated_rms_norm(
    gpu: &Gpu,
    p: &Params,
    (x, gate): (&wgpu::Buffer, &wgpu::Buffer),
    weight: &wgpu::Buffer,
    y: &wgpu::Buffer,
) -> Result<()> {
    let shape = (p.groups, p.d);
    let buffers = [x, gate, weight, y];
    super::rms_norm::run_segments(gpu, &KERNEL, shape, bytemuck::bytes_of(p), &buffers)
}
