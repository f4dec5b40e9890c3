// The chunked recurrence's first pass (lib/recurrence.wgsl): a workgroup per (chunk, value
// head), an invocation per token of the chunk. It writes the decays summed from the chunk's
// start (`decays`), the within-chunk products P[i][j] = q_i.k_j exp(c_i - c_j) for j <= i
// (`products`; per key channel for Kimi's rule), and for the delta rule solves the unit
// lower-triangular system (I + A) [U | W] = beta [V | exp(c) K], A[i][j] = beta_i k_i.k_j
// exp(c_i - c_j) for j < i, by forward substitution a column an invocation (`values`,
// `corrections`); Mamba-2's U is dt V. Queries and keys are L2-normed (the query also scaled
// by dk^-0.5) for the delta rules, as the step-by-step rule does. f32 throughout.

@group(0) @binding(1) var<storage, read> qkv: array<f32>;
// [tokens, v_heads] (Kimi: [tokens, v_heads * dk]).
@group(0) @binding(2) var<storage, read> a: array<f32>;
// The delta rule's beta input [tokens, v_heads]; unread by Mamba-2's scan.
@group(0) @binding(3) var<storage, read> b: array<f32>;
@group(0) @binding(4) var<storage, read> a_log: array<f32>;
@group(0) @binding(5) var<storage, read> dt_bias: array<f32>;
// Chunk boundaries (n_chunks + 1 token indices), then each sequence's first chunk.
@group(0) @binding(6) var<storage, read> chunks: array<u32>;
// [tokens, v_heads, RC], row i's products with the chunk's tokens 0..=i.
@group(0) @binding(7) var<storage, read_write> products: array<f32>;
// [tokens, v_heads, dv]
@group(0) @binding(8) var<storage, read_write> values: array<f32>;
// [tokens, v_heads, dk]; the delta rules only.
@group(0) @binding(9) var<storage, read_write> corrections: array<f32>;
// [tokens, v_heads] (Kimi: [tokens, v_heads, dk]).
@group(0) @binding(10) var<storage, read_write> decays: array<f32>;

var<workgroup> amat: array<f32, 4096>;
var<workgroup> beta: array<f32, 64>;
var<workgroup> gate: array<f32, 64>;
var<workgroup> cum: array<f32, 64>;
var<workgroup> qn: array<f32, 64>;
var<workgroup> kn: array<f32, 64>;

// Token `t`'s decay summed from its chunk's start, key channel `d` (Kimi's rule).
fn keyed_cum(t: u32, h: u32, d: u32) -> f32 {
    return decays[(t * p.v_heads + h) * p.dk + d];
}

@compute @workgroup_size(64)
fn recurrence_chunk_prepare(@builtin(workgroup_id) wid: vec3<u32>,
                            @builtin(num_workgroups) nwg: vec3<u32>,
                            @builtin(local_invocation_index) lid: u32) {
    let wg = wid.y * nwg.x + wid.x;
    if (wg >= p.n_chunks * p.v_heads) {
        return;
    }
    let c = wg / p.v_heads;
    let h = wg % p.v_heads;
    let start = chunks[c];
    let len = chunks[c + 1u] - start;
    let kh = key_head(h);
    let ssd = p.rule == RULE_SSD;
    let keyed = p.rule == RULE_KIMI;
    let width = row_width();
    let rate = -exp(a_log[h]);
    let i = lid;
    let t = start + i;
    let qa = q_at(kh);
    let ka = k_at(kh);

    // The token's gates and norms.
    var g = 0.0;
    qn[i] = 1.0;
    kn[i] = 1.0;
    beta[i] = 0.0;
    if (i < len) {
        if (ssd) {
            let dt = clamp(softplus(a[t * p.v_heads + h] + dt_bias[h]), p.gate_lo, p.gate_hi);
            beta[i] = dt;
            g = rate * dt;
        } else {
            beta[i] = 1.0 / (1.0 + exp(-b[t * p.v_heads + h]));
            if (!keyed) {
                g = delta_decay(a[t * p.v_heads + h] + dt_bias[h], rate);
            }
            let norms = qk_norms(t, qa, ka);
            qn[i] = norms.x;
            kn[i] = norms.y;
        }
    }
    gate[i] = g;
    workgroupBarrier();
    // The decays summed from the chunk's start, in order as the reference sums them.
    var run = 0.0;
    for (var j = 0u; j <= i; j = j + 1u) {
        run = run + gate[j];
    }
    cum[i] = run;
    if (!keyed && i < len) {
        decays[t * p.v_heads + h] = run;
    }
    if (keyed) {
        for (var d = lid; d < p.dk; d = d + RC) {
            var sum = 0.0;
            for (var j = 0u; j < len; j = j + 1u) {
                let e = h * p.dk + d;
                sum = sum + delta_decay(a[(start + j) * p.v_heads * p.dk + e] + dt_bias[e], rate);
                decays[((start + j) * p.v_heads + h) * p.dk + d] = sum;
            }
        }
    }
    storageBarrier();
    workgroupBarrier();

    // Row i of P and of A.
    if (i < len) {
        for (var j = 0u; j <= i; j = j + 1u) {
            let tj = start + j;
            var qk = 0.0;
            var kk = 0.0;
            for (var d = 0u; d < p.dk; d = d + 1u) {
                var f = qkv[tj * width + ka + d];
                if (keyed) {
                    f = f * exp(keyed_cum(t, h, d) - keyed_cum(tj, h, d));
                }
                qk = qk + qkv[t * width + qa + d] * f;
                kk = kk + qkv[t * width + ka + d] * f;
            }
            var e = 1.0;
            if (!keyed) {
                e = exp(cum[i] - cum[j]);
            }
            products[(t * p.v_heads + h) * RC + j] = qn[i] * kn[j] * qk * e;
            if (j < i) {
                amat[i * RC + j] = beta[i] * kn[i] * kn[j] * kk * e;
            }
        }
    }
    workgroupBarrier();

    // [U | W], a column an invocation: beta V, and the delta rules' beta exp(c) K, less A
    // times the rows above.
    var cols = p.dv;
    if (!ssd) {
        cols = p.dv + p.dk;
    }
    for (var col = lid; col < cols; col = col + RC) {
        var x: array<f32, 64>;
        for (var r = 0u; r < len; r = r + 1u) {
            let tr = start + r;
            var v: f32;
            if (col < p.dv) {
                v = beta[r] * qkv[tr * width + v_at(h) + col];
            } else {
                let d = col - p.dv;
                var c_r = cum[r];
                if (keyed) {
                    c_r = keyed_cum(tr, h, d);
                }
                v = beta[r] * kn[r] * qkv[tr * width + ka + d] * exp(c_r);
            }
            if (!ssd) {
                for (var j = 0u; j < r; j = j + 1u) {
                    v = v - amat[r * RC + j] * x[j];
                }
            }
            x[r] = v;
            if (col < p.dv) {
                values[(tr * p.v_heads + h) * p.dv + col] = v;
            } else {
                corrections[(tr * p.v_heads + h) * p.dk + col - p.dv] = v;
            }
        }
    }
}
