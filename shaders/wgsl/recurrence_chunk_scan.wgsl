// The chunked recurrence's second pass (lib/recurrence.wgsl): a workgroup per (sequence,
// value head, SC columns), walking the sequence's chunks [first_chunk, + chunk_steps) in order
// with those columns of the f32 state S, which `state` carries between dispatches (from zero
// at the first chunk). Each invocation holds one column's rows of one of RG row groups, so a
// chunk's products over the state are RG partial sums reduced in workgroup memory. Per chunk:
// the new values V' = U - W S (the delta rules; Mamba-2's V' = U), the outputs
// O = exp(c) Q S + P V' (+ D x), then S = exp(c_last) S + (exp(c_last - c) K)^T V'.

// Value columns a workgroup, row groups, and the rows a reduction step takes.
const SC: u32 = 64u;
const RG: u32 = 4u;
const BLOCK: u32 = 8u;
// The widest key head: RG groups of at most 64 state rows an invocation.
const MAX_ROWS: u32 = 64u;

@group(0) @binding(1) var<storage, read> qkv: array<f32>;
// Mamba-2's D [v_heads]; unread by the delta rules.
@group(0) @binding(2) var<storage, read> skip: array<f32>;
@group(0) @binding(3) var<storage, read> chunks: array<u32>;
@group(0) @binding(4) var<storage, read> products: array<f32>;
@group(0) @binding(5) var<storage, read> values: array<f32>;
@group(0) @binding(6) var<storage, read> corrections: array<f32>;
@group(0) @binding(7) var<storage, read> decays: array<f32>;
// [n_seqs, v_heads, dk, dv]
@group(0) @binding(8) var<storage, read_write> state: array<f32>;
// [tokens, v_heads * dv]
@group(0) @binding(9) var<storage, read_write> out: array<f32>;

var<workgroup> red: array<f32, 2048>;
var<workgroup> vn: array<f32, 4096>;
var<workgroup> qn: array<f32, 64>;
var<workgroup> kn: array<f32, 64>;
var<workgroup> cum: array<f32, 64>;
var<workgroup> span: vec2<u32>;

// Token `t`'s decay summed from its chunk's start: key channel `d`'s for Kimi's rule.
fn summed_decay(t: u32, h: u32, d: u32) -> f32 {
    if (p.rule == RULE_KIMI) {
        return decays[(t * p.v_heads + h) * p.dk + d];
    }
    return decays[t * p.v_heads + h];
}

@compute @workgroup_size(256)
fn recurrence_chunk_scan(@builtin(workgroup_id) wid: vec3<u32>,
                         @builtin(num_workgroups) nwg: vec3<u32>,
                         @builtin(local_invocation_index) lid: u32) {
    let wg = wid.y * nwg.x + wid.x;
    if (wg >= p.n_seqs * p.v_heads * p.col_blocks) {
        return;
    }
    let s = wg / (p.v_heads * p.col_blocks);
    let h = (wg / p.col_blocks) % p.v_heads;
    let jj = lid % SC;
    let r = lid / SC;
    let col = (wg % p.col_blocks) * SC + jj;
    let live = col < p.dv;
    let kh = key_head(h);
    let ssd = p.rule == RULE_SSD;
    let keyed = p.rule == RULE_KIMI;
    let width = row_width();
    let qa = q_at(kh);
    let ka = k_at(kh);
    let rows = (p.dk + RG - 1u) / RG;
    let row0 = r * rows;
    // The sequence's chunks, loaded through workgroup memory so that the chunk loop (and its
    // barriers) is provably uniform.
    if (lid == 0u) {
        span = vec2<u32>(chunks[p.n_chunks + 1u + s], chunks[p.n_chunks + 2u + s]);
    }
    let seq_chunks = workgroupUniformLoad(&span);
    let first = seq_chunks.x;
    let last = seq_chunks.y;
    let at = ((s * p.v_heads + h) * p.dk) * p.dv + col;

    var st: array<f32, 64>;
    for (var e = 0u; e < rows; e = e + 1u) {
        st[e] = 0.0;
        if (p.first_chunk > 0u && live && row0 + e < p.dk) {
            st[e] = state[at + (row0 + e) * p.dv];
        }
    }
    for (var step = 0u; step < p.chunk_steps; step = step + 1u) {
        let c = first + p.first_chunk + step;
        if (c >= last) {
            break;
        }
        let start = chunks[c];
        let len = chunks[c + 1u] - start;
        if (lid < len) {
            let t = start + lid;
            cum[lid] = summed_decay(t, h, 0u);
            qn[lid] = 1.0;
            kn[lid] = 1.0;
            if (!ssd) {
                let norms = qk_norms(t, qa, ka);
                qn[lid] = norms.x;
                kn[lid] = norms.y;
            }
        }
        workgroupBarrier();

        // V' = U - W S, BLOCK rows at a time.
        for (var b0 = 0u; b0 < RC; b0 = b0 + BLOCK) {
            for (var ii = 0u; ii < BLOCK; ii = ii + 1u) {
                let i = b0 + ii;
                var part = 0.0;
                if (i < len && !ssd) {
                    let w = ((start + i) * p.v_heads + h) * p.dk + row0;
                    for (var e = 0u; e < rows && row0 + e < p.dk; e = e + 1u) {
                        part = part + corrections[w + e] * st[e];
                    }
                }
                red[(r * BLOCK + ii) * SC + jj] = part;
            }
            workgroupBarrier();
            for (var q2 = 0u; q2 < BLOCK / RG; q2 = q2 + 1u) {
                let ii = r * (BLOCK / RG) + q2;
                let i = b0 + ii;
                if (i < len) {
                    var u = 0.0;
                    if (live) {
                        u = values[((start + i) * p.v_heads + h) * p.dv + col];
                    }
                    var sum = 0.0;
                    for (var g = 0u; g < RG; g = g + 1u) {
                        sum = sum + red[(g * BLOCK + ii) * SC + jj];
                    }
                    vn[i * SC + jj] = u - sum;
                }
            }
            workgroupBarrier();
        }

        // O = exp(c) Q S + P V' (+ D x).
        for (var b0 = 0u; b0 < RC; b0 = b0 + BLOCK) {
            for (var ii = 0u; ii < BLOCK; ii = ii + 1u) {
                let i = b0 + ii;
                var part = 0.0;
                if (i < len) {
                    let t = start + i;
                    for (var e = 0u; e < rows && row0 + e < p.dk; e = e + 1u) {
                        var q = qkv[t * width + qa + row0 + e];
                        if (keyed) {
                            q = q * exp(summed_decay(t, h, row0 + e));
                        }
                        part = part + q * st[e];
                    }
                }
                red[(r * BLOCK + ii) * SC + jj] = part;
            }
            workgroupBarrier();
            for (var q2 = 0u; q2 < BLOCK / RG; q2 = q2 + 1u) {
                let ii = r * (BLOCK / RG) + q2;
                let i = b0 + ii;
                if (i < len && live) {
                    let t = start + i;
                    var old = 0.0;
                    for (var g = 0u; g < RG; g = g + 1u) {
                        old = old + red[(g * BLOCK + ii) * SC + jj];
                    }
                    if (!keyed) {
                        old = old * exp(cum[i]);
                    }
                    var o = old * qn[i];
                    let pr = (t * p.v_heads + h) * RC;
                    for (var m = 0u; m <= i; m = m + 1u) {
                        o = o + products[pr + m] * vn[m * SC + jj];
                    }
                    if (ssd) {
                        o = o + skip[h] * qkv[t * width + v_at(h) + col];
                    }
                    out[t * p.v_heads * p.dv + h * p.dv + col] = o;
                }
            }
            workgroupBarrier();
        }

        // S = exp(c_last) S + (exp(c_last - c) K)^T V'.
        let tl = start + len - 1u;
        for (var e = 0u; e < rows && row0 + e < p.dk; e = e + 1u) {
            let d = row0 + e;
            let c_last = summed_decay(tl, h, d);
            var acc = exp(c_last) * st[e];
            for (var i = 0u; i < len; i = i + 1u) {
                let t = start + i;
                let f = kn[i] * exp(c_last - summed_decay(t, h, d)) * vn[i * SC + jj];
                acc = acc + qkv[t * width + ka + d] * f;
            }
            st[e] = acc;
        }
        workgroupBarrier();
    }
    if (live) {
        for (var e = 0u; e < rows && row0 + e < p.dk; e = e + 1u) {
            state[at + (row0 + e) * p.dv] = st[e];
        }
    }
}
