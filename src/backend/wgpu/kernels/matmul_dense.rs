//! shaders/wgsl/matmul_dense.wgsl: plain F32/F16/BF16 weights.

use bytemuck::{Pod, Zeroable};

use super::super::device::Gpu;
use super::super::pipelines::wgsl_kernel;
use super::matmul::{Io, Shape, dispatch};
use crate::Result;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct Params {
    pub shape: Shape,
    pub dtype: u32,
    pub _pad: [u32; 2],
}

wgsl_kernel!(
    "matmul_dense",
    libs: [],
    bindings: [R, RW, R, R],
    params: Params,
    form: Matmul,
);

pub(crate) fn matmul_dense(gpu: &Gpu, p: &Params, io: &Io, weight: &wgpu::Buffer) -> Result<()> {
    dispatch(gpu, &KERNEL, bytemuck::bytes_of(p), &p.shape, io, &[weight])
}
