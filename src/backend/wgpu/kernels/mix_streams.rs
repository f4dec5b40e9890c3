//! shaders/wgsl/mix_streams.wgsl: DeepSeek-V4's hyper-connections, the residual streams
//! collapsed into a block's input or mixed with its output spread over them.

use bytemuck::{Pod, Zeroable};

use super::super::device::Gpu;
use super::super::pipelines::wgsl_kernel;
use super::WG;
use crate::Result;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct Params {
    pub rows: u32,
    pub n: u32,
    pub m: u32,
    pub d: u32,
    /// 1: `x` and `scales` are the block's output and its weights on each stream.
    pub added: u32,
    pub _pad: [u32; 3],
}

wgsl_kernel!(
    "mix_streams",
    libs: [],
    bindings: [R, R, R, R, RW],
    params: Params,
    form: Plain,
);

/// `out` `[rows, m * d]` from `streams` and `weights`, plus `scales * x` where `p.added`
/// (any buffers there otherwise).
pub(crate) fn mix_streams(
    gpu: &Gpu,
    p: &Params,
    [streams, weights, x, scales]: [&wgpu::Buffer; 4],
    out: &wgpu::Buffer,
) -> Result<()> {
    let n = p.rows as u64 * p.m as u64 * p.d as u64;
    gpu.run(
        &KERNEL,
        bytemuck::bytes_of(p),
        &[streams, weights, x, scales, out],
        gpu.grid(n.div_ceil(WG)),
    )
}
