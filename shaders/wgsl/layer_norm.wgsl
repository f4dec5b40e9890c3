// LayerNorm, a row per segment of SEG invocations (lib/row_sums.wgsl): y = (x - mean) /
// sqrt(var + eps) * weight + bias, the variance biased (torch's order: the mean first, then
// the mean of squared deviations).

struct Params {
    rows: u32, cols: u32, eps: f32, _pad: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> weight: array<f32>;
@group(0) @binding(3) var<storage, read> bias: array<f32>;
@group(0) @binding(4) var<storage, read_write> y: array<f32>;

@compute @workgroup_size(256)
fn layer_norm(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
              @builtin(local_invocation_index) lid: u32) {
    let at = segment_of(wid.y * nwg.x + wid.x, lid, p.rows);
    let base = at.row * p.cols;
    var s = 0.0;
    if (at.live) {
        for (var c = at.t; c < p.cols; c = c + SEG) {
            s = s + x[base + c];
        }
    }
    let mean = segment_sum(lid, s) / f32(p.cols);
    workgroupBarrier();
    var ss = 0.0;
    if (at.live) {
        for (var c = at.t; c < p.cols; c = c + SEG) {
            let dv = x[base + c] - mean;
            ss = ss + dv * dv;
        }
    }
    let inv = 1.0 / sqrt(segment_sum(lid, ss) / f32(p.cols) + p.eps);
    if (!at.live) {
        return;
    }
    for (var c = at.t; c < p.cols; c = c + SEG) {
        y[base + c] = (x[base + c] - mean) * inv * weight[c] + bias[c];
    }
}
