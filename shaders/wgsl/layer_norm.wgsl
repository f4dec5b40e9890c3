// LayerNorm, one row per workgroup: y = (x - mean) / sqrt(var + eps) * weight + bias, the
// variance biased (torch's order: the mean first, then the mean of squared deviations).

struct Params {
    rows: u32, cols: u32, eps: f32, _pad: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> weight: array<f32>;
@group(0) @binding(3) var<storage, read> bias: array<f32>;
@group(0) @binding(4) var<storage, read_write> y: array<f32>;

var<workgroup> red: array<f32, 256>;

// The workgroup's sum of `v` (every invocation calls it).
fn total(lid: u32, v: f32) -> f32 {
    red[lid] = v;
    workgroupBarrier();
    for (var w = 128u; w > 0u; w = w >> 1u) {
        if (lid < w) {
            red[lid] = red[lid] + red[lid + w];
        }
        workgroupBarrier();
    }
    let s = red[0];
    workgroupBarrier();
    return s;
}

@compute @workgroup_size(256)
fn layer_norm(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
              @builtin(local_invocation_index) lid: u32) {
    let row = wid.y * nwg.x + wid.x;
    if (row >= p.rows) {
        return;
    }
    let base = row * p.cols;
    var s = 0.0;
    for (var c = lid; c < p.cols; c = c + 256u) {
        s = s + x[base + c];
    }
    let mean = total(lid, s) / f32(p.cols);
    var ss = 0.0;
    for (var c = lid; c < p.cols; c = c + 256u) {
        let dv = x[base + c] - mean;
        ss = ss + dv * dv;
    }
    let inv = 1.0 / sqrt(total(lid, ss) / f32(p.cols) + p.eps);
    for (var c = lid; c < p.cols; c = c + 256u) {
        y[base + c] = (x[base + c] - mean) * inv * weight[c] + bias[c];
    }
}
