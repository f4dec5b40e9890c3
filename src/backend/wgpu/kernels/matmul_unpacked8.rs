//! shaders/wgsl/matmul_unpacked8.wgsl: one FP8 E4M3 or INT8 code per weight.

use bytemuck::{Pod, Zeroable};

use super::super::device::Gpu;
use super::super::pipelines::wgsl_kernel;
use super::matmul::{Io, Shape, dispatch};
use crate::Result;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct Params {
    pub shape: Shape,
    pub is_int8: u32,
    pub scale_dtype: u32,
    pub row_div: u32,
    pub row_stride: u32,
    pub col_div: u32,
    pub has_zero: u32,
    pub model_dtype: u32,
}

wgsl_kernel!(
    "matmul_unpacked8",
    libs: ["scaled"],
    bindings: [R, RW, R, R, R, R],
    params: Params,
    form: Matmul,
);

/// The weight's buffers in binding order.
pub(crate) struct Weight<'a> {
    pub codes: &'a wgpu::Buffer,
    pub scales: &'a wgpu::Buffer,
    pub zeros: &'a wgpu::Buffer,
}

pub(crate) fn matmul_unpacked8(gpu: &Gpu, p: &Params, io: &Io, w: &Weight) -> Result<()> {
    dispatch(
        gpu,
        &KERNEL,
        bytemuck::bytes_of(p),
        &p.shape,
        io,
        &[w.codes, w.scales, w.zeros],
    )
}
