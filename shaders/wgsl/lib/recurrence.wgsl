// The gated linear recurrence in chunks (src/backend/recurrent.rs `delta_rule_chunked` says
// what it computes), shared by its two passes: recurrence_chunk_prepare.wgsl works on every
// (chunk, value head) at once, recurrence_chunk_scan.wgsl walks each sequence's chunks. Rules
// (`p.rule`): 0 gated DeltaNet's delta rule; 1 Mamba-2's scan (no delta correction, no
// normalization, dt as the update strength, D's skip); 2 Kimi Delta Attention (the delta rule
// with a decay a key channel: `a` and `dt_bias` a value per value head and key channel).

// Tokens a chunk (recurrent.rs CHUNK).
const RC: u32 = 64u;
const RULE_SSD: u32 = 1u;
const RULE_KIMI: u32 = 2u;

struct Params {
    k_heads: u32, v_heads: u32, dk: u32, dv: u32,
    rule: u32, n_chunks: u32, n_seqs: u32, col_blocks: u32,
    // The scan's chunks of each sequence this dispatch walks: [first_chunk, + chunk_steps).
    // The gate's bounds: Mamba-2's limits on dt; for the delta rules in gate_lo the safe
    // gate's lower bound (below 0), or 0 for the softplus decay.
    first_chunk: u32, chunk_steps: u32, gate_lo: f32, gate_hi: f32,
    // Consecutive value heads a key head serves: v_heads / k_heads (grouped) or 1 (tiled).
    kh_span: u32, _pad0: u32, _pad1: u32, _pad2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;

// torch's softplus (beta 1, threshold 20).
fn softplus(x: f32) -> f32 {
    if (x > 20.0) {
        return x;
    }
    return log(1.0 + exp(x));
}

// A delta rule's log decay from its input x = a + dt_bias and the head's rate -exp(A_log):
// rate * softplus(x), or GLM-5.3-Flash's safe gate lower_bound * sigmoid(exp(A_log) x)
// (recurrent.rs `gates`, `safe_gates`).
fn delta_decay(x: f32, rate: f32) -> f32 {
    if (p.gate_lo < 0.0) {
        return p.gate_lo * (1.0 / (1.0 + exp(rate * x)));
    }
    return rate * softplus(x);
}

// A qkv row: the delta rule's [q | k | v], Mamba-2's [x (v) | B (k) | C (q)].
fn row_width() -> u32 {
    return 2u * p.k_heads * p.dk + p.v_heads * p.dv;
}

fn q_at(kh: u32) -> u32 {
    if (p.rule == RULE_SSD) {
        return p.v_heads * p.dv + (p.k_heads + kh) * p.dk;
    }
    return kh * p.dk;
}

fn k_at(kh: u32) -> u32 {
    if (p.rule == RULE_SSD) {
        return p.v_heads * p.dv + kh * p.dk;
    }
    return (p.k_heads + kh) * p.dk;
}

fn v_at(h: u32) -> u32 {
    if (p.rule == RULE_SSD) {
        return h * p.dv;
    }
    return 2u * p.k_heads * p.dk + h * p.dv;
}

// The key head value head `h` reads.
fn key_head(h: u32) -> u32 {
    return (h / p.kh_span) % p.k_heads;
}

// The delta rules' L2 norms of token `t`'s query and key (at `qa` and `ka` in its qkv row, which
// the including kernel binds as `qkv`): (rsqrt(sum q^2 + 1e-6) * dk^-0.5, rsqrt(sum k^2 + 1e-6)),
// as the step-by-step rule norms them.
fn qk_norms(t: u32, qa: u32, ka: u32) -> vec2<f32> {
    let width = row_width();
    var qs = 0.0;
    var ks = 0.0;
    for (var d = 0u; d < p.dk; d = d + 1u) {
        let q = qkv[t * width + qa + d];
        let k = qkv[t * width + ka + d];
        qs = qs + q * q;
        ks = ks + k * k;
    }
    return vec2<f32>(inverseSqrt(qs + 1e-6) * inverseSqrt(f32(p.dk)), inverseSqrt(ks + 1e-6));
}
