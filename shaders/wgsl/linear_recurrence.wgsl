// The recurrent layers' gated linear recurrence step by step (src/backend/recurrent.rs says
// what it computes), p.rule: 0 gated DeltaNet's delta rule; 1 Mamba-2's scan (the same update
// without the delta correction, no normalization, dt as the update strength, D's skip); 2
// Kimi Delta Attention (the delta rule, the state's row r decaying by its own exp(g_r): `a` and
// `dt_bias` a value per value head and key channel, staged with the query and key). A workgroup per (token, value head, 64 columns of the head), each invocation one
// column of the state S[:, j] in private memory; the token's query and key are staged in
// workgroup memory. Workgroups of tokens that start no sequence loop over nothing. A first,
// exact form: the chunked form with matrix products within a chunk is what makes it fast.

const COLS: u32 = 64u;
const MAX_DK: u32 = 256u;

struct Params {
    tokens: u32, k_heads: u32, v_heads: u32, dk: u32,
    dv: u32, col_blocks: u32, rule: u32, _pad: u32,
    dt_min: f32, dt_max: f32, _pad1: u32, _pad2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
// Rows of the delta rule's [q | k | v], of Mamba-2's [x (v) | B (k) | C (q)].
@group(0) @binding(1) var<storage, read> qkv: array<f32>;
@group(0) @binding(2) var<storage, read> a: array<f32>;
// The delta rule's beta input per token; Mamba-2's D per head.
@group(0) @binding(3) var<storage, read> b: array<f32>;
@group(0) @binding(4) var<storage, read> a_log: array<f32>;
@group(0) @binding(5) var<storage, read> dt_bias: array<f32>;
// [sequence start of each token | position of each token], see WgpuLayout.
@group(0) @binding(6) var<storage, read> seq: array<u32>;
@group(0) @binding(7) var<storage, read_write> out: array<f32>;

var<workgroup> sq: array<f32, MAX_DK>;
var<workgroup> sk: array<f32, MAX_DK>;
var<workgroup> sg: array<f32, MAX_DK>;
var<workgroup> seq_end: u32;

@compute @workgroup_size(64)
fn linear_recurrence(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
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
    let kw = p.k_heads * p.dk;
    let ow = p.v_heads * p.dv;
    let width = 2u * kw + ow;
    let ssd = p.rule == 1u;
    let keyed = p.rule == 2u;
    var q_at = 0u;
    var k_at = kw;
    var v_at = 2u * kw;
    if (ssd) {
        q_at = ow + kw;
        k_at = ow;
        v_at = 0u;
    }
    var s: array<f32, MAX_DK>;
    for (var r = 0u; r < p.dk; r = r + 1u) {
        s[r] = 0.0;
    }
    let scale = inverseSqrt(f32(p.dk));
    let rate = -exp(a_log[h]);
    var skip = 0.0;
    if (ssd) {
        skip = b[h];
    }
    for (var t = t0; t < end; t = t + 1u) {
        workgroupBarrier();
        for (var r = lid; r < p.dk; r = r + COLS) {
            sq[r] = qkv[t * width + q_at + kh * p.dk + r];
            sk[r] = qkv[t * width + k_at + kh * p.dk + r];
            if (keyed) {
                let e = h * p.dk + r;
                let xr = a[t * p.v_heads * p.dk + e] + dt_bias[e];
                var spr = xr;
                if (xr <= 20.0) {
                    spr = log(1.0 + exp(xr));
                }
                sg[r] = exp(rate * spr);
            }
        }
        workgroupBarrier();
        // The head's decay (keyed: in bounds but unused, the rows' own are in sg).
        let x = a[t * p.v_heads + h] + dt_bias[h];
        var sp = x;
        if (x <= 20.0) {
            sp = log(1.0 + exp(x));
        }
        var qinv = 1.0;
        var kinv = 1.0;
        var beta: f32;
        if (ssd) {
            beta = min(max(sp, p.dt_min), p.dt_max);
            sp = beta;
        } else {
            var qs = 0.0;
            var ks = 0.0;
            for (var r = 0u; r < p.dk; r = r + 1u) {
                qs = qs + sq[r] * sq[r];
                ks = ks + sk[r] * sk[r];
            }
            qinv = inverseSqrt(qs + 1e-6) * scale;
            kinv = inverseSqrt(ks + 1e-6);
            beta = 1.0 / (1.0 + exp(-b[t * p.v_heads + h]));
        }
        let decay = exp(rate * sp);
        if (j < p.dv) {
            var remembered = 0.0;
            for (var r = 0u; r < p.dk; r = r + 1u) {
                s[r] = s[r] * select(decay, sg[r], keyed);
                if (!ssd) {
                    remembered = remembered + s[r] * sk[r] * kinv;
                }
            }
            let v = qkv[t * width + v_at + h * p.dv + j];
            let delta = (v - remembered) * beta;
            var o = 0.0;
            for (var r = 0u; r < p.dk; r = r + 1u) {
                s[r] = s[r] + sk[r] * kinv * delta;
                o = o + s[r] * sq[r] * qinv;
            }
            out[t * ow + h * p.dv + j] = o + skip * v;
        }
    }
}
