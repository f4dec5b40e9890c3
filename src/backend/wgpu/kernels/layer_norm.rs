//! shaders/wgsl/layer_norm.wgsl: LayerNorm, a row per segment of invocations (as rms_norm.rs).

use super::super::device::Gpu;
use super::super::pipelines::wgsl_kernel;
use super::rms_norm::{Params, run_segments};
use crate::Result;

wgsl_kernel!(
    "layer_norm",
    libs: ["row_sums"],
    bindings: [R, R, R, RW],
    params: Params,
    form: Segments,
);

/// `y = layer_norm(x) * weight + bias` over `p.rows` rows of `p.cols`.
pub(crate) fn layer_norm(
    gpu: &Gpu,
    p: &Params,
    [x, weight, bias]: [&wgpu::Buffer; 3],
    y: &wgpu::Buffer,
) -> Result<()> {
    let shape = (p.rows, p.cols);
    run_segments(
        gpu,
        &KERNEL,
        shape,
        bytemuck::bytes_of(p),
        &[x, weight, bias, y],
    )
}
