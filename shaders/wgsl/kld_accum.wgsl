// Second pass of the KL divergence over one vocabulary tile: with the final log-sum-exps of
// the base P and test Q from lse_update, accumulates sum p (log p - log q) and sum
// q (log q - log p) per row; on the last tile writes [KL(P||Q), KL(Q||P), NLL_q, NLL_base, base
// top-1 probability]. One row per workgroup.

struct Params {
    rows: u32, width: u32, ld: u32, first: u32,
    last: u32, _pad0: u32, _pad1: u32, _pad2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> logits_p: array<f32>;
@group(0) @binding(2) var<storage, read> logits_q: array<f32>;
@group(0) @binding(3) var<storage, read> state_p: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read> state_q: array<vec4<f32>>;
@group(0) @binding(5) var<storage, read_write> acc: array<f32>;
@group(0) @binding(6) var<storage, read_write> out: array<f32>;

var<workgroup> red: array<f32, 256>;
var<workgroup> red_reverse: array<f32, 256>;

@compute @workgroup_size(256)
fn kld_accum(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
             @builtin(local_invocation_index) lid: u32) {
    let row = wid.y * nwg.x + wid.x;
    if (row >= p.rows) {
        return;
    }
    let sp = state_p[row];
    let sq = state_q[row];
    let lse_p = sp.x + log(sp.y);
    let lse_q = sq.x + log(sq.y);
    let base = row * p.ld;
    var sum = 0.0;
    var sum_reverse = 0.0;
    for (var c = lid; c < p.width; c = c + 256u) {
        let lpp = logits_p[base + c] - lse_p;
        let lqq = logits_q[base + c] - lse_q;
        let pr = exp(lpp);
        let qr = exp(lqq);
        if (pr > 0.0) {
            sum = sum + pr * (lpp - lqq);
        }
        if (qr > 0.0) {
            sum_reverse = sum_reverse + qr * (lqq - lpp);
        }
    }
    red[lid] = sum;
    red_reverse[lid] = sum_reverse;
    workgroupBarrier();
    for (var w = 128u; w > 0u; w = w >> 1u) {
        if (lid < w) {
            red[lid] = red[lid] + red[lid + w];
            red_reverse[lid] = red_reverse[lid] + red_reverse[lid + w];
        }
        workgroupBarrier();
    }
    if (lid != 0u) {
        return;
    }
    var total = vec2<f32>(red[0], red_reverse[0]);
    if (p.first == 0u) {
        total = total + vec2<f32>(acc[2u * row], acc[2u * row + 1u]);
    }
    acc[2u * row] = total.x;
    acc[2u * row + 1u] = total.y;
    if (p.last != 0u) {
        out[row * 5u] = total.x;
        out[row * 5u + 1u] = total.y;
        out[row * 5u + 2u] = lse_q - sq.w;
        out[row * 5u + 3u] = lse_p - sp.w;
        out[row * 5u + 4u] = exp(sp.x - lse_p);
    }
}
