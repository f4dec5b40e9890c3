// y = x W^T for one-byte codes (`float-quantized` / `naive-quantized` FP8 E4M3, `int-quantized`
// INT8) with tensor/channel/group/block scales and optional zero points:
// W = RN_model(RN_scale((v - z) * s)), formats.md §1.5.

struct Params {
    m: u32, n: u32, k: u32, ldy: u32,
    y_col0: u32, w_row0: u32, bias_row0: u32, has_bias: u32,
    // The power of two the weights are scaled by before their f16 split (lib/weight_planes.wgsl).
    w_scale: f32,
    is_int8: u32, scale_dtype: u32, row_div: u32, row_stride: u32,
    col_div: u32, has_zero: u32, model_dtype: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(4) var<storage, read> codes: array<u32>;
@group(0) @binding(5) var<storage, read> scales: array<u32>;
@group(0) @binding(6) var<storage, read> zeros: array<u32>;

fn load_w(row: u32, col: u32) -> f32 {
    let i = row * p.k + col;
    let byte = byte_of(codes[i >> 2u], i);
    var v: f32;
    if (p.is_int8 != 0u) {
        v = f32(i32(byte << 24u) >> 24u);
    } else {
        v = fp8_e4m3_to_f32(byte);
    }
    let si = (row / p.row_div) * p.row_stride + col / p.col_div;
    let z = f32(load_zero(si));
    return round_to(round_to((v - z) * load_scale(si), p.scale_dtype), p.model_dtype);
}

// 8 one-byte codes = two words when rows start on words; one scale when groups are 8k wide.
fn chunk_path() -> bool {
    return p.k % 4u == 0u && p.col_div % 8u == 0u;
}

fn w_fetch(row: u32, c8: u32) -> WRaw {
    var r = WRaw(vec4<u32>(0u), vec4<u32>(0u));
    if (!chunk_path()) {
        return r;
    }
    let wi = (row * p.k + c8 * 8u) / 4u;
    r.a.x = codes[wi];
    r.a.y = codes[wi + 1u];
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
    let z = f32(zero_of(r.a.w, si));
    for (var i = 0u; i < 8u; i = i + 1u) {
        var word = r.a.x;
        if (i >= 4u) {
            word = r.a.y;
        }
        let byte = byte_of(word, i);
        var v: f32;
        if (p.is_int8 != 0u) {
            v = f32(i32(byte << 24u) >> 24u);
        } else {
            v = fp8_e4m3_to_f32(byte);
        }
        out[i] = round_to(round_to((v - z) * s, p.scale_dtype), p.model_dtype);
    }
    return w8_of(out);
}

@compute @workgroup_size(NT)
fn matmul_unpacked8(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    tile_main(wid, lid);
}
