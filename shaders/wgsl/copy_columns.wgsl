// y[r, to + b * to_stride + j] = x[r, from + b * from_stride + j] for every row r, block
// b < blocks and j < width: latent attention's cuts of its latent, its keys assembled from
// per-head and shared parts, its values padded to the key width and cut back. `y` is a fresh
// (zeroed) buffer; one thread per copied value.

struct Params {
    rows: u32, src_cols: u32, dst_cols: u32, blocks: u32,
    width: u32, from_col: u32, from_stride: u32, to_col: u32,
    to_stride: u32, _pad0: u32, _pad1: u32, _pad2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;

@compute @workgroup_size(256)
fn copy_columns(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                @builtin(local_invocation_index) lid: u32) {
    let i = (wid.y * nwg.x + wid.x) * 256u + lid;
    let per_row = p.blocks * p.width;
    if (i >= p.rows * per_row) {
        return;
    }
    let r = i / per_row;
    let k = i % per_row;
    let b = k / p.width;
    let j = k % p.width;
    y[r * p.dst_cols + p.to_col + b * p.to_stride + j] =
        x[r * p.src_cols + p.from_col + b * p.from_stride + j];
}
