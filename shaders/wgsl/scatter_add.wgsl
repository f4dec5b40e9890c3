// acc[rows[i], :] += weights[i] * y[i, :]: one expert's outputs, scaled by each token's routing
// weight, added into the f32 accumulator of the mixture. The rows of one group are distinct,
// so no two threads write the same value.

struct Params {
    n_rows: u32, cols: u32, acc_rows: u32, _pad0: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> acc: array<f32>;
@group(0) @binding(2) var<storage, read> y: array<f32>;
@group(0) @binding(3) var<storage, read> rows: array<u32>;
@group(0) @binding(4) var<storage, read> weights: array<f32>;

@compute @workgroup_size(256)
fn scatter_add(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) lid: u32) {
    let i = (wid.y * nwg.x + wid.x) * 256u + lid;
    if (i >= p.n_rows * p.cols) {
        return;
    }
    let r = i / p.cols;
    let row = rows[r];
    if (row >= p.acc_rows) {
        return;
    }
    let e = row * p.cols + i % p.cols;
    acc[e] = acc[e] + y[i] * weights[r];
}
