// The f16 planes the split matmuls pass between their kernels (split_rows.wgsl writes the
// activations', lib/weight_planes.wgsl the weights', split_gemm.wgsl multiplies them): a matrix
// of rows of `cols` values, each scaled by a power of two, as a plane of f16 high parts and a
// plane of f16 residuals, rows padded with zeros to a multiple of 8 values.

// Values per plane row.
fn plane_ld(cols: u32) -> u32 {
    return (cols + 7u) / 8u * 8u;
}

// v's high part: its mantissa rounded to f16's 10 bits, to nearest with ties to even, by
// integer arithmetic, which no compiler folds away as it may fold f32(f16(v)); v - f16_high(v)
// is exact in f32 (the residual). Nearest, not cut: the one-product mode multiplies the high
// parts alone, and a cut would shrink every operand by about 2^-12 on average.
fn f16_high(v: f32) -> f32 {
    let b = bitcast<u32>(v);
    return bitcast<f32>((b + 0xfffu + ((b >> 13u) & 1u)) & 0xffffe000u);
}

// The exponent split_rows.wgsl records for a row holding a NaN or an infinity (split_gemm.wgsl
// makes its outputs NaN, as the f32 products would be).
const BAD_ROW: i32 = 1000i;
