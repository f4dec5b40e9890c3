// Exact scalar conversions shared by the kernels. Everything that must agree bit for bit with
// the CPU reference (dequantization, activation fake-quant) is done on integer bits here,
// never with hardware conversions or divisions whose rounding a driver may relax.

// Storage dtype codes, as in kernels/mod.rs `DTYPE_*`.
const DT_F32: u32 = 0u;
const DT_F16: u32 = 1u;
const DT_BF16: u32 = 2u;

// Largest finite f32, the "no value yet" of running maxima (-inf would make inf - inf = NaN).
const NEG_BIG: f32 = -3.4028234663852886e38;

// tanh(z) through exp, to an absolute error of a few f32 ulps of 1 on every driver (the
// builtin's precision is left to the implementation and overflows on some for large |z|).
fn tanh_f32(z: f32) -> f32 {
    let e = exp(-2.0 * abs(z));
    return sign(z) * (1.0 - e) / (1.0 + e);
}

// IEEE binary16 bits (low 16 bits of `h`) widened to f32 exactly.
fn f16_bits_to_f32(h: u32) -> f32 {
    let s = (h & 0x8000u) << 16u;
    let e = (h >> 10u) & 0x1fu;
    let m = h & 0x3ffu;
    if (e == 0u) {
        // Zero or subnormal: m * 2^-24, a normal f32.
        return bitcast<f32>(bitcast<u32>(f32(m) * 0x1p-24f) | s);
    }
    if (e == 31u) {
        return bitcast<f32>(s | 0x7f800000u | (m << 13u));
    }
    return bitcast<f32>(s | ((e + 112u) << 23u) | (m << 13u));
}

// bfloat16 bits widened to f32 (exact: bf16 is the top half of an f32).
fn bf16_bits_to_f32(h: u32) -> f32 {
    return bitcast<f32>(h << 16u);
}

// Element `i` of an array of 16-bit values packed two per u32 word (`word` = words[i / 2]).
fn half_of(word: u32, i: u32) -> u32 {
    return (word >> ((i & 1u) * 16u)) & 0xffffu;
}

// A 16-bit float of dtype `dt` (DT_F16 or DT_BF16) widened to f32.
fn half_to_f32(h: u32, dt: u32) -> f32 {
    if (dt == DT_BF16) {
        return bf16_bits_to_f32(h);
    }
    return f16_bits_to_f32(h);
}

// Byte `i` of an array of bytes packed four per u32 word (`word` = words[i / 4]).
fn byte_of(word: u32, i: u32) -> u32 {
    return (word >> ((i & 3u) * 8u)) & 0xffu;
}

// Round to the nearest bfloat16, ties to even, returned widened to f32.
fn round_bf16(v: f32) -> f32 {
    let b = bitcast<u32>(v);
    if ((b & 0x7f800000u) == 0x7f800000u) {
        return v;
    }
    return bitcast<f32>((b + 0x7fffu + ((b >> 16u) & 1u)) & 0xffff0000u);
}

// Round to the nearest binary16, ties to even (subnormals and overflow to inf included),
// returned widened to f32.
fn round_f16(v: f32) -> f32 {
    let b = bitcast<u32>(v);
    let s = b & 0x80000000u;
    let a = b & 0x7fffffffu;
    if (a >= 0x7f800000u) {
        return v;
    }
    if (a >= 0x477ff000u) {
        // >= 65520, halfway between 65504 and 65536: rounds to infinity.
        return bitcast<f32>(s | 0x7f800000u);
    }
    if (a < 0x38800000u) {
        // Below 2^-14: a fixed step of 2^-24; scaling by powers of two is exact and
        // WGSL's round() is ties-to-even.
        let q = round(bitcast<f32>(a) * 0x1p24f) * 0x1p-24f;
        return bitcast<f32>(bitcast<u32>(q) | s);
    }
    return bitcast<f32>(s | ((a + 0xfffu + ((a >> 13u) & 1u)) & 0xffffe000u));
}

// Round to dtype `dt` (a no-op for f32).
fn round_to(v: f32, dt: u32) -> f32 {
    if (dt == DT_BF16) {
        return round_bf16(v);
    }
    if (dt == DT_F16) {
        return round_f16(v);
    }
    return v;
}

// FP8 E4M3FN byte decoded exactly (no infinities; 0x7f/0xff are NaN).
fn fp8_e4m3_to_f32(b: u32) -> f32 {
    let s = (b & 0x80u) << 24u;
    let e = (b >> 3u) & 15u;
    let m = b & 7u;
    if (e == 15u && m == 7u) {
        return bitcast<f32>(0x7fc00000u);
    }
    if (e == 0u) {
        return bitcast<f32>(bitcast<u32>(f32(m) * 0x1p-9f) | s);
    }
    return bitcast<f32>(s | ((e + 120u) << 23u) | (m << 20u));
}
