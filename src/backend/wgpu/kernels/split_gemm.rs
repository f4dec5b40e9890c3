//! shaders/wgsl/split_gemm.wgsl: f32-grade `y = x · w^T` on cooperative matrices, the
//! activations' f16 planes (split_rows.wgsl) times a piece of the weight's (a format kernel
//! compiled with lib/weight_planes.wgsl), three products summed in f32, two for weights
//! without residuals, or one of the high planes (the one-product mode). Its `Params` is the
//! matmuls' `Shape`.

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
/// planes); `weight_residual` says whether the weight planes have a nonzero residual,
/// `one_product` multiplies the high planes alone.
pub(crate) fn split_gemm(
    gpu: &Gpu,
    shape: &Shape,
    [x, y, bias, w]: [&wgpu::Buffer; 4],
    weight_residual: bool,
    one_product: bool,
) -> Result<()> {
    let variant = match one_product {
        true => Variant::OneProduct,
        false => Variant::WeightResidual(weight_residual),
    };
    // Tiles of 128 tokens x 128 features, tokens along x.
    gpu.run_variant(
        &KERNEL,
        variant,
        bytemuck::bytes_of(shape),
        &[x, y, bias, w],
        [shape.m.div_ceil(128), shape.n.div_ceil(128), 1],
    )
}
