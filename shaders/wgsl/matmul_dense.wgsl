// y = x W^T for a plain F32/F16/BF16 weight `[rows, k]`, widened exactly.

struct Params {
    m: u32, n: u32, k: u32, ldy: u32,
    y_col0: u32, w_row0: u32, bias_row0: u32, has_bias: u32,
    // The power of two the weights are scaled by before their f16 split (lib/weight_planes.wgsl).
    w_scale: f32,
    // DT_F32 / DT_F16 / DT_BF16 of the stored weight.
    dtype: u32, _pad0: u32, _pad1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(4) var<storage, read> w: array<u32>;

fn load_w(row: u32, col: u32) -> f32 {
    let i = row * p.k + col;
    if (p.dtype == DT_F32) {
        return bitcast<f32>(w[i]);
    }
    return half_to_f32(half_of(w[i >> 1u], i), p.dtype);
}

// 8 weights = 8 f32 words, or 4 words of 16-bit values when rows start on words (even k).
fn w_fetch(row: u32, c8: u32) -> WRaw {
    var r = WRaw(vec4<u32>(0u), vec4<u32>(0u));
    let i = row * p.k + c8 * 8u;
    if (p.dtype == DT_F32) {
        r.a = vec4<u32>(w[i], w[i + 1u], w[i + 2u], w[i + 3u]);
        r.b = vec4<u32>(w[i + 4u], w[i + 5u], w[i + 6u], w[i + 7u]);
    } else if (p.k % 2u == 0u) {
        let h = i >> 1u;
        r.a = vec4<u32>(w[h], w[h + 1u], w[h + 2u], w[h + 3u]);
    }
    return r;
}

fn w_decode(r: WRaw, row: u32, c8: u32) -> W8 {
    if (p.dtype == DT_F32) {
        return W8(bitcast<vec4<f32>>(r.a), bitcast<vec4<f32>>(r.b));
    }
    if (p.k % 2u != 0u) {
        return load_w8(row, c8);
    }
    var out: array<f32, 8>;
    for (var i = 0u; i < 4u; i = i + 1u) {
        out[2u * i] = half_to_f32(r.a[i] & 0xffffu, p.dtype);
        out[2u * i + 1u] = half_to_f32(r.a[i] >> 16u, p.dtype);
    }
    return w8_of(out);
}

@compute @workgroup_size(NT)
fn matmul_dense(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    tile_main(wid, lid);
}
