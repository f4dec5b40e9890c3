//! The part every dequantizing matmul shares: output placement and the dispatch, one f32 tile
//! kernel (shaders/wgsl/lib/matmul.wgsl, the tile shape is the adapter's `TileConfig`) or a
//! split matmul (the weight as f16 planes, lib/weight_planes.wgsl, multiplied by
//! split_gemm.wgsl, split_gemm.rs; Shape is also that kernel's Params). Format launchers put
//! `Shape` first in their Params.

use bytemuck::{Pod, Zeroable};

use super::super::device::Gpu;
use super::super::pipelines::{Kernel, MatmulSum, Variant};
use super::split_gemm::split_gemm;
use crate::Result;

/// Largest weight planes a split matmul makes at once (4 bytes a weight): a larger weight
/// is multiplied in row pieces.
const PLANES_BYTES: u64 = 512 << 20;

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
    /// The power of two the weights are multiplied by before the f16 split of the
    /// cooperative-matrix kernels (`WgpuLinear::split_scale`); the f32 kernels ignore it.
    pub w_scale: f32,
}

/// What one matmul dispatch reads and writes besides the weight's own buffers, and how it sums.
pub(crate) struct Io<'a> {
    /// f32 activations, or for `MatmulSum::Split` their planes from `split_rows`.
    pub x: &'a wgpu::Buffer,
    pub y: &'a wgpu::Buffer,
    pub bias: &'a wgpu::Buffer,
    pub sum: MatmulSum,
    /// Whether a split matmul multiplies the weights' residuals (`Form::WeightResidual`).
    pub weight_residual: bool,
    /// Whether a split matmul multiplies the high planes alone (the one-product mode).
    pub one_product: bool,
}

/// `kernel` is the format's matmul (e.g. `matmul_dense::KERNEL`).
pub(crate) fn dispatch(
    gpu: &Gpu,
    kernel: &'static Kernel,
    params: &[u8],
    shape: &Shape,
    io: &Io,
    weight: &[&wgpu::Buffer],
) -> Result<()> {
    if io.sum == MatmulSum::Split {
        return split(gpu, kernel, params, shape, io, weight);
    }
    let mut buffers = vec![io.x, io.y, io.bias];
    buffers.extend_from_slice(weight);
    let (bm, bn) = gpu.tiles.mm_tile();
    gpu.run_variant(
        kernel,
        Variant::Sum(io.sum),
        params,
        &buffers,
        [shape.n.div_ceil(bn), shape.m.div_ceil(bm), 1],
    )
}

/// A split matmul, piece by piece of rows: the format kernel `planes` writes the piece's
/// weights as f16 planes (its `Split` module, its Params with the piece's shape; binding 2 is
/// the planes, 1 and 3 unused), split_gemm.wgsl multiplies them with `io.x`, the activations'
/// planes.
fn split(
    gpu: &Gpu,
    planes: &'static Kernel,
    params: &[u8],
    shape: &Shape,
    io: &Io,
    weight: &[&wgpu::Buffer],
) -> Result<()> {
    let ld = shape.k.next_multiple_of(8);
    let piece = (gpu.max_binding().min(PLANES_BYTES) / (4 * ld as u64)).max(1) as u32;
    let mut own = params.to_vec();
    let mut r0 = 0;
    while r0 < shape.n {
        let rows = piece.min(shape.n - r0);
        let part = Shape {
            n: rows,
            y_col0: shape.y_col0 + r0,
            w_row0: shape.w_row0 + r0,
            bias_row0: shape.bias_row0 + r0,
            ..*shape
        };
        let w = gpu.scratch("weight planes", 4 * rows as u64 * ld as u64)?;
        own[..std::mem::size_of::<Shape>()].copy_from_slice(bytemuck::bytes_of(&part));
        let mut buffers = vec![&gpu.dummy, &w.buf, &gpu.dummy];
        buffers.extend_from_slice(weight);
        // Workgroups of 8 rows x 32 chunks of 8 weights.
        gpu.run_variant(
            planes,
            Variant::Sum(MatmulSum::Split),
            &own,
            &buffers,
            [(ld / 8).div_ceil(32), rows.div_ceil(8), 1],
        )?;
        split_gemm(
            gpu,
            &part,
            [io.x, io.y, io.bias, &w.buf],
            io.weight_residual,
            io.one_product,
        )?;
        r0 += rows;
    }
    Ok(())
}
