//! shaders/wgsl/split_gemm.wgsl: f32-grade `y = x · w^T` on cooperative matrices, the
//! activations' f16 planes (split_rows.wgsl) times a piece of the weight's (a format kernel
//! compiled with lib/weight_planes.wgsl), three products summed in f32, or two for weights
//! without residuals. Its `Params` is the matmuls' `Shape`.

use super::super::device::Gpu;
use super::super::pipelines::{Variant, wgsl_kernel};
use super::matmul::Shape;
use crate::Result;

wgsl_kernel!(
    "split_gemm",
    libs: ["planes"],
    bindings: [R, RW, R, R],
    params: Shape,
    form: WeightResidual,
);

/// `y += x_planes · w_planes^T` over `shape` (binding order: x planes, y, bias, weight
/// planes); `weight_residual` says whether the weight planes have a nonzero residual.
pub(crate) fn split_gemm(
    gpu: &Gpu,
    shape: &Shape,
    [x, y, bias, w]: [&wgpu::Buffer; 4],
    weight_residual: bool,
) -> Result<()> {
    // Tiles of 128 tokens x 128 features, tokens along x.
    gpu.run_variant(
        &KERNEL,
        Variant::WeightResidual(weight_residual),
        bytemuck::bytes_of(shape),
        &[x, y, bias, w],
        [shape.m.div_ceil(128), shape.n.div_ceil(128), 1],
    )
}
