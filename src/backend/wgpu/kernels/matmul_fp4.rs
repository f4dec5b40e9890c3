//! shaders/wgsl/matmul_fp4.wgsl: FP4 (NVFP4, MXFP4) weights through a per-layer
//! (scale byte, code) table.

use bytemuck::{Pod, Zeroable};

use super::super::device::Gpu;
use super::super::pipelines::wgsl_kernel;
use super::matmul::{Io, Shape, dispatch};
use crate::Result;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct Params {
    pub shape: Shape,
    /// Inputs per scale byte: 16 (NVFP4) or 32 (MXFP4).
    pub group: u32,
    pub _pad: [u32; 2],
}

wgsl_kernel!(
    "matmul_fp4",
    libs: [],
    bindings: [R, RW, R, R, R, R],
    params: Params,
    form: Matmul,
);

/// The weight's buffers in binding order: packed codes, scale bytes, value table.
pub(crate) struct Weight<'a> {
    pub codes: &'a wgpu::Buffer,
    pub scales: &'a wgpu::Buffer,
    pub table: &'a wgpu::Buffer,
}

pub(crate) fn matmul_fp4(gpu: &Gpu, p: &Params, io: &Io, w: &Weight) -> Result<()> {
    dispatch(
        gpu,
        &KERNEL,
        bytemuck::bytes_of(p),
        &p.shape,
        io,
        &[w.codes, w.scales, w.table],
    )
}
