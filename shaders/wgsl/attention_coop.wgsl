// attention.wgsl's causal grouped-query attention (sliding window, soft cap, sinks) on
// cooperative matrices, for wgpu's one-product mode: q, k and v arrive as split_rows.wgsl's
// high planes, each (token, head) row scaled by its power of two and rounded to f16 (its
// exponent after the planes; PAD rows of zeros after the last token, so a tile that runs past
// it reads zeros), and both products, the scores Q K^T and the weighted values P V, are
// 16x16x16 f16 products summed in f32; the online softmax between them is f32.
//
// A workgroup of 4 subgroups of 32 takes QB queries of one head and walks the key tiles of KT
// from its first query's first key to its last query. Per tile:
//   1. S = Q K^T: subgroup g the tile's keys 16 g .. 16 g + 15 for both halves of the queries,
//      stored to `scratch` as 16 x 16 blocks; invocations 0 .. KT - 1 stage the keys' and the
//      values' row exponents.
//   2. Softmax, four invocations a query (key pairs 2 part, 2 part + 8, ...: each writes
//      whole 32-bit words of P, no two invocations halves of one word): the running maximum
//      and E, the largest exponent of the value rows this query sees in the tile, across the
//      four; p = exp(s - max) summed in f32 (each of the four its own part of the sum), P =
//      p 2^(e_v - E) <= 1 rounded to f16 into `ps`: the values' row scales move into P, and
//      E out of the product. E is the query's own, so a query whose values are far smaller
//      than another's of the block keeps P's bits.
//   3. P V: subgroup g the head-dim tiles g, g + 4, ... (the last repeated where a subgroup
//      has fewer: cooperative operations must run in uniform control flow), into `scratch` as
//      16 x 16 blocks.
//   4. O = O corr + (P V) 2^E, each invocation its query's columns part, part + 4, ... in
//      registers.
// Accumulators are stored as whole 16 x 16 blocks (stride 16), as split_gemm.wgsl stores
// them: the layout known to work on NVIDIA's driver. Every workgroup variable is a whole
// number of 16-byte words, so that wherever the driver places them the cooperative loads' and
// stores' arrays start 16-byte aligned: NVIDIA's (580.159) shifts those of a misaligned array
// by the misalignment (naga_checks holds every cooperative module to it).

const QB: u32 = 32u;
const KT: u32 = 64u;
const NT: u32 = 128u;
// Rows of zeros after the last token's (attention_coop.rs's PAD_TOKENS): the last key tile
// starts at most KT - 1 keys before the last token.
const PAD: u32 = 64u;
// The largest head_dim (head-dim columns per invocation: HD_COOP / 4).
const HD_COOP: u32 = 128u;
// Half pairs per staged row of P (64 keys and 8 against bank conflicts).
const PLD: u32 = 36u;
// An exponent below any row's: "no row yet".
const NO_ROW: i32 = -1000i;

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> qp: array<f16>;
@group(0) @binding(2) var<storage, read> kp: array<f16>;
@group(0) @binding(3) var<storage, read> vp: array<f16>;
// [sequence start of each token | position of each token], see WgpuLayout.
@group(0) @binding(4) var<storage, read> seq: array<u32>;
// One logit per head in every softmax's denominator where has_sinks (gpt-oss).
@group(0) @binding(5) var<storage, read> sinks: array<f32>;
@group(0) @binding(6) var<storage, read_write> out: array<f32>;

// Scores, then P V, as 16 x 16 blocks (`block_at`); zeros at the start (the accumulators'
// zero).
var<workgroup> scratch: array<f32, 4096>;
var<workgroup> ps: array<vec2<f16>, 1152>;
var<workgroup> red: array<f32, NT>;
var<workgroup> red_e: array<i32, NT>;
var<workgroup> key_e: array<i32, KT>;
var<workgroup> val_e: array<i32, KT>;
// The block's first key (the first of four).
var<workgroup> first_key: array<u32, 4>;

// Key i (0 .. 15) of a tile that invocation `part` of a query takes: pairs 2 part,
// 2 part + 8, ...
fn key_of(part: u32, i: u32) -> u32 {
    return 2u * part + 8u * (i / 2u) + i % 2u;
}

// Where element (row, col) of a matrix of 16 x 16 blocks, `blocks` of them a block row, lies.
fn block_at(row: u32, col: u32, blocks: u32) -> u32 {
    return ((row / 16u) * blocks + col / 16u) * 256u + (row % 16u) * 16u + col % 16u;
}

@compute @workgroup_size(NT)
fn attention_coop(@builtin(workgroup_id) wid: vec3<u32>,
                  @builtin(local_invocation_index) t: u32) {
    let hd = p.head_dim;
    let h = wid.y;
    let kh = h / (p.heads / p.kv_heads);
    let q0 = wid.x * QB;
    let last = min(q0 + QB, p.tokens) - 1u;
    let q_ld = p.heads * hd;
    let kv_ld = p.kv_heads * hd;
    // Where each plane's row exponents start, in halves (split_rows.wgsl: an f16 integer in the
    // first half of a word a row, after both planes).
    let q_exps = 2u * (p.tokens + PAD) * q_ld;
    let kv_exps = 2u * (p.tokens + PAD) * kv_ld;
    let sg = t / 32u;
    // This invocation's query (row of the tile) and its share of keys and columns.
    let r = t / 4u;
    let part = t % 4u;
    let tq = q0 + r;
    let live = tq < p.tokens;
    var start = 0u;
    var eq = 0i;
    if (live) {
        start = first_key_of(tq, seq[tq]);
        eq = i32(qp[q_exps + 2u * (tq * p.heads + h)]);
    }
    // Sequence starts never decrease: the first query's first key is the block's lowest.
    if (t == 0u) {
        first_key[0] = first_key_of(q0, seq[q0]);
    }
    let zero = coopLoadT<coop_mat16x16<f32, C>>(&scratch[0], 16u);
    // (A barrier: nothing writes `scratch` before every subgroup has its zero.)
    let kmin = workgroupUniformLoad(&first_key[0]);

    // A sink starts the running softmax as a seen logit of weight exp(0) and no value.
    var m = NEG_BIG;
    var l = 0.0;
    if (p.has_sinks != 0u) {
        m = sinks[h];
        if (part == 0u) {
            l = 1.0;
        }
    }
    var o: array<f32, HD_COOP / 4u>;
    let d_tiles = hd / 16u;
    let rounds = (d_tiles + 3u) / 4u;
    for (var kt = kmin; kt <= last; kt = kt + KT) {
        // 1. Scores of keys kt + 16 sg .., and the tile's exponents.
        var s0 = zero;
        var s1 = zero;
        let k_row = ((kt + 16u * sg) * p.kv_heads + kh) * hd;
        let q_row = (q0 * p.heads + h) * hd;
        for (var d0 = 0u; d0 < hd; d0 = d0 + 16u) {
            let b = coopLoad<coop_mat16x16<f16, B>>(&kp[k_row + d0], kv_ld);
            let a0 = coopLoadT<coop_mat16x16<f16, A>>(&qp[q_row + d0], q_ld);
            let a1 = coopLoadT<coop_mat16x16<f16, A>>(&qp[q_row + 16u * q_ld + d0], q_ld);
            s0 = coopMultiplyAdd(a0, b, s0);
            s1 = coopMultiplyAdd(a1, b, s1);
        }
        coopStoreT(s0, &scratch[block_at(0u, 16u * sg, KT / 16u)], 16u);
        coopStoreT(s1, &scratch[block_at(16u, 16u * sg, KT / 16u)], 16u);
        if (t < KT) {
            let key = kt + t;
            var ek = 0i;
            var ev = NO_ROW;
            if (key <= last) {
                let at = 2u * (key * p.kv_heads + kh);
                ek = i32(kp[kv_exps + at]);
                ev = i32(vp[kv_exps + at]);
            }
            key_e[t] = ek;
            val_e[t] = ev;
        }
        workgroupBarrier();

        // 2. Softmax.
        var s: array<f32, 16>;
        var mx = m;
        var e_seen = NO_ROW;
        for (var i = 0u; i < 16u; i = i + 1u) {
            let j = key_of(part, i);
            let key = kt + j;
            s[i] = NEG_BIG;
            if (live && key >= start && key <= tq) {
                let ek = key_e[j];
                if (eq == BAD_ROW || ek == BAD_ROW) {
                    s[i] = bitcast<f32>(0x7fc00000u);
                } else {
                    let raw = scratch[block_at(r, j, KT / 16u)];
                    s[i] = capped(ldexp(ldexp(raw * p.scale, eq), ek));
                }
                mx = max(mx, s[i]);
                if (val_e[j] != BAD_ROW) {
                    e_seen = max(e_seen, val_e[j]);
                }
            }
        }
        red[t] = mx;
        red_e[t] = e_seen;
        workgroupBarrier();
        let q4 = t - part;
        mx = max(max(red[q4], red[q4 + 1u]), max(red[q4 + 2u], red[q4 + 3u]));
        let e_query = max(max(red_e[q4], red_e[q4 + 1u]), max(red_e[q4 + 2u], red_e[q4 + 3u]));
        let corr = exp(m - mx);
        l = l * corr;
        m = mx;
        for (var i = 0u; i < 16u; i = i + 2u) {
            var pw = vec2<f32>(0.0);
            for (var b = 0u; b < 2u; b = b + 1u) {
                let j = key_of(part, i + b);
                let key = kt + j;
                if (live && key >= start && key <= tq) {
                    let pj = exp(s[i + b] - m);
                    l = l + pj;
                    let ev = val_e[j];
                    pw[b] = ldexp(pj, max(ev - e_query, -127i));
                    if (ev == BAD_ROW) {
                        pw[b] = bitcast<f32>(0x7fc00000u);
                    }
                }
            }
            // Rounded to nearest (f16_high), then exactly an f16 (below 2^-14 it may round
            // again: a weight under 2^-14 of the largest).
            let pair = vec2<f16>(f16(f16_high(pw.x)), f16(f16_high(pw.y)));
            ps[r * PLD + key_of(part, i) / 2u] = pair;
        }
        workgroupBarrier();

        // 3. P V.
        let v_row = (kt * p.kv_heads + kh) * hd;
        for (var round = 0u; round < rounds; round = round + 1u) {
            let dt = min(sg + 4u * round, d_tiles - 1u);
            var c0 = zero;
            var c1 = zero;
            for (var k0 = 0u; k0 < KT; k0 = k0 + 16u) {
                let b = coopLoadT<coop_mat16x16<f16, B>>(&vp[v_row + k0 * kv_ld + 16u * dt], kv_ld);
                let a0 = coopLoadT<coop_mat16x16<f16, A>>(&ps[k0 / 2u], PLD);
                let a1 = coopLoadT<coop_mat16x16<f16, A>>(&ps[16u * PLD + k0 / 2u], PLD);
                c0 = coopMultiplyAdd(a0, b, c0);
                c1 = coopMultiplyAdd(a1, b, c1);
            }
            coopStoreT(c0, &scratch[block_at(0u, 16u * dt, d_tiles)], 16u);
            coopStoreT(c1, &scratch[block_at(16u, 16u * dt, d_tiles)], 16u);
        }
        workgroupBarrier();

        // 4. O = O corr + (P V) 2^E.
        let back = select(ldexp(1.0, e_query), 0.0, e_query == NO_ROW);
        for (var i = 0u; i < HD_COOP / 4u; i = i + 1u) {
            let c = part + 4u * i;
            if (c < hd) {
                o[i] = o[i] * corr + scratch[block_at(r, c, d_tiles)] * back;
            }
        }
        workgroupBarrier();
    }
    red[t] = l;
    workgroupBarrier();
    if (live) {
        let q4 = t - part;
        let total = red[q4] + red[q4 + 1u] + red[q4 + 2u] + red[q4 + 3u];
        for (var i = 0u; i < HD_COOP / 4u; i = i + 1u) {
            let c = part + 4u * i;
            if (c < hd) {
                out[tq * q_ld + h * hd + c] = o[i] / total;
            }
        }
    }
}
