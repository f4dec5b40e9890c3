// y = weight * (x * rsqrt(mean(x^2) + eps)), one row per workgroup (transformers' order).

struct Params {
    rows: u32, cols: u32, eps: f32, _pad0: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> weight: array<f32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;

var<workgroup> red: array<f32, 256>;

@compute @workgroup_size(256)
fn rms_norm(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
            @builtin(local_invocation_index) lid: u32) {
    let row = wid.y * nwg.x + wid.x;
    if (row >= p.rows) {
        return;
    }
    let base = row * p.cols;
    var ss = 0.0;
    for (var c = lid; c < p.cols; c = c + 256u) {
        let v = x[base + c];
        ss = ss + v * v;
    }
    red[lid] = ss;
    workgroupBarrier();
    for (var w = 128u; w > 0u; w = w >> 1u) {
        if (lid < w) {
            red[lid] = red[lid] + red[lid + w];
        }
        workgroupBarrier();
    }
    let inv = 1.0 / sqrt(red[0] / f32(p.cols) + p.eps);
    for (var c = lid; c < p.cols; c = c + 256u) {
        y[base + c] = weight[c] * (x[base + c] * inv);
    }
}
