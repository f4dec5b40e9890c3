//! shaders/wgsl/matmul_packed_int.wgsl: compressed-tensors pack-quantized INT weights.

use bytemuck::{Pod, Zeroable};

use super::super::device::Gpu;
use super::super::pipelines::wgsl_kernel;
use super::matmul::{Io, Shape, dispatch};
use crate::Result;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct Params {
    pub shape: Shape,
    pub bits: u32,
    pub words_per_row: u32,
    /// Codes per word of the legacy 3/5/6/7-bit layout, 0 for the dense bitstream.
    pub legacy_per: u32,
    pub scale_dtype: u32,
    /// scale index = (row / row_div) * row_stride + (`g_idx[col]` or col / col_div)
    pub row_div: u32,
    pub row_stride: u32,
    pub col_div: u32,
    pub has_zero: u32,
    pub has_g_idx: u32,
    pub model_dtype: u32,
    pub _pad: u32,
}

wgsl_kernel!(
    "matmul_packed_int",
    libs: ["scaled"],
    bindings: [R, RW, R, R, R, R, R],
    params: Params,
    form: Matmul,
);

/// The weight's buffers in binding order.
pub(crate) struct Weight<'a> {
    pub codes: &'a wgpu::Buffer,
    pub scales: &'a wgpu::Buffer,
    pub zeros: &'a wgpu::Buffer,
    pub g_idx: &'a wgpu::Buffer,
}

pub(crate) fn matmul_packed_int(gpu: &Gpu, p: &Params, io: &Io, w: &Weight) -> Result<()> {
    dispatch(
        gpu,
        &KERNEL,
        bytemuck::bytes_of(p),
        &p.shape,
        io,
        &[w.codes, w.scales, w.zeros, w.g_idx],
    )
}
