// Causal grouped-query attention over sequences laid end to end (optionally a sliding window
// of `window` keys, scores soft-capped as cap * tanh(s / cap) where softcap > 0, a sink logit
// per head where has_sinks), flash style: a workgroup of
// 4 ATTN_QB threads takes ATTN_QB consecutive query tokens of one head (staged once in shared
// memory), walks only the key tiles at or below its last query (tiles above the diagonal are
// never visited) in tiles of KT keys staged in shared memory, and keeps an online softmax per
// query (running max, sum, f32 accumulator), so no score matrix is ever stored. Per key tile:
//   1. K^T tile -> shared; 2. scores S = Q K^T, a 2x4 block per thread, kept in registers;
//   3. the online softmax in parallel: the 8 threads of a query pair share their maxima
//      through shared memory, each computes P = exp(S - max) of its block into shared memory
//      and keeps its own part of the sums (added up at the end); then all stage the V tile
//      where K was; 4. O = O * rescale + P V, a 4x8 block per thread.
// Heads wider than HD_MAX (Gemma's 256, Gemma 4's 512, DeepSeek's 192) take ceil(head_dim /
// HD_MAX) workgroups per query block, wid.z the slice of HD_MAX output columns each keeps:
// every one sums the scores over the whole head, a chunk of HD_MAX values at a time (Q^T and
// K^T restaged per chunk, in the order of one pass), and stages only its slice of V. The
// scores are recomputed per slice; in exchange the workgroup memory stays that of HD_MAX.

const QB: u32 = ATTN_QB;
const KT: u32 = 32u;
const HD_MAX: u32 = 128u;
const NT: u32 = 4u * QB;
// vec2s per head-dim row of the transposed query tile, and vec4s per row of K^T (padded).
const QS: u32 = QB / 2u + 1u;
const KS: u32 = KT / 4u + 1u;

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> q: array<f32>;
@group(0) @binding(2) var<storage, read> k: array<f32>;
@group(0) @binding(3) var<storage, read> v: array<f32>;
// [sequence start of each token | position of each token], see WgpuLayout.
@group(0) @binding(4) var<storage, read> seq: array<u32>;
// One logit per head in every softmax's denominator where has_sinks (gpt-oss).
@group(0) @binding(5) var<storage, read> sinks: array<f32>;
@group(0) @binding(6) var<storage, read_write> out: array<f32>;

// Q^T: [d][query pairs].
var<workgroup> qs: array<vec2<f32>, HD_MAX * QS>;
// K^T [d][key quads] (padded rows), then V [key][d quads].
var<workgroup> kv: array<vec4<f32>, HD_MAX * KS>;
// Probabilities: [key][query quads].
var<workgroup> st: array<vec4<f32>, KT * QB / 4u>;
var<workgroup> row_start: array<u32, QB>;
var<workgroup> row_corr: array<f32, QB>;
// Each thread's maxima of its query pair's scores in a tile, then its parts of their sums.
var<workgroup> part: array<vec2<f32>, NT>;
var<workgroup> first_key: u32;
// This workgroup's first query token (for store_o).
var<private> wid_q0: u32;

// Query qi's softmax sum: its 8 threads' parts (in `part` after the last tile).
fn row_sum(qi: u32) -> f32 {
    var l = 0.0;
    for (var i = 0u; i < 8u; i = i + 1u) {
        l = l + part[(qi / 2u) * 8u + i][qi % 2u];
    }
    return l;
}

// Output row q0 + qi, head dims d .. d + 3 (divided by the row's sum l), bounds checked.
fn store_o(qi: u32, d: u32, h: u32, v: vec4<f32>, l: f32) {
    let t = wid_q0 + qi;
    if (t >= p.tokens) {
        return;
    }
    for (var i = 0u; i < 4u; i = i + 1u) {
        if (d + i < p.head_dim) {
            out[t * p.heads * p.head_dim + h * p.head_dim + d + i] = v[i] / l;
        }
    }
}

// The staging loops read 8 values or quads a thread before they store any: every read of a
// round is in flight at once (a store right after each read waited on each in turn, and the
// staging took most of a tile's time on an H200). Reads are clamped into the tensors and
// zeroed by select, so that no branch separates them.

// Element c (head value c0 + c % HD_MAX of query q0 + c / HD_MAX) of Q^T's tile (zero past
// the head or the batch).
fn q_value(c: u32, c0: u32, q0: u32, h: u32) -> f32 {
    let hd = p.head_dim;
    let d = c0 + c % HD_MAX;
    let t = q0 + c / HD_MAX;
    let x = q[min(t, p.tokens - 1u) * p.heads * hd + h * hd + min(d, hd - 1u)];
    return select(0.0, x, d < hd && t < p.tokens);
}

fn store_q(c: u32, x: f32) {
    let r = c / HD_MAX;
    qs[(c % HD_MAX) * QS + r / 2u][r % 2u] = x;
}

// Q^T of queries q0 .. q0 + QB - 1 of head h, head values c0 .. c0 + HD_MAX - 1, invocation
// `lid`'s share (HD_MAX * QB / NT values, a multiple of 8).
fn stage_q(lid: u32, c0: u32, q0: u32, h: u32) {
    for (var c = lid; c < HD_MAX * QB; c = c + 8u * NT) {
        let x0 = q_value(c, c0, q0, h);
        let x1 = q_value(c + NT, c0, q0, h);
        let x2 = q_value(c + 2u * NT, c0, q0, h);
        let x3 = q_value(c + 3u * NT, c0, q0, h);
        let x4 = q_value(c + 4u * NT, c0, q0, h);
        let x5 = q_value(c + 5u * NT, c0, q0, h);
        let x6 = q_value(c + 6u * NT, c0, q0, h);
        let x7 = q_value(c + 7u * NT, c0, q0, h);
        store_q(c, x0);
        store_q(c + NT, x1);
        store_q(c + 2u * NT, x2);
        store_q(c + 3u * NT, x3);
        store_q(c + 4u * NT, x4);
        store_q(c + 5u * NT, x5);
        store_q(c + 6u * NT, x6);
        store_q(c + 7u * NT, x7);
    }
}

// Quad c of K^T's tile: keys kt + 4 (c / HD_MAX) .. + 3 at head value c0 + c % HD_MAX of
// KV head kh (zeros past the head or the block's last query `last`).
fn k_quad(c: u32, kt: u32, c0: u32, kh: u32, last: u32) -> vec4<f32> {
    let hd = p.head_dim;
    let d = c0 + c % HD_MAX;
    let at = kh * hd + min(d, hd - 1u);
    let stride = p.kv_heads * hd;
    let key = kt + (c / HD_MAX) * 4u;
    let x = vec4<f32>(k[min(key, last) * stride + at], k[min(key + 1u, last) * stride + at],
                      k[min(key + 2u, last) * stride + at], k[min(key + 3u, last) * stride + at]);
    let keys = vec4<u32>(key, key + 1u, key + 2u, key + 3u);
    return select(vec4<f32>(0.0), x, keys <= vec4<u32>(last) & vec4<bool>(d < hd));
}

// Quad c of V's tile: key kt + c / (HD_MAX / 4), head values slice + 4 (c % (HD_MAX / 4)) ..
// + 3 of KV head kh (zeros past the head or the block's last query `last`).
fn v_quad(c: u32, kt: u32, slice: u32, kh: u32, last: u32) -> vec4<f32> {
    let hd = p.head_dim;
    let key = kt + c / (HD_MAX / 4u);
    let row = min(key, last) * p.kv_heads * hd + kh * hd;
    let d = slice + (c % (HD_MAX / 4u)) * 4u;
    let x = vec4<f32>(v[row + min(d, hd - 1u)], v[row + min(d + 1u, hd - 1u)],
                      v[row + min(d + 2u, hd - 1u)], v[row + min(d + 3u, hd - 1u)]);
    let cols = vec4<u32>(d, d + 1u, d + 2u, d + 3u);
    return select(vec4<f32>(0.0), x, cols < vec4<u32>(hd) & vec4<bool>(key <= last));
}

// Quad c of the tile's V (`values`, head values from col0 = the slice's first) or K^T (from
// col0 = the chunk's first).
fn kv_quad(values: bool, c: u32, kt: u32, col0: u32, kh: u32, last: u32) -> vec4<f32> {
    if (values) {
        return v_quad(c, kt, col0, kh, last);
    }
    return k_quad(c, kt, col0, kh, last);
}

fn store_kv(values: bool, c: u32, x: vec4<f32>) {
    if (values) {
        kv[c] = x;
    } else {
        kv[(c % HD_MAX) * KS + c / HD_MAX] = x;
    }
}

// Invocation `lid`'s share of the tile's K^T or V (HD_MAX * KT / 4 / NT quads, a multiple of
// 8), a round of 8 at a time.
fn stage_kv(values: bool, lid: u32, kt: u32, col0: u32, kh: u32, last: u32) {
    for (var c = lid; c < HD_MAX * KT / 4u; c = c + 8u * NT) {
        let x0 = kv_quad(values, c, kt, col0, kh, last);
        let x1 = kv_quad(values, c + NT, kt, col0, kh, last);
        let x2 = kv_quad(values, c + 2u * NT, kt, col0, kh, last);
        let x3 = kv_quad(values, c + 3u * NT, kt, col0, kh, last);
        let x4 = kv_quad(values, c + 4u * NT, kt, col0, kh, last);
        let x5 = kv_quad(values, c + 5u * NT, kt, col0, kh, last);
        let x6 = kv_quad(values, c + 6u * NT, kt, col0, kh, last);
        let x7 = kv_quad(values, c + 7u * NT, kt, col0, kh, last);
        store_kv(values, c, x0);
        store_kv(values, c + NT, x1);
        store_kv(values, c + 2u * NT, x2);
        store_kv(values, c + 3u * NT, x3);
        store_kv(values, c + 4u * NT, x4);
        store_kv(values, c + 5u * NT, x5);
        store_kv(values, c + 6u * NT, x6);
        store_kv(values, c + 7u * NT, x7);
    }
}

@compute @workgroup_size(NT)
fn attention(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let hd = p.head_dim;
    let h = wid.y;
    // This workgroup's output columns: slice * HD_MAX ...
    let slice = wid.z * HD_MAX;
    let chunked = hd > HD_MAX;
    let kh = h / (p.heads / p.kv_heads);
    let q0 = wid.x * QB;
    wid_q0 = q0;
    let last = min(q0 + QB, p.tokens) - 1u;
    // Sequence starts never decrease, so the first query's start is the block's lowest key;
    // broadcast through shared memory so the key loop (and its barriers) is provably uniform.
    if (lid == 0u) {
        first_key = first_key_of(q0, seq[q0]);
    }
    if (lid < QB) {
        var s = 0u;
        if (q0 + lid < p.tokens) {
            s = first_key_of(q0 + lid, seq[q0 + lid]);
        }
        row_start[lid] = s;
    }
    if (!chunked) {
        stage_q(lid, 0u, q0, h);
    }
    let kmin = workgroupUniformLoad(&first_key);

    // Score block: queries 2 sq, 2 sq + 1; keys 4 sk .. 4 sk + 3 of the tile.
    let sq = lid / 8u;
    let sk = lid % 8u;
    // Output block: queries 4 og ..; head dims 4 od .. and 64 + 4 od ...
    let og = lid / 16u;
    let od = lid % 16u;
    // Softmax state of queries 2 sq, 2 sq + 1: the running maxima, and this thread's parts
    // of the sums. A sink starts the running softmax as a seen logit of weight exp(0) and no
    // value (in the first thread's part).
    var m = vec2<f32>(NEG_BIG);
    var l = vec2<f32>(0.0);
    if (p.has_sinks != 0u) {
        m = vec2<f32>(sinks[h]);
        if (sk == 0u) {
            l = vec2<f32>(1.0);
        }
    }
    let qa = q0 + 2u * sq;
    let start_a = row_start[2u * sq];
    let start_b = row_start[2u * sq + 1u];
    var acc: array<vec4<f32>, 8>;
    for (var kt = kmin; kt <= last; kt = kt + KT) {
        // 1., 2. Scores, a chunk of HD_MAX head values at a time: K^T tile, 4 keys per vec4.
        var s0 = vec4<f32>(0.0);
        var s1 = vec4<f32>(0.0);
        for (var c0 = 0u; c0 < hd; c0 = c0 + HD_MAX) {
            if (chunked) {
                stage_q(lid, c0, q0, h);
            }
            stage_kv(false, lid, kt, c0, kh, last);
            workgroupBarrier();
            for (var d = 0u; d < min(HD_MAX, hd - c0); d = d + 1u) {
                let qv = qs[d * QS + sq];
                let kv4 = kv[d * KS + sk];
                s0 = s0 + qv.x * kv4;
                s1 = s1 + qv.y * kv4;
            }
            // Q^T and K^T are restaged for the next chunk.
            if (chunked) {
                workgroupBarrier();
            }
        }
        // 3. The online softmax over the tile (masked scores NEG_BIG, their P zero).
        var sa = vec4<f32>(NEG_BIG);
        var sb = vec4<f32>(NEG_BIG);
        var seen_a = vec4<bool>(false);
        var seen_b = vec4<bool>(false);
        for (var i = 0u; i < 4u; i = i + 1u) {
            let key = kt + sk * 4u + i;
            seen_a[i] = qa < p.tokens && key >= start_a && key <= qa;
            seen_b[i] = qa + 1u < p.tokens && key >= start_b && key <= qa + 1u;
            if (seen_a[i]) {
                sa[i] = capped(s0[i] * p.scale);
            }
            if (seen_b[i]) {
                sb[i] = capped(s1[i] * p.scale);
            }
        }
        part[lid] = vec2<f32>(max(max(sa.x, sa.y), max(sa.z, sa.w)),
                              max(max(sb.x, sb.y), max(sb.z, sb.w)));
        workgroupBarrier();
        var mx = m;
        for (var i = 0u; i < 8u; i = i + 1u) {
            mx = max(mx, part[sq * 8u + i]);
        }
        let corr = exp(m - mx);
        m = mx;
        l = l * corr;
        for (var i = 0u; i < 4u; i = i + 1u) {
            var pa = 0.0;
            var pb = 0.0;
            if (seen_a[i]) {
                pa = exp(sa[i] - m.x);
            }
            if (seen_b[i]) {
                pb = exp(sb[i] - m.y);
            }
            l = l + vec2<f32>(pa, pb);
            let j = (sk * 4u + i) * (QB / 4u) + sq / 2u;
            st[j][(sq % 2u) * 2u] = pa;
            st[j][(sq % 2u) * 2u + 1u] = pb;
        }
        if (sk == 0u) {
            row_corr[2u * sq] = corr.x;
            row_corr[2u * sq + 1u] = corr.y;
        }
        // Everyone stages V (K is no longer read).
        stage_kv(true, lid, kt, slice, kh, last);
        workgroupBarrier();
        // 4. O = O * corr + P V.
        let cb = og * 4u;
        let corr4 = vec4<f32>(row_corr[cb], row_corr[cb + 1u], row_corr[cb + 2u],
                              row_corr[cb + 3u]);
        acc[0] = acc[0] * corr4.x;
        acc[1] = acc[1] * corr4.x;
        acc[2] = acc[2] * corr4.y;
        acc[3] = acc[3] * corr4.y;
        acc[4] = acc[4] * corr4.z;
        acc[5] = acc[5] * corr4.z;
        acc[6] = acc[6] * corr4.w;
        acc[7] = acc[7] * corr4.w;
        for (var j = 0u; j < KT; j = j + 1u) {
            let pv = st[j * (QB / 4u) + og];
            let v0 = kv[j * (HD_MAX / 4u) + od];
            let v1 = kv[j * (HD_MAX / 4u) + 16u + od];
            acc[0] = acc[0] + pv.x * v0;
            acc[1] = acc[1] + pv.x * v1;
            acc[2] = acc[2] + pv.y * v0;
            acc[3] = acc[3] + pv.y * v1;
            acc[4] = acc[4] + pv.z * v0;
            acc[5] = acc[5] + pv.z * v1;
            acc[6] = acc[6] + pv.w * v0;
            acc[7] = acc[7] + pv.w * v1;
        }
        workgroupBarrier();
    }
    part[lid] = l;
    workgroupBarrier();
    let l0 = row_sum(og * 4u);
    let l1 = row_sum(og * 4u + 1u);
    let l2 = row_sum(og * 4u + 2u);
    let l3 = row_sum(og * 4u + 3u);
    store_o(og * 4u + 0u, slice + 0u * 64u + od * 4u, h, acc[0], l0);
    store_o(og * 4u + 0u, slice + 1u * 64u + od * 4u, h, acc[1], l0);
    store_o(og * 4u + 1u, slice + 0u * 64u + od * 4u, h, acc[2], l1);
    store_o(og * 4u + 1u, slice + 1u * 64u + od * 4u, h, acc[3], l1);
    store_o(og * 4u + 2u, slice + 0u * 64u + od * 4u, h, acc[4], l2);
    store_o(og * 4u + 2u, slice + 1u * 64u + od * 4u, h, acc[5], l2);
    store_o(og * 4u + 3u, slice + 0u * 64u + od * 4u, h, acc[6], l3);
    store_o(og * 4u + 3u, slice + 1u * 64u + od * 4u, h, acc[7], l3);
}
