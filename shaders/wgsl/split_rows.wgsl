// An f32 matrix [rows, cols] as split_gemm.wgsl reads its activations (lib/planes.wgsl): every
// row scaled by 2^-e, the power of two that puts its largest magnitude in [1, 2), then split
// into f16 high parts and f16 residuals (v 2^-e - hi, exact in f32), each plane
// [rows, plane_ld(cols)], two halves a word; after both planes one word a row: e as an f16
// integer (BAD_ROW where the row holds a NaN or an infinity, its planes zero). Rows from
// `source_rows` on are zeros (attention_coop.wgsl's tiles read past the last token); with
// `high_only` the residual plane is not written (the one-product mode never reads it). One
// row per workgroup.

struct Params {
    rows: u32, cols: u32, source_rows: u32, high_only: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> planes: array<u32>;

var<workgroup> red: array<f32, 256>;

// The f16 high part of v (|v| < 2 here) and its residual, as f32.
fn split(v: f32) -> vec2<f32> {
    let hi = f16_high(v);
    return vec2<f32>(hi, v - hi);
}

@compute @workgroup_size(256)
fn split_rows(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
              @builtin(local_invocation_index) lid: u32) {
    let row = wid.y * nwg.x + wid.x;
    if (row >= p.rows) {
        return;
    }
    let base = row * p.cols;
    let ld = plane_ld(p.cols);
    // The row's largest magnitude, or +inf when a value is not finite (NaN fails the test).
    var big = 0.0;
    let cols = select(0u, p.cols, row < p.source_rows);
    for (var c = lid; c < cols; c = c + 256u) {
        let a = abs(x[base + c]);
        if (a <= 3.4028234663852886e38) {
            big = max(big, a);
        } else {
            big = bitcast<f32>(0x7f800000u);
        }
    }
    red[lid] = big;
    workgroupBarrier();
    for (var w = 128u; w > 0u; w = w >> 1u) {
        if (lid < w) {
            red[lid] = max(red[lid], red[lid + w]);
        }
        workgroupBarrier();
    }
    let top = red[0];
    // top = 2^e * f with f in [1, 2): s = 2^-e; a zero row keeps s = 1, a subnormal one 2^126.
    var e = 0i;
    if (top > 0.0) {
        e = max(frexp(top).exp - 1i, -126i);
    }
    let bad = !(top <= 3.4028234663852886e38);
    let s = ldexp(1.0, -e);
    let plane = p.rows * ld / 2u;
    for (var w = lid; w < ld / 2u; w = w + 256u) {
        let c = 2u * w;
        var v = vec2<f32>(0.0);
        if (c < cols && !bad) {
            v.x = x[base + c] * s;
        }
        if (c + 1u < cols && !bad) {
            v.y = x[base + c + 1u] * s;
        }
        let a = split(v.x);
        let b = split(v.y);
        planes[row * ld / 2u + w] = pack2x16float(vec2<f32>(a.x, b.x));
        if (p.high_only == 0u) {
            planes[plane + row * ld / 2u + w] = pack2x16float(vec2<f32>(a.y, b.y));
        }
    }
    if (lid == 0u) {
        if (bad) {
            e = BAD_ROW;
        }
        planes[2u * plane + row] = pack2x16float(vec2<f32>(f32(e), 0.0));
    }
}
