//! shaders/wgsl/split_rows.wgsl: activations as the cooperative-matrix matmuls read them.

use bytemuck::{Pod, Zeroable};

use super::super::device::Gpu;
use super::super::pipelines::wgsl_kernel;
use crate::Result;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct Params {
    pub rows: u32,
    pub cols: u32,
    /// Rows read from the input; the rest are zeros.
    pub source_rows: u32,
    /// 1: the high plane alone is written (the one-product mode reads nothing else).
    pub high_only: u32,
}

wgsl_kernel!(
    "split_rows",
    libs: ["planes"],
    bindings: [R, RW],
    params: Params,
    form: Coop,
);

/// Bytes of the planes of `rows x cols` activations: two f16 planes of rows padded to 8
/// values, then one word a row holding its exponent, in whole 16-byte words: split_gemm.wgsl
/// reads the exponents as such, and the last rows' word would otherwise end past the binding
/// (what a driver returns for a read partly out of bounds is its own choice).
pub(crate) fn planes_bytes(rows: usize, cols: usize) -> u64 {
    (4 * (rows * cols.next_multiple_of(8) + rows) as u64).next_multiple_of(16)
}

pub(crate) fn split_rows(
    gpu: &Gpu,
    p: &Params,
    x: &wgpu::Buffer,
    planes: &wgpu::Buffer,
) -> Result<()> {
    gpu.run(
        &KERNEL,
        bytemuck::bytes_of(p),
        &[x, planes],
        gpu.grid(p.rows as u64),
    )
}
