// DeepSeek-V4's hyper-connections (`Backend::mix_streams`): out[r, k, c] = sum_j w[r, j * m + k]
// * s[r, j, c] over the n streams of each row (the sum in stream order), plus
// scales[r, k] * x[r, c] where `added` (the block's output spread over the streams). m = 1
// collapses the streams, m = n mixes them. One invocation a value.

struct Params {
    rows: u32, n: u32, m: u32, d: u32,
    added: u32, _pad0: u32, _pad1: u32, _pad2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> s: array<f32>;
@group(0) @binding(2) var<storage, read> w: array<f32>;
@group(0) @binding(3) var<storage, read> x: array<f32>;
@group(0) @binding(4) var<storage, read> scales: array<f32>;
@group(0) @binding(5) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(256)
fn mix_streams(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) lid: u32) {
    let i = (wid.y * nwg.x + wid.x) * 256u + lid;
    let per_row = p.m * p.d;
    if (i >= p.rows * per_row) {
        return;
    }
    let r = i / per_row;
    let k = (i % per_row) / p.d;
    let c = i % p.d;
    var acc = 0.0;
    for (var j = 0u; j < p.n; j = j + 1u) {
        acc = acc + w[r * p.n * p.m + j * p.m + k] * s[(r * p.n + j) * p.d + c];
    }
    if (p.added != 0u) {
        acc = scales[r * p.m + k] * x[r * p.d + c] + acc;
    }
    out[i] = acc;
}
