// Gated DeltaNet's RMSNormGated: each d-wide head of x RMS-normed, times weight, times
// silu(gate). One head per workgroup.

struct Params {
    heads: u32, d: u32, eps: f32, _pad: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> gate: array<f32>;
@group(0) @binding(3) var<storage, read> weight: array<f32>;
@group(0) @binding(4) var<storage, read_write> y: array<f32>;

var<workgroup> red: array<f32, 64>;

@compute @workgroup_size(64)
fn gated_rms_norm(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                  @builtin(local_invocation_index) lid: u32) {
    let head = wid.y * nwg.x + wid.x;
    if (head >= p.heads) {
        return;
    }
    let base = head * p.d;
    var ss = 0.0;
    for (var c = lid; c < p.d; c = c + 64u) {
        let v = x[base + c];
        ss = ss + v * v;
    }
    red[lid] = ss;
    workgroupBarrier();
    for (var w = 32u; w > 0u; w = w >> 1u) {
        if (lid < w) {
            red[lid] = red[lid] + red[lid + w];
        }
        workgroupBarrier();
    }
    let inv = 1.0 / sqrt(red[0] / f32(p.d) + p.eps);
    for (var c = lid; c < p.d; c = c + 64u) {
        let g = gate[base + c];
        y[base + c] = weight[c] * (x[base + c] * inv) * (g / (1.0 + exp(-g)));
    }
}
