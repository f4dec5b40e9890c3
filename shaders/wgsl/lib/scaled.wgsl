// Scales and zero points of the matmuls whose weights carry one scale entry per group
// (matmul_packed_int, matmul_unpacked8). The including kernel declares `p` (with row_div,
// row_stride, col_div, scale_dtype and has_zero), `scales` (f32 words, or f16/bf16 pairs) and
// `zeros` (one signed byte + 128 per scale entry, four to a word; see has_zero 2 below). The `_word` functions read memory (the register prefetch of
// `w_fetch`), the `_of` functions decode what was read.

// The scale entry of weights (row, 8 c8 .. 8 c8 + 7) where groups span whole chunks of 8.
fn chunk_scale_index(row: u32, c8: u32) -> u32 {
    return (row / p.row_div) * p.row_stride + (c8 * 8u) / p.col_div;
}

fn scale_word(si: u32) -> u32 {
    if (p.scale_dtype == DT_F32) {
        return scales[si];
    }
    return scales[si >> 1u];
}

fn scale_of(word: u32, si: u32) -> f32 {
    if (p.scale_dtype == DT_F32) {
        return bitcast<f32>(word);
    }
    return half_to_f32(half_of(word, si), p.scale_dtype);
}

// has_zero 2 (matmul_packed_int only): `zeros` holds one f32 minimum per scale entry instead,
// subtracted from code * scale with the codes read unsigned (GGUF's types with a minimum).
fn zero_word(si: u32) -> u32 {
    // has_zero 3 (matmul_packed_int only): `zeros` holds IQ4's levels, read by code.
    if (p.has_zero == 0u || p.has_zero == 3u) {
        return 0u;
    }
    if (p.has_zero == 2u) {
        return zeros[si];
    }
    return zeros[si >> 2u];
}

fn zero_of(word: u32, si: u32) -> i32 {
    if (p.has_zero != 1u) {
        return 0;
    }
    return i32(byte_of(word, si)) - 128;
}

fn min_of(word: u32) -> f32 {
    return bitcast<f32>(word);
}

fn load_scale(si: u32) -> f32 {
    return scale_of(scale_word(si), si);
}

fn load_zero(si: u32) -> i32 {
    return zero_of(zero_word(si), si);
}
