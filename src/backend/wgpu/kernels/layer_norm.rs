//! shaders/wgsl/layer_norm.wgsl: LayerNorm, one row per workgroup.

use super::super::device::Gpu;
use super::super::pipelines::wgsl_kernel;
use super::rms_norm::Params;
use crate::Result;

wgsl_kernel!(
    "layer_norm",
    libs: [],
    bindings: [R, R, R, RW],
    params: Params,
    form: Plain,
);

/// `y = layer_norm(x) * weight + bias` over `p.rows` rows of `p.cols`.
pub(crate) fn layer_norm(
    gpu: &Gpu,
    p: &Params,
    [x, weight, bias]: [&wgpu::Buffer; 3],
    y: &wgpu::Buffer,
) -> Result<()> {
    gpu.run(
        &KERNEL,
        bytemuck::bytes_of(p),
        &[x, weight, bias, y],
        gpu.grid(p.rows as u64),
    )
}
