// Correctly rounded f32 division and the FP8/E2M1 roundings of activation fake-quant
// (numerics.rs). GPU `a / b` may be off by an ulp or two (Vulkan allows 2.5 ulp), which
// would flip quantization boundaries; these functions reproduce IEEE results exactly.

// Mantissa with the implicit bit and unbiased exponent of a finite non-zero f32, with
// subnormals normalized.
fn split_f32(bits: u32) -> vec2<i32> {
    var e = i32((bits >> 23u) & 0xffu);
    var m = bits & 0x7fffffu;
    if (e == 0) {
        e = 1;
        while (m < 0x800000u) {
            m = m << 1u;
            e = e - 1;
        }
    } else {
        m = m | 0x800000u;
    }
    return vec2<i32>(i32(m), e);
}

// a / b rounded to nearest, ties to even, by integer long division of the mantissas.
fn div_rn(a: f32, b: f32) -> f32 {
    let ab = bitcast<u32>(a);
    let bb = bitcast<u32>(b);
    let sign = (ab ^ bb) & 0x80000000u;
    if (((ab >> 23u) & 0xffu) == 0xffu || ((bb >> 23u) & 0xffu) == 0xffu ||
        (ab & 0x7fffffffu) == 0u || (bb & 0x7fffffffu) == 0u) {
        // Zeros, infinities and NaNs are exact in hardware division.
        return a / b;
    }
    let sa = split_f32(ab);
    let sb = split_f32(bb);
    var ma = u32(sa.x);
    let mb = u32(sb.x);
    var e = sa.y - sb.y;
    if (ma < mb) {
        ma = ma << 1u;
        e = e - 1;
    }
    // mb <= ma < 2 mb: 24 quotient bits, the first one set.
    var q = 0u;
    var r = ma;
    for (var i = 0u; i < 24u; i = i + 1u) {
        q = q << 1u;
        if (r >= mb) {
            r = r - mb;
            q = q | 1u;
        }
        r = r << 1u;
    }
    // r is twice the remainder: compare with mb to round.
    var be = e + 127;
    if (be >= 255) {
        return bitcast<f32>(sign | 0x7f800000u);
    }
    if (be <= 0) {
        let sh = u32(1 - be);
        if (sh >= 25u) {
            return bitcast<f32>(sign);
        }
        let lost = q & ((1u << sh) - 1u);
        let half = 1u << (sh - 1u);
        var qs = q >> sh;
        if (lost > half || (lost == half && (r != 0u || (qs & 1u) == 1u))) {
            qs = qs + 1u;
        }
        return bitcast<f32>(sign | qs);
    }
    if (r > mb || (r == mb && (q & 1u) == 1u)) {
        q = q + 1u;
        if (q == 0x1000000u) {
            q = 0x800000u;
            be = be + 1;
            if (be >= 255) {
                return bitcast<f32>(sign | 0x7f800000u);
            }
        }
    }
    return bitcast<f32>(sign | (u32(be) << 23u) | (q & 0x7fffffu));
}

// Nearest FP8 E4M3FN value (ties to even) of x clamped to +-448, widened to f32.
fn round_fp8_e4m3(x: f32) -> f32 {
    let b = bitcast<u32>(x);
    let s = b & 0x80000000u;
    let a = min(bitcast<f32>(b & 0x7fffffffu), 448.0);
    var q: f32;
    if (a < 0x1p-6f) {
        // Subnormal range: a fixed step of 2^-9.
        q = round(a * 512.0) * 0x1p-9f;
    } else {
        let ab = bitcast<u32>(a);
        q = bitcast<f32>((ab + 0x7ffffu + ((ab >> 20u) & 1u)) & 0xfff00000u);
    }
    q = min(q, 448.0);
    return bitcast<f32>(bitcast<u32>(q) | s);
}

// compressed-tensors' round to the E2M1 grid (half to even), input already clamped to +-6.
fn round_e2m1(y: f32) -> f32 {
    let a = abs(y);
    var q = 6.0;
    if (a <= 0.25) {
        q = 0.0;
    } else if (a < 0.75) {
        q = 0.5;
    } else if (a <= 1.25) {
        q = 1.0;
    } else if (a < 1.75) {
        q = 1.5;
    } else if (a <= 2.5) {
        q = 2.0;
    } else if (a < 3.5) {
        q = 3.0;
    } else if (a <= 5.0) {
        q = 4.0;
    }
    return bitcast<f32>(bitcast<u32>(q) | (bitcast<u32>(y) & 0x80000000u));
}
