// y = x W^T for one-byte codes (`float-quantized` / `naive-quantized` FP8 E4M3, `int-quantized`
// INT8) with tensor/channel/group/block scales and optional zero points:
// W = RN_model(RN_scale((v - z) * s)), formats.md §1.5.

struct Params {
    m: u32, n: u32, k: u32, ldy: u32,
    y_col0: u32, w_row0: u32, bias_row0: u32, has_bias: u32,
    is_int8: u32, scale_dtype: u32, row_div: u32, row_stride: u32,
    col_div: u32, has_zero: u32, model_dtype: u32, _pad0: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(4) var<storage, read> codes: array<u32>;
@group(0) @binding(5) var<storage, read> scales: array<u32>;
@group(0) @binding(6) var<storage, read> zeros: array<u32>;

fn load_scale(i: u32) -> f32 {
    if (p.scale_dtype == DT_F32) {
        return bitcast<f32>(scales[i]);
    }
    return half_to_f32(half_of(scales[i >> 1u], i), p.scale_dtype);
}

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
    var z = 0.0;
    if (p.has_zero != 0u) {
        z = f32(i32(byte_of(zeros[si >> 2u], si)) - 128);
    }
    return round_to(round_to((v - z) * load_scale(si), p.scale_dtype), p.model_dtype);
}

@compute @workgroup_size(256)
fn matmul_unpacked8(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    matmul_tile(wid, lid);
}
