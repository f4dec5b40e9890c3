//! shaders/wgsl/rope.wgsl: one thread per (token, head, rotated pair).

use bytemuck::{Pod, Zeroable};

use super::super::device::Gpu;
use super::super::pipelines::wgsl_kernel;
use super::WG;
use crate::Result;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct Params {
    pub tokens: u32,
    pub heads: u32,
    pub head_dim: u32,
    /// Values of each head that rotate, from `start`; the rest pass through.
    pub rotary_dim: u32,
    pub start: u32,
    /// 1: pairs are neighbours (DeepSeek), 0: halves.
    pub interleaved: u32,
    pub _pad: [u32; 2],
}

wgsl_kernel!(
    "rope",
    libs: ["num"],
    bindings: [RW, R, R, R],
    params: Params,
    form: Plain,
);

pub(crate) struct Tables<'a> {
    pub cos: &'a wgpu::Buffer,
    pub sin: &'a wgpu::Buffer,
}

pub(crate) fn rope(
    gpu: &Gpu,
    p: &Params,
    x: &wgpu::Buffer,
    layout: &wgpu::Buffer,
    t: &Tables,
) -> Result<()> {
    let n = p.tokens as u64 * p.heads as u64 * (p.rotary_dim / 2) as u64;
    gpu.run(
        &KERNEL,
        bytemuck::bytes_of(p),
        &[x, layout, t.cos, t.sin],
        gpu.grid(n.div_ceil(WG)),
    )
}
