// y = x W^T for a plain F32/F16/BF16 weight `[rows, k]`, widened exactly.

struct Params {
    m: u32, n: u32, k: u32, ldy: u32,
    y_col0: u32, w_row0: u32, bias_row0: u32, has_bias: u32,
    // DT_F32 / DT_F16 / DT_BF16 of the stored weight.
    dtype: u32, _pad0: u32, _pad1: u32, _pad2: u32,
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

@compute @workgroup_size(256)
fn matmul_dense(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    matmul_tile(wid, lid);
}
