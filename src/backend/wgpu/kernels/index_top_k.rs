//! shaders/wgsl/index_top_k.wgsl: DeepSeek sparse attention's selection, one query row per
//! workgroup, its scores in a scratch row.

use bytemuck::{Pod, Zeroable};

use super::super::device::Gpu;
use super::super::pipelines::wgsl_kernel;
use crate::Result;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct Params {
    pub tokens: u32,
    pub heads: u32,
    pub head_dim: u32,
    pub top_k: u32,
    pub scale: f32,
    pub weight_scale: f32,
    /// The first query row of this launch (scratch row 0).
    pub row0: u32,
    /// Scratch values per row: the batch's longest sequence.
    pub max_len: u32,
    /// `IndexSpec::rate`.
    pub rate: u32,
    pub _pad: [u32; 3],
}

wgsl_kernel!(
    "index_top_k",
    libs: [],
    bindings: [R, R, R, R, RW, RW],
    params: Params,
    form: Plain,
);

/// Selects the keys of `rows` query rows from `p.row0` into `out` (`[tokens, top_k]`);
/// `scratch` holds `rows * p.max_len` u32s.
pub(crate) fn index_top_k(
    gpu: &Gpu,
    p: &Params,
    rows: u32,
    [q, k, w, layout]: [&wgpu::Buffer; 4],
    scratch: &wgpu::Buffer,
    out: &wgpu::Buffer,
) -> Result<()> {
    gpu.run(
        &KERNEL,
        bytemuck::bytes_of(p),
        &[q, k, w, layout, scratch, out],
        gpu.grid(rows as u64),
    )
}
