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
// Tiles of 128 tokens x 128 features, K steps of 32, 256 invocations = 8 subgroups of 32 (the
// only subgroup size the backend enables this on), each multiplying 64 tokens x 32 features
// (4 x 2 accumulators). Staged rows are padded by 8 halves against bank conflicts; the next K
// step's planes are read into registers while this step multiplies. Workgroups along x walk the
// tokens, so those that share a weight tile run together and find it in L2.

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
const CK: u32 = 32u;
// Halves per staged row, and the same in vec4<f16> (coopLoad's stride counts the pointer's
// elements).
const LD: u32 = 40u;
const LDV: u32 = 10u;

var<workgroup> sxh: array<vec4<f16>, 1280>;  // CM * LDV
var<workgroup> sxl: array<vec4<f16>, 1280>;
var<workgroup> swh: array<vec4<f16>, 1280>;  // CN * LDV
var<workgroup> swl: array<vec4<f16>, 1280>;
// One 16 x 16 accumulator per subgroup on its way out (zeros at the start).
var<workgroup> acc_out: array<f32, 2048>;

// 8 halves of a plane, two a word.
alias H8 = vec4<u32>;

// One K step's planes: 2 chunks of 8 halves of each plane.
struct Staged {
    xh0: H8, xh1: H8,
    xl0: H8, xl1: H8,
    wh0: H8, wh1: H8,
    wl0: H8, wl1: H8,
}

// Where chunk q (row r0 + q / 4, halves k0 + (q % 4) * 8 ..) of plane `plane` (0 high,
// 1 residual) of a `rows`-row matrix lies, in 16-byte words; OUTSIDE past the planes.
const OUTSIDE: u32 = 0xffffffffu;

fn chunk_word(r0: u32, k0: u32, q: u32, plane: u32, rows: u32) -> u32 {
    let r = r0 + q / 4u;
    let c = k0 + (q % 4u) * 8u;
    let ld = plane_ld(p.k);
    if (r >= rows || c >= ld) {
        return OUTSIDE;
    }
    return (plane * rows * ld + r * ld + c) / 8u;
}

fn fetch_x(r0: u32, k0: u32, q: u32, plane: u32) -> H8 {
    let i = chunk_word(r0, k0, q, plane, p.m);
    if (i == OUTSIDE) { return H8(0u); }
    return xp[i];
}

fn fetch_w(r0: u32, k0: u32, q: u32, plane: u32) -> H8 {
    let i = chunk_word(r0, k0, q, plane, p.n);
    if (i == OUTSIDE) { return H8(0u); }
    return wp[i];
}

fn stage(m0: u32, n0: u32, k0: u32, t: u32) -> Staged {
    var s: Staged;
    s.xh0 = fetch_x(m0, k0, t, 0u);
    s.xh1 = fetch_x(m0, k0, t + 256u, 0u);
    if (X_RESIDUAL) {
        s.xl0 = fetch_x(m0, k0, t, 1u);
        s.xl1 = fetch_x(m0, k0, t + 256u, 1u);
    }
    s.wh0 = fetch_w(n0, k0, t, 0u);
    s.wh1 = fetch_w(n0, k0, t + 256u, 0u);
    if (W_RESIDUAL) {
        s.wl0 = fetch_w(n0, k0, t, 1u);
        s.wl1 = fetch_w(n0, k0, t + 256u, 1u);
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
    return ((q / 4u) * LD + (q % 4u) * 8u) / 4u;
}

fn store_staged(s: Staged, t: u32) {
    let x0 = chunk_at(t);
    let x1 = chunk_at(t + 256u);
    sxh[x0] = lo4(s.xh0); sxh[x0 + 1u] = hi4(s.xh0);
    sxh[x1] = lo4(s.xh1); sxh[x1 + 1u] = hi4(s.xh1);
    if (X_RESIDUAL) {
        sxl[x0] = lo4(s.xl0); sxl[x0 + 1u] = hi4(s.xl0);
        sxl[x1] = lo4(s.xl1); sxl[x1 + 1u] = hi4(s.xl1);
    }
    swh[x0] = lo4(s.wh0); swh[x0 + 1u] = hi4(s.wh0);
    swh[x1] = lo4(s.wh1); swh[x1 + 1u] = hi4(s.wh1);
    if (W_RESIDUAL) {
        swl[x0] = lo4(s.wl0); swl[x0 + 1u] = hi4(s.wl0);
        swl[x1] = lo4(s.wl1); swl[x1 + 1u] = hi4(s.wl1);
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
