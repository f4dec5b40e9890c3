// Causal grouped-query attention over sequences laid end to end, flash style: a workgroup
// takes QB consecutive query tokens of one head, walks their keys in tiles of KT staged in
// shared memory, and keeps an online softmax per query (running max, sum, f32 accumulator),
// so no score matrix is ever stored.

const QB: u32 = 32u;
const KT: u32 = 16u;
const HD_MAX: u32 = 128u;

struct Params {
    tokens: u32, heads: u32, kv_heads: u32, head_dim: u32,
    scale: f32, _pad0: u32, _pad1: u32, _pad2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> q: array<f32>;
@group(0) @binding(2) var<storage, read> k: array<f32>;
@group(0) @binding(3) var<storage, read> v: array<f32>;
// [sequence start of each token | position of each token], see WgpuLayout.
@group(0) @binding(4) var<storage, read> seq: array<u32>;
@group(0) @binding(5) var<storage, read_write> out: array<f32>;

var<workgroup> ks: array<f32, 2048>;
var<workgroup> vs: array<f32, 2048>;
var<workgroup> first_key: u32;

@compute @workgroup_size(32)
fn attention(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let hd = p.head_dim;
    let h = wid.y;
    let kh = h / (p.heads / p.kv_heads);
    let q0 = wid.x * QB;
    let t = q0 + lid;
    let live = t < p.tokens;
    let last = min(q0 + QB, p.tokens) - 1u;
    // Sequence starts never decrease, so the first query's start is the block's lowest key;
    // broadcast through shared memory so the key loop (and its barriers) is provably uniform.
    if (lid == 0u) {
        first_key = seq[q0];
    }
    let kmin = workgroupUniformLoad(&first_key);
    var my_start = 0u;
    var qv: array<f32, HD_MAX>;
    var acc: array<f32, HD_MAX>;
    if (live) {
        my_start = seq[t];
        for (var d = 0u; d < hd; d = d + 1u) {
            qv[d] = q[t * p.heads * hd + h * hd + d];
        }
    }
    var m = NEG_BIG;
    var l = 0.0;
    let kv_stride = p.kv_heads * hd;
    for (var kt = kmin; kt <= last; kt = kt + KT) {
        for (var e = lid; e < KT * hd; e = e + QB) {
            let key = kt + e / hd;
            let d = e % hd;
            var kv = 0.0;
            var vv = 0.0;
            if (key <= last) {
                kv = k[key * kv_stride + kh * hd + d];
                vv = v[key * kv_stride + kh * hd + d];
            }
            ks[e] = kv;
            vs[e] = vv;
        }
        workgroupBarrier();
        if (live && kt + KT > my_start && kt <= t) {
            var s: array<f32, KT>;
            var tmax = m;
            for (var j = 0u; j < KT; j = j + 1u) {
                let key = kt + j;
                if (key >= my_start && key <= t) {
                    var dot = 0.0;
                    for (var d = 0u; d < hd; d = d + 1u) {
                        dot = dot + qv[d] * ks[j * hd + d];
                    }
                    s[j] = dot * p.scale;
                    tmax = max(tmax, s[j]);
                }
            }
            let corr = exp(m - tmax);
            l = l * corr;
            for (var d = 0u; d < hd; d = d + 1u) {
                acc[d] = acc[d] * corr;
            }
            m = tmax;
            for (var j = 0u; j < KT; j = j + 1u) {
                let key = kt + j;
                if (key >= my_start && key <= t) {
                    let pj = exp(s[j] - m);
                    l = l + pj;
                    for (var d = 0u; d < hd; d = d + 1u) {
                        acc[d] = acc[d] + pj * vs[j * hd + d];
                    }
                }
            }
        }
        workgroupBarrier();
    }
    if (live) {
        for (var d = 0u; d < hd; d = d + 1u) {
            out[t * p.heads * hd + h * hd + d] = acc[d] / l;
        }
    }
}
