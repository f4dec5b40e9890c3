//! shaders/wgsl/pool_windows.wgsl: DeepSeek-V4's compressors, each entry a softmax-weighted
//! pool of its window's tokens.

use bytemuck::{Pod, Zeroable};

use super::super::device::Gpu;
use super::super::pipelines::wgsl_kernel;
use super::WG;
use crate::Result;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct Params {
    pub rows: u32,
    /// An entry's values.
    pub w: u32,
    pub rate: u32,
    /// 1: kv and gate hold two series (`2 w` values a token).
    pub overlap: u32,
}

wgsl_kernel!(
    "pool_windows",
    libs: [],
    bindings: [R, R, R, R, RW],
    params: Params,
    form: Plain,
);

/// `out` `[rows, w]` pooled from `kv` and `gate` with `bias` over the sequences of `layout`.
pub(crate) fn pool_windows(
    gpu: &Gpu,
    p: &Params,
    [kv, gate, bias, layout]: [&wgpu::Buffer; 4],
    out: &wgpu::Buffer,
) -> Result<()> {
    let n = p.rows as u64 * p.w as u64;
    gpu.run(
        &KERNEL,
        bytemuck::bytes_of(p),
        &[kv, gate, bias, layout, out],
        gpu.grid(n.div_ceil(WG)),
    )
}
