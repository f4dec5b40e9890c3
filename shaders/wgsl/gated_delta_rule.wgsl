// The gated delta rule step by step (src/backend/recurrent.rs says what it computes): a
// workgroup per (token, value head, 64 columns of the head), each invocation one column of the
// state S[:, j] in private memory; the token's query and key are staged in workgroup memory.
// Workgroups of tokens that start no sequence loop over nothing. A first, exact form: the
// chunked form with matrix products within a chunk is what makes it fast.

const COLS: u32 = 64u;
const MAX_DK: u32 = 256u;

struct Params {
    tokens: u32, k_heads: u32, v_heads: u32, dk: u32,
    dv: u32, col_blocks: u32, _pad0: u32, _pad1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> qkv: array<f32>;
@group(0) @binding(2) var<storage, read> a: array<f32>;
@group(0) @binding(3) var<storage, read> b: array<f32>;
@group(0) @binding(4) var<storage, read> a_log: array<f32>;
@group(0) @binding(5) var<storage, read> dt_bias: array<f32>;
// [sequence start of each token | position of each token], see WgpuLayout.
@group(0) @binding(6) var<storage, read> seq: array<u32>;
@group(0) @binding(7) var<storage, read_write> out: array<f32>;

var<workgroup> sq: array<f32, MAX_DK>;
var<workgroup> sk: array<f32, MAX_DK>;
var<workgroup> seq_end: u32;

@compute @workgroup_size(64)
fn gated_delta_rule(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                    @builtin(local_invocation_index) lid: u32) {
    let i = wid.y * nwg.x + wid.x;
    if (i >= p.tokens * p.v_heads * p.col_blocks) {
        return;
    }
    let t0 = i / (p.v_heads * p.col_blocks);
    let h = (i / p.col_blocks) % p.v_heads;
    let j = (i % p.col_blocks) * COLS + lid;
    // The sequence's end, t0 itself where t0 starts none; loaded through workgroup memory so
    // that the token loop (and its barriers) is provably uniform.
    if (lid == 0u) {
        var end = t0;
        if (seq[t0] == t0) {
            end = t0 + 1u;
            while (end < p.tokens && seq[end] == t0) {
                end = end + 1u;
            }
        }
        seq_end = end;
    }
    let end = workgroupUniformLoad(&seq_end);
    let kh = h / (p.v_heads / p.k_heads);
    let width = 2u * p.k_heads * p.dk + p.v_heads * p.dv;
    let kw = p.k_heads * p.dk;
    let ow = p.v_heads * p.dv;
    var s: array<f32, MAX_DK>;
    for (var r = 0u; r < p.dk; r = r + 1u) {
        s[r] = 0.0;
    }
    let scale = inverseSqrt(f32(p.dk));
    let rate = -exp(a_log[h]);
    for (var t = t0; t < end; t = t + 1u) {
        workgroupBarrier();
        for (var r = lid; r < p.dk; r = r + COLS) {
            sq[r] = qkv[t * width + kh * p.dk + r];
            sk[r] = qkv[t * width + kw + kh * p.dk + r];
        }
        workgroupBarrier();
        var qs = 0.0;
        var ks = 0.0;
        for (var r = 0u; r < p.dk; r = r + 1u) {
            qs = qs + sq[r] * sq[r];
            ks = ks + sk[r] * sk[r];
        }
        let qinv = inverseSqrt(qs + 1e-6) * scale;
        let kinv = inverseSqrt(ks + 1e-6);
        let x = a[t * p.v_heads + h] + dt_bias[h];
        var sp = x;
        if (x <= 20.0) {
            sp = log(1.0 + exp(x));
        }
        let decay = exp(rate * sp);
        let beta = 1.0 / (1.0 + exp(-b[t * p.v_heads + h]));
        if (j < p.dv) {
            var remembered = 0.0;
            for (var r = 0u; r < p.dk; r = r + 1u) {
                s[r] = s[r] * decay;
                remembered = remembered + s[r] * sk[r] * kinv;
            }
            let delta = (qkv[t * width + 2u * kw + h * p.dv + j] - remembered) * beta;
            var o = 0.0;
            for (var r = 0u; r < p.dk; r = r + 1u) {
                s[r] = s[r] + sk[r] * kinv * delta;
                o = o + s[r] * sq[r] * qinv;
            }
            out[t * ow + h * p.dv + j] = o;
        }
    }
}
