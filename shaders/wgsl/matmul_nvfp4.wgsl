// y = x W^T for `nvfp4-pack-quantized` weights: two E2M1 codes per byte (low nibble first),
// one FP8 E4M3 scale byte per 16. The weight value depends only on (scale byte, code), so the
// host computes the 256 x 16 table W = RN_model(RN_bf16(e2m1 * f32(f32(fp8) / global))) once
// per layer with the reference arithmetic (formats.md §1.4): bit-exact whatever the GPU's
// division accuracy.

struct Params {
    m: u32, n: u32, k: u32, ldy: u32,
    y_col0: u32, w_row0: u32, bias_row0: u32, has_bias: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(4) var<storage, read> codes: array<u32>;
@group(0) @binding(5) var<storage, read> scales: array<u32>;
@group(0) @binding(6) var<storage, read> table: array<f32>;

fn load_w(row: u32, col: u32) -> f32 {
    let bi = row * (p.k / 2u) + col / 2u;
    let byte = byte_of(codes[bi >> 2u], bi);
    let code = (byte >> ((col & 1u) * 4u)) & 15u;
    let si = row * (p.k / 16u) + col / 16u;
    return table[byte_of(scales[si >> 2u], si) * 16u + code];
}

// 8 weights = one code word (k is a multiple of 16, so rows start on words) and one scale.
fn w_fetch(row: u32, c8: u32) -> WRaw {
    var r = WRaw(vec4<u32>(0u), vec4<u32>(0u));
    r.a.x = codes[row * (p.k / 8u) + c8];
    let si = row * (p.k / 16u) + c8 / 2u;
    r.a.y = byte_of(scales[si >> 2u], si);
    return r;
}

fn w_decode(r: WRaw, row: u32, c8: u32) -> W8 {
    var out: array<f32, 8>;
    for (var i = 0u; i < 8u; i = i + 1u) {
        out[i] = table[r.a.y * 16u + ((r.a.x >> (4u * i)) & 15u)];
    }
    return w8_of(out);
}

@compute @workgroup_size(NT)
fn matmul_nvfp4(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    matmul_tile(wid, lid);
}
