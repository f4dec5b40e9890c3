//! shaders/wgsl/rms_norm.wgsl: a row per segment of invocations (lib/row_sums.wgsl); its
//! `Params` and segment helpers also serve layer_norm.wgsl and gated_rms_norm.wgsl.

use bytemuck::{Pod, Zeroable};

use super::super::device::Gpu;
use super::super::pipelines::{Kernel, Variant, wgsl_kernel};
use crate::Result;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct Params {
    pub rows: u32,
    pub cols: u32,
    pub eps: f32,
    pub _pad: u32,
}

wgsl_kernel!(
    "rms_norm",
    libs: ["num", "row_sums"],
    bindings: [R, R, RW],
    params: Params,
    form: Segments,
);

/// Invocations that reduce a row of `cols` values: the power of two at or above a quarter of
/// them, at most the workgroup's 256 (rows of 1,024 and more keep a workgroup each, and the
/// sums of before).
pub fn row_invocations(cols: u32) -> u32 {
    cols.div_ceil(4).next_power_of_two().clamp(1, 256)
}

/// Runs a `Segments` kernel over `rows` rows of `cols` values: the module of their segment
/// width, enough workgroups of 256 invocations to hold them.
pub(crate) fn run_segments(
    gpu: &Gpu,
    kernel: &'static Kernel,
    (rows, cols): (u32, u32),
    params: &[u8],
    buffers: &[&wgpu::Buffer],
) -> Result<()> {
    let seg = row_invocations(cols);
    let workgroups = (rows as u64).div_ceil(256 / seg as u64);
    let v = Variant::Segment(seg);
    gpu.run_variant(kernel, v, params, buffers, gpu.grid(workgroups))
}

pub(crate) fn rms_norm(
    gpu: &Gpu,
    p: &Params,
    x: &wgpu::Buffer,
    weight: &wgpu::Buffer,
    y: &wgpu::Buffer,
) -> Result<()> {
    let shape = (p.rows, p.cols);
    run_segments(gpu, &KERNEL, shape, bytemuck::bytes_of(p), &[x, weight, y])
}
