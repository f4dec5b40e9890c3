// y = x W^T for compressed-tensors `pack-quantized` INT weights (1-8 bits, dense bitstream or
// the legacy codes-per-word layout), group/channel/tensor/block scales, optional zero points
// (decoded on the host to one signed byte per scale) and g_idx:
// W = RN_model(RN_scale((q - z) * s)), formats.md §1.3; or GGUF's unsigned codes less an f32
// minimum per scale (has_zero 2): W = RN_model(code * s - m); or IQ4's levels, one i32 per
// code in `zeros` (has_zero 3): W = RN_model(level[code] * s), exact before the rounding.

struct Params {
    m: u32, n: u32, k: u32, ldy: u32,
    y_col0: u32, w_row0: u32, bias_row0: u32, has_bias: u32,
    // The power of two the weights are scaled by before their f16 split (lib/weight_planes.wgsl).
    w_scale: f32,
    bits: u32,
    words_per_row: u32,
    // Codes per word of the legacy layout, 0 for the dense bitstream.
    legacy_per: u32,
    scale_dtype: u32,
    // scale index = (row / row_div) * row_stride + (g_idx[col] or col / col_div)
    row_div: u32, row_stride: u32, col_div: u32,
    has_zero: u32,
    has_g_idx: u32, model_dtype: u32, _pad0: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(4) var<storage, read> codes: array<u32>;
@group(0) @binding(5) var<storage, read> scales: array<u32>;
@group(0) @binding(6) var<storage, read> zeros: array<u32>;
@group(0) @binding(7) var<storage, read> g_idx: array<u32>;

fn load_w(row: u32, col: u32) -> f32 {
    let mask = (1u << p.bits) - 1u;
    let base = row * p.words_per_row;
    var code: u32;
    if (p.legacy_per != 0u) {
        code = (codes[base + col / p.legacy_per] >> (p.bits * (col % p.legacy_per))) & mask;
    } else {
        let bit = col * p.bits;
        let wi = bit / 32u;
        let off = bit % 32u;
        var v = codes[base + wi] >> off;
        if (off + p.bits > 32u) {
            v = v | (codes[base + wi + 1u] << (32u - off));
        }
        code = v & mask;
    }
    var g = col / p.col_div;
    if (p.has_g_idx != 0u) {
        g = g_idx[col];
    }
    let si = (row / p.row_div) * p.row_stride + g;
    if (p.has_zero == 2u) {
        // code * scale is exact: one rounding, fused or not.
        return round_to(f32(code) * load_scale(si) - min_of(zero_word(si)), p.model_dtype);
    }
    if (p.has_zero == 3u) {
        return round_to(f32(bitcast<i32>(zeros[code])) * load_scale(si), p.model_dtype);
    }
    let q = i32(code) - i32(1u << (p.bits - 1u));
    let z = load_zero(si);
    let wv = round_to(f32(q - z) * load_scale(si), p.scale_dtype);
    return round_to(wv, p.model_dtype);
}

// Codes of 4 or 8 bits lie whole inside words whether the layout is the dense bitstream or the
// legacy codes-per-word one; with one scale per 8 columns (no g_idx, groups of 8k columns) a
// chunk of 8 weights is one or two code words and one scale.
fn chunk_path() -> bool {
    let whole = (p.bits == 4u && (p.legacy_per == 0u || p.legacy_per == 8u)) ||
        (p.bits == 8u && (p.legacy_per == 0u || p.legacy_per == 4u));
    return whole && p.has_g_idx == 0u && p.col_div % 8u == 0u;
}

fn w_fetch(row: u32, c8: u32) -> WRaw {
    var r = WRaw(vec4<u32>(0u), vec4<u32>(0u));
    if (!chunk_path()) {
        return r;
    }
    let wi = row * p.words_per_row + c8 * (p.bits / 4u);
    r.a.x = codes[wi];
    if (p.bits == 8u) {
        r.a.y = codes[wi + 1u];
    }
    let si = chunk_scale_index(row, c8);
    r.a.z = scale_word(si);
    r.a.w = zero_word(si);
    r.b.x = si;
    return r;
}

fn w_decode(r: WRaw, row: u32, c8: u32) -> W8 {
    if (!chunk_path()) {
        return load_w8(row, c8);
    }
    var out: array<f32, 8>;
    let si = r.b.x;
    let s = scale_of(r.a.z, si);
    let z = zero_of(r.a.w, si);
    let mask = (1u << p.bits) - 1u;
    let half_range = i32(1u << (p.bits - 1u));
    for (var i = 0u; i < 8u; i = i + 1u) {
        let bit = i * p.bits;
        var word = r.a.x;
        if (bit >= 32u) {
            word = r.a.y;
        }
        let code = (word >> (bit % 32u)) & mask;
        if (p.has_zero == 2u) {
            out[i] = round_to(f32(code) * s - min_of(r.a.w), p.model_dtype);
        } else if (p.has_zero == 3u) {
            out[i] = round_to(f32(bitcast<i32>(zeros[code])) * s, p.model_dtype);
        } else {
            let q = i32(code) - half_range;
            out[i] = round_to(round_to(f32(q - z) * s, p.scale_dtype), p.model_dtype);
        }
    }
    return w8_of(out);
}

@compute @workgroup_size(NT)
fn matmul_packed_int(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    tile_main(wid, lid);
}
