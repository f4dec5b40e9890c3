// y[m, y_col0 + n] = sum_k x[m, k] W[n, k] (+ bias[bias_row0 + n]) on cooperative matrices
// (16x16x16 f16 products, f32 accumulators), f32-grade: x and W arrive as f16 high and residual
// planes (binding 1 from split_rows.wgsl: rows scaled by powers of two, then each row's
// exponent; binding 4 from the format's lib/weight_planes.wgsl: scaled by the layer's power of
// two `p.w_scale`), and each product sums x_hi w_lo + x_lo w_hi + x_hi w_hi in f32 (x_lo w_lo,
// ~2^-22 of a product, is dropped). Without W_RESIDUAL (the header's; weights of bf16 or f16
// values, whose residuals are zero) the weights' residual plane is neither read nor
// multiplied: two products. Without X_RESIDUAL either (wgpu's one-product mode, `--dtype f16`)
// one product, x_hi w_hi: each operand rounded once to f16's 11 significant bits.
//
// Tiles of 128 tokens x 128 features, 256 invocations = 8 subgroups of 32 (the only subgroup
// size the backend enables this on), each multiplying 64 tokens x 32 features (4 x 2
// accumulators). K steps of 32, or of 64 where only the high planes are staged (the one-product
// mode: twice the products per barrier, 1.35x faster linears on an H200, within the 48 KB of
// workgroup memory NVIDIA's Vulkan driver gives). Staged rows are padded by 8 halves against
// bank conflicts; the next K step's planes are read into registers while this step multiplies.
// Workgroups along x walk the tokens, so those that share a weight tile run together and find
// it in L2.

struct Params {
    m: u32, n: u32, k: u32, ldy: u32,
    y_col0: u32, w_row0: u32, bias_row0: u32, has_bias: u32,
    w_scale: f32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> xp: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<storage, read> bias: array<f32>;
@group(0) @binding(4) var<storage, read> wp: array<vec4<u32>>;

const CM: u32 = 128u;
const CN: u32 = 128u;
// Only the high planes staged: K steps of 64.
const HIGH_ONLY: bool = !X_RESIDUAL && !W_RESIDUAL;
const CK: u32 = select(32u, 64u, HIGH_ONLY);
// Halves per staged row, and the same in vec4<f16> (coopLoad's stride counts the pointer's
// elements).
const LD: u32 = CK + 8u;
const LDV: u32 = LD / 4u;
// Chunks of 8 halves per staged row, and per plane and invocation (2 or 4).
const ROW_CHUNKS: u32 = CK / 8u;
const PLANE_CHUNKS: u32 = CM * ROW_CHUNKS / 256u;

var<workgroup> sxh: array<vec4<f16>, CM * LDV>;
// The residual planes' tiles where staged (a 16-byte stand-in where not).
var<workgroup> sxl: array<vec4<f16>, select(2u, CM * LDV, X_RESIDUAL)>;
var<workgroup> swh: array<vec4<f16>, CN * LDV>;
var<workgroup> swl: array<vec4<f16>, select(2u, CN * LDV, W_RESIDUAL)>;
// One 16 x 16 accumulator per subgroup on its way out (zeros at the start).
var<workgroup> acc_out: array<f32, 2048>;

// 8 halves of a plane, two a word.
alias H8 = vec4<u32>;

// One K step's chunks of each matrix: slot s is chunk t + 256 (s % PLANE_CHUNKS) of plane
// s / PLANE_CHUNKS (high, then residual), PLANE_CHUNKS of each plane staged.
struct Staged {
    x0: H8, x1: H8, x2: H8, x3: H8,
    w0: H8, w1: H8, w2: H8, w3: H8,
}

// Where chunk q (row r0 + q / ROW_CHUNKS, halves k0 + (q % ROW_CHUNKS) * 8 ..) of plane `plane`
// (0 high, 1 residual) of a `rows`-row matrix lies, in 16-byte words; OUTSIDE past the planes.
const OUTSIDE: u32 = 0xffffffffu;

fn chunk_word(r0: u32, k0: u32, q: u32, plane: u32, rows: u32) -> u32 {
    let r = r0 + q / ROW_CHUNKS;
    let c = k0 + (q % ROW_CHUNKS) * 8u;
    let ld = plane_ld(p.k);
    if (r >= rows || c >= ld) {
        return OUTSIDE;
    }
    return (plane * rows * ld + r * ld + c) / 8u;
}

fn fetch_x(r0: u32, k0: u32, t: u32, slot: u32) -> H8 {
    let q = t + 256u * (slot % PLANE_CHUNKS);
    let i = chunk_word(r0, k0, q, slot / PLANE_CHUNKS, p.m);
    if (i == OUTSIDE) { return H8(0u); }
    return xp[i];
}

fn fetch_w(r0: u32, k0: u32, t: u32, slot: u32) -> H8 {
    let q = t + 256u * (slot % PLANE_CHUNKS);
    let i = chunk_word(r0, k0, q, slot / PLANE_CHUNKS, p.n);
    if (i == OUTSIDE) { return H8(0u); }
    return wp[i];
}

// Slots staged of x (of w): PLANE_CHUNKS of each plane staged.
const X_SLOTS: u32 = select(1u, 2u, X_RESIDUAL) * PLANE_CHUNKS;
const W_SLOTS: u32 = select(1u, 2u, W_RESIDUAL) * PLANE_CHUNKS;

fn stage(m0: u32, n0: u32, k0: u32, t: u32) -> Staged {
    var s: Staged;
    s.x0 = fetch_x(m0, k0, t, 0u);
    s.x1 = fetch_x(m0, k0, t, 1u);
    if (X_SLOTS > 2u) {
        s.x2 = fetch_x(m0, k0, t, 2u);
        s.x3 = fetch_x(m0, k0, t, 3u);
    }
    s.w0 = fetch_w(n0, k0, t, 0u);
    s.w1 = fetch_w(n0, k0, t, 1u);
    if (W_SLOTS > 2u) {
        s.w2 = fetch_w(n0, k0, t, 2u);
        s.w3 = fetch_w(n0, k0, t, 3u);
    }
    return s;
}

// The first and last 4 halves of 8 (naga has no bitcast from u32 to f16 pairs; the round trip
// through f32 is exact).
fn lo4(v: H8) -> vec4<f16> {
    return vec4<f16>(vec2<f16>(unpack2x16float(v.x)), vec2<f16>(unpack2x16float(v.y)));
}

fn hi4(v: H8) -> vec4<f16> {
    return vec4<f16>(vec2<f16>(unpack2x16float(v.z)), vec2<f16>(unpack2x16float(v.w)));
}

// Where chunk q's 8 halves go in a staged tile, in vec4<f16>.
fn chunk_at(q: u32) -> u32 {
    return ((q / ROW_CHUNKS) * LD + (q % ROW_CHUNKS) * 8u) / 4u;
}

// Stores slot `slot`'s chunk `v` of w where `weights`, else of x (`weights` and the plane are
// constants where it is called: one pair of stores remains).
fn store_chunk(v: H8, t: u32, slot: u32, weights: bool) {
    let at = chunk_at(t + 256u * (slot % PLANE_CHUNKS));
    let lo = lo4(v);
    let hi = hi4(v);
    let residual = slot >= PLANE_CHUNKS;
    if (weights && residual) {
        swl[at] = lo; swl[at + 1u] = hi;
    } else if (weights) {
        swh[at] = lo; swh[at + 1u] = hi;
    } else if (residual) {
        sxl[at] = lo; sxl[at + 1u] = hi;
    } else {
        sxh[at] = lo; sxh[at + 1u] = hi;
    }
}

fn store_staged(s: Staged, t: u32) {
    store_chunk(s.x0, t, 0u, false);
    store_chunk(s.x1, t, 1u, false);
    if (X_SLOTS > 2u) {
        store_chunk(s.x2, t, 2u, false);
        store_chunk(s.x3, t, 3u, false);
    }
    store_chunk(s.w0, t, 0u, true);
    store_chunk(s.w1, t, 1u, true);
    if (W_SLOTS > 2u) {
        store_chunk(s.w2, t, 2u, true);
        store_chunk(s.w3, t, 3u, true);
    }
}

// Writes subgroup `sg`'s accumulator, just stored row-major in its slot of acc_out, to y
// from row gm0, column gn0 (lane `lane` takes every 32nd value): scaled back by the row's
// and the layer's powers of two, bias added, bounds checked.
fn write_out(sg: u32, lane: u32, gm0: u32, gn0: u32) {
    workgroupBarrier();
    let ld = plane_ld(p.k);
    for (var v = 0u; v < 8u; v = v + 1u) {
        let i = lane + 32u * v;
        let gm = gm0 + i / 16u;
        let gn = gn0 + i % 16u;
        if (gm < p.m && gn < p.n) {
            // The row's exponent: the first half of its word after both planes.
            let f = p.m * ld + gm;
            let e = i32(unpack2x16float(xp[f / 4u][f % 4u]).x);
            var o = acc_out[sg * 256u + i] * (ldexp(1.0, e) / p.w_scale);
            if (p.has_bias != 0u) {
                o = o + bias[p.bias_row0 + gn];
            }
            if (e == BAD_ROW) {
                o = bitcast<f32>(0x7fc00000u);  // NaN, as the f32 product of a NaN or inf
            }
            y[gm * p.ldy + p.y_col0 + gn] = o;
        }
    }
    workgroupBarrier();
}

@compute @workgroup_size(256)
fn split_gemm(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) t: u32) {
    let m0 = wid.x * CM;
    let n0 = wid.y * CN;
    let sg = t / 32u;
    let lane = t % 32u;
    let sm = (sg / 4u) * 64u;
    let sn = (sg % 4u) * 32u;
    // acc_out is zero here (workgroup memory starts zeroed): the accumulators' zeros.
    var c00 = coopLoadT<coop_mat16x16<f32, C>>(&acc_out[0], 16u);
    var c01 = c00;
    var c10 = c00;
    var c11 = c00;
    var c20 = c00;
    var c21 = c00;
    var c30 = c00;
    var c31 = c00;
    var staged = stage(m0, n0, 0u, t);
    store_staged(staged, t);
    workgroupBarrier();
    for (var k0 = 0u; k0 < p.k; k0 = k0 + CK) {
        let k1 = k0 + CK;
        if (k1 < p.k) {
            staged = stage(m0, n0, k1, t);
        }
        for (var kk = 0u; kk < CK; kk = kk + 16u) {
            let ah0 = coopLoadT<coop_mat16x16<f16, A>>(&sxh[(sm * LD + kk) / 4u], LDV);
            let ah1 = coopLoadT<coop_mat16x16<f16, A>>(&sxh[((sm + 16u) * LD + kk) / 4u], LDV);
            let ah2 = coopLoadT<coop_mat16x16<f16, A>>(&sxh[((sm + 32u) * LD + kk) / 4u], LDV);
            let ah3 = coopLoadT<coop_mat16x16<f16, A>>(&sxh[((sm + 48u) * LD + kk) / 4u], LDV);
            let bh0 = coopLoad<coop_mat16x16<f16, B>>(&swh[(sn * LD + kk) / 4u], LDV);
            let bh1 = coopLoad<coop_mat16x16<f16, B>>(&swh[((sn + 16u) * LD + kk) / 4u], LDV);
            if (W_RESIDUAL) {
                let bl0 = coopLoad<coop_mat16x16<f16, B>>(&swl[(sn * LD + kk) / 4u], LDV);
                let bl1 = coopLoad<coop_mat16x16<f16, B>>(&swl[((sn + 16u) * LD + kk) / 4u], LDV);
                c00 = coopMultiplyAdd(ah0, bl0, c00);
                c01 = coopMultiplyAdd(ah0, bl1, c01);
                c10 = coopMultiplyAdd(ah1, bl0, c10);
                c11 = coopMultiplyAdd(ah1, bl1, c11);
                c20 = coopMultiplyAdd(ah2, bl0, c20);
                c21 = coopMultiplyAdd(ah2, bl1, c21);
                c30 = coopMultiplyAdd(ah3, bl0, c30);
                c31 = coopMultiplyAdd(ah3, bl1, c31);
            }
            // Each accumulator sums its products in the same order in every module.
            if (X_RESIDUAL) {
                let al0 = coopLoadT<coop_mat16x16<f16, A>>(&sxl[(sm * LD + kk) / 4u], LDV);
                let al1 = coopLoadT<coop_mat16x16<f16, A>>(&sxl[((sm + 16u) * LD + kk) / 4u], LDV);
                let al2 = coopLoadT<coop_mat16x16<f16, A>>(&sxl[((sm + 32u) * LD + kk) / 4u], LDV);
                let al3 = coopLoadT<coop_mat16x16<f16, A>>(&sxl[((sm + 48u) * LD + kk) / 4u], LDV);
                c00 = coopMultiplyAdd(al0, bh0, c00);
                c01 = coopMultiplyAdd(al0, bh1, c01);
                c10 = coopMultiplyAdd(al1, bh0, c10);
                c11 = coopMultiplyAdd(al1, bh1, c11);
                c20 = coopMultiplyAdd(al2, bh0, c20);
                c21 = coopMultiplyAdd(al2, bh1, c21);
                c30 = coopMultiplyAdd(al3, bh0, c30);
                c31 = coopMultiplyAdd(al3, bh1, c31);
            }
            c00 = coopMultiplyAdd(ah0, bh0, c00);
            c01 = coopMultiplyAdd(ah0, bh1, c01);
            c10 = coopMultiplyAdd(ah1, bh0, c10);
            c11 = coopMultiplyAdd(ah1, bh1, c11);
            c20 = coopMultiplyAdd(ah2, bh0, c20);
            c21 = coopMultiplyAdd(ah2, bh1, c21);
            c30 = coopMultiplyAdd(ah3, bh0, c30);
            c31 = coopMultiplyAdd(ah3, bh1, c31);
        }
        workgroupBarrier();
        if (k1 < p.k) {
            store_staged(staged, t);
        }
        workgroupBarrier();
    }
    let gm = m0 + sm;
    let gn = n0 + sn;
    coopStoreT(c00, &acc_out[sg * 256u], 16u);
    write_out(sg, lane, gm, gn);
    coopStoreT(c01, &acc_out[sg * 256u], 16u);
    write_out(sg, lane, gm, gn + 16u);
    coopStoreT(c10, &acc_out[sg * 256u], 16u);
    write_out(sg, lane, gm + 16u, gn);
    coopStoreT(c11, &acc_out[sg * 256u], 16u);
    write_out(sg, lane, gm + 16u, gn + 16u);
    coopStoreT(c20, &acc_out[sg * 256u], 16u);
    write_out(sg, lane, gm + 32u, gn);
    coopStoreT(c21, &acc_out[sg * 256u], 16u);
    write_out(sg, lane, gm + 32u, gn + 16u);
    coopStoreT(c30, &acc_out[sg * 256u], 16u);
    write_out(sg, lane, gm + 48u, gn);
    coopStoreT(c31, &acc_out[sg * 256u], 16u);
    write_out(sg, lane, gm + 48u, gn + 16u);
}
