//! shaders/wgsl/kld_accum.wgsl: second KL pass over one vocabulary tile.

use bytemuck::{Pod, Zeroable};

use super::super::device::Gpu;
use super::super::pipelines::wgsl_kernel;
use crate::Result;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct Params {
    pub rows: u32,
    pub width: u32,
    pub ld: u32,
    pub first: u32,
    pub last: u32,
    pub _pad: [u32; 3],
}

wgsl_kernel!(
    "kld_accum",
    libs: ["num"],
    bindings: [R, R, R, R, RW, RW],
    params: Params,
    form: Plain,
);

pub(crate) struct Io<'a> {
    pub logits_p: &'a wgpu::Buffer,
    pub logits_q: &'a wgpu::Buffer,
    pub state_p: &'a wgpu::Buffer,
    pub state_q: &'a wgpu::Buffer,
    /// 2 f32 per row: the sums so far of KL(P||Q) and KL(Q||P).
    pub acc: &'a wgpu::Buffer,
    /// 5 f32 per row: KL(P||Q), KL(Q||P), NLL_q, NLL_base, base top-1 probability.
    pub out: &'a wgpu::Buffer,
}

pub(crate) fn kld_accum(gpu: &Gpu, p: &Params, io: &Io) -> Result<()> {
    gpu.run(
        &KERNEL,
        bytemuck::bytes_of(p),
        &[
            io.logits_p,
            io.logits_q,
            io.state_p,
            io.state_q,
            io.acc,
            io.out,
        ],
        gpu.grid(p.rows as u64),
    )
}
