// out[r, :] = table[ids[r] - row0, :] * scale for the ids in [row0, row1): the token embedding
// (a dense F32/F16/BF16 table, possibly split in row blocks; Gemma scales it) and the scored
// rows of a hidden matrix (scale 1); where `row_scales` is set also times `scales[r]` (the
// rows an expert reads, scaled by their routing weights: Llama 4).

struct Params {
    n_ids: u32, cols: u32, row0: u32, row1: u32,
    dtype: u32, scale: f32, row_scales: u32, _pad1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> table: array<u32>;
@group(0) @binding(2) var<storage, read> ids: array<u32>;
@group(0) @binding(3) var<storage, read> scales: array<f32>;
@group(0) @binding(4) var<storage, read_write> y: array<f32>;

@compute @workgroup_size(256)
fn gather(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
          @builtin(local_invocation_index) lid: u32) {
    let i = (wid.y * nwg.x + wid.x) * 256u + lid;
    if (i >= p.n_ids * p.cols) {
        return;
    }
    let r = i / p.cols;
    let c = i % p.cols;
    let id = ids[r];
    if (id < p.row0 || id >= p.row1) {
        return;
    }
    let e = (id - p.row0) * p.cols + c;
    var v: f32;
    if (p.dtype == DT_F32) {
        v = bitcast<f32>(table[e]) * p.scale;
    } else {
        v = half_to_f32(half_of(table[e >> 1u], e), p.dtype) * p.scale;
    }
    if (p.row_scales != 0u) {
        v = v * scales[r];
    }
    y[i] = v;
}
