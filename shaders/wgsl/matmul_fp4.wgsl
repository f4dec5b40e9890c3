// y = x W^T for FP4 weights: two E2M1 codes per byte (low nibble first), one scale byte per
// `group` inputs (16: NVFP4's FP8 E4M3; 32: MXFP4's E8M0). The weight value depends only on
// (scale byte, code), so the host computes the 256 x 16 table of values by each format's
// reference arithmetic once per layer (`Fp4Scale::weight`, rounded to the model dtype):
// bit-exact whatever the GPU's division accuracy.

struct Params {
    m: u32, n: u32, k: u32, ldy: u32,
    y_col0: u32, w_row0: u32, bias_row0: u32, has_bias: u32,
    // The power of two the weights are scaled by before their f16 split (lib/weight_planes.wgsl).
    w_scale: f32,
    group: u32, _pad0: u32, _pad1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(4) var<storage, read> codes: array<u32>;
@group(0) @binding(5) var<storage, read> scales: array<u32>;
@group(0) @binding(6) var<storage, read> table: array<f32>;

fn load_w(row: u32, col: u32) -> f32 {
    let bi = row * (p.k / 2u) + col / 2u;
    let byte = byte_of(codes[bi >> 2u], bi);
    let code = (byte >> ((col & 1u) * 4u)) & 15u;
    let si = row * (p.k / p.group) + col / p.group;
    return table[byte_of(scales[si >> 2u], si) * 16u + code];
}

// 8 weights = one code word (k is a multiple of the group, so rows start on words) and one
// scale (groups are multiples of 8).
fn w_fetch(row: u32, c8: u32) -> WRaw {
    var r = WRaw(vec4<u32>(0u), vec4<u32>(0u));
    r.a.x = codes[row * (p.k / 8u) + c8];
    let si = row * (p.k / p.group) + (c8 * 8u) / p.group;
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
fn matmul_fp4(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    tile_main(wid, lid);
}
