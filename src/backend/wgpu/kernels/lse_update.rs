//! shaders/wgsl/lse_update.wgsl: merges one vocabulary tile into each row's running
//! log-sum-exp state; writes the NLL on the last tile.

use bytemuck::{Pod, Zeroable};

use super::super::device::Gpu;
use super::super::pipelines::wgsl_kernel;
use crate::Result;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct Params {
    pub rows: u32,
    pub width: u32,
    pub v0: u32,
    pub ld: u32,
    pub first: u32,
    pub last: u32,
    pub _pad: [u32; 2],
}

wgsl_kernel!(
    "lse_update",
    libs: ["num"],
    bindings: [R, R, RW, RW],
    params: Params,
    form: Plain,
);

pub(crate) struct Io<'a> {
    pub logits: &'a wgpu::Buffer,
    pub targets: &'a wgpu::Buffer,
    /// 4 f32 per row: max, sum, argmax bits, target logit.
    pub state: &'a wgpu::Buffer,
    pub nll: &'a wgpu::Buffer,
}

pub(crate) fn lse_update(gpu: &Gpu, p: &Params, io: &Io) -> Result<()> {
    gpu.run(
        &KERNEL,
        bytemuck::bytes_of(p),
        &[io.logits, io.targets, io.state, io.nll],
        gpu.grid(p.rows as u64),
    )
}
