//! The part every dequantizing matmul shares (shaders/wgsl/lib/matmul.wgsl): output placement
//! and the tile dispatch (the tile shape is the adapter's `TileConfig`). Format wrappers put
//! `Shape` first in their Params.

use bytemuck::{Pod, Zeroable};

use super::super::device::Gpu;
use super::super::pipelines::{KernelId, MatmulSum};
use crate::Result;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct Shape {
    /// Tokens, output features computed by this dispatch, input features.
    pub m: u32,
    pub n: u32,
    pub k: u32,
    /// Row stride of y and the column of y that output feature 0 goes to.
    pub ldy: u32,
    pub y_col0: u32,
    /// First weight row of this dispatch inside the bound row block.
    pub w_row0: u32,
    /// Index into bias of output feature 0.
    pub bias_row0: u32,
    pub has_bias: u32,
}

/// What one matmul dispatch reads and writes besides the weight's own buffers, and how it sums.
pub(crate) struct Io<'a> {
    pub x: &'a wgpu::Buffer,
    pub y: &'a wgpu::Buffer,
    pub bias: &'a wgpu::Buffer,
    pub sum: MatmulSum,
}

/// `kernel` is the format's kernel id constructor (e.g. `KernelId::MatmulDense`).
pub(crate) fn dispatch(
    gpu: &Gpu,
    kernel: fn(MatmulSum) -> KernelId,
    params: &[u8],
    shape: &Shape,
    io: &Io,
    weight: &[&wgpu::Buffer],
) -> Result<()> {
    let mut buffers = vec![io.x, io.y, io.bias];
    buffers.extend_from_slice(weight);
    let (bm, bn) = gpu.tiles.mm_tile();
    gpu.run(
        kernel(io.sum),
        params,
        &buffers,
        [shape.n.div_ceil(bn), shape.m.div_ceil(bm), 1],
    )
}
