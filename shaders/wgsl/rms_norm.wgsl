// y = weight * (x * rsqrt(mean(x^2) + eps)), a row per segment of SEG invocations
// (lib/row_sums.wgsl; transformers' order).

struct Params {
    rows: u32, cols: u32, eps: f32, _pad: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> weight: array<f32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;

@compute @workgroup_size(256)
fn rms_norm(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
            @builtin(local_invocation_index) lid: u32) {
    let at = segment_of(wid.y * nwg.x + wid.x, lid, p.rows);
    let base = at.row * p.cols;
    var ss = 0.0;
    if (at.live) {
        for (var c = at.t; c < p.cols; c = c + SEG) {
            let v = x[base + c];
            ss = ss + v * v;
        }
    }
    let total = segment_sum(lid, ss);
    if (!at.live) {
        return;
    }
    let inv = 1.0 / sqrt(total / f32(p.cols) + p.eps);
    for (var c = at.t; c < p.cols; c = c + SEG) {
        y[base + c] = weight[c] * (x[base + c] * inv);
    }
}
