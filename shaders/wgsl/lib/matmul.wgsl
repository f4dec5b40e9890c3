// The tiled body shared by every dequantizing matmul in f32: y[m, y_col0 + n] =
// sum_k x[m, k] W[w_row0 + n, k] (+ bias[bias_row0 + n]), over the format file's weight
// functions (lib/weights.wgsl).
//
// Workgroup of MM_TX x MM_TY threads (the TileConfig header), each computing an 8x8 block of
// the (8 MM_TY tokens) x (8 MM_TX features) output tile as four 4x4 quarters half a tile apart
// (conflict-free vec4 reads of shared memory), f32 accumulation. Per K step of MM_BK input
// features: the activations are staged transposed [k][m] and the weights decoded once per
// workgroup into [k][n], both padded by one vec4 per row against bank conflicts.

const NT: u32 = MM_TX * MM_TY;
const BM: u32 = 8u * MM_TY;
const BN: u32 = 8u * MM_TX;
const BK: u32 = MM_BK;
// vec4s per shared row of the x and weight tiles (one of padding).
const XS: u32 = BM / 4u + 1u;
const WS: u32 = BN / 4u + 1u;
// Per thread and K step: 4-token activation columns, and 8-weight chunks.
const XE: u32 = BM * BK / 4u / NT;
const WE: u32 = BN * BK / 8u / NT;

@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<storage, read> bias: array<f32>;

var<workgroup> xs: array<vec4<f32>, BK * XS>;
var<workgroup> ws: array<vec4<f32>, BK * WS>;

// Loads of one K step held in registers between the global reads and the shared stores. Every
// register array is indexed by constants only (a loop index would put it in local memory on
// drivers that do not unroll), hence the unrolled slots: XE <= 4, WE <= 2 (TileConfig::check).
struct Staged {
    x0: vec4<f32>, x1: vec4<f32>, x2: vec4<f32>, x3: vec4<f32>,
    w0: WRaw, w1: WRaw,
}

fn stage_x(m0: u32, k0: u32, c: u32) -> vec4<f32> {
    let gk = k0 + c % BK;
    let r = m0 + (c / BK) * 4u;
    var v = vec4<f32>(0.0);
    if (gk < p.k) {
        if (r < p.m) { v.x = x[r * p.k + gk]; }
        if (r + 1u < p.m) { v.y = x[(r + 1u) * p.k + gk]; }
        if (r + 2u < p.m) { v.z = x[(r + 2u) * p.k + gk]; }
        if (r + 3u < p.m) { v.w = x[(r + 3u) * p.k + gk]; }
    }
    return v;
}

fn stage_w(n0: u32, k0: u32, c: u32) -> WRaw {
    let n = n0 + c % BN;
    let c8 = k0 / 8u + c / BN;
    if (n < p.n && c8 * 8u + 8u <= p.k) {
        return w_fetch(p.w_row0 + n, c8);
    }
    return WRaw(vec4<u32>(0u), vec4<u32>(0u));
}

fn stage(m0: u32, n0: u32, k0: u32, lid: u32) -> Staged {
    var s: Staged;
    s.x0 = stage_x(m0, k0, lid);
    if (XE > 1u) { s.x1 = stage_x(m0, k0, lid + NT); }
    if (XE > 2u) { s.x2 = stage_x(m0, k0, lid + 2u * NT); }
    if (XE > 3u) { s.x3 = stage_x(m0, k0, lid + 3u * NT); }
    s.w0 = stage_w(n0, k0, lid);
    if (WE > 1u) { s.w1 = stage_w(n0, k0, lid + NT); }
    return s;
}

fn store_x(v: vec4<f32>, c: u32) {
    xs[(c % BK) * XS + c / BK] = v;
}

fn store_w(r: WRaw, n0: u32, k0: u32, c: u32) {
    let nl = c % BN;
    let n = n0 + nl;
    let j = c / BN;
    let c8 = k0 / 8u + j;
    var w = W8(vec4<f32>(0.0), vec4<f32>(0.0));
    if (n < p.n) {
        let row = p.w_row0 + n;
        if (c8 * 8u + 8u <= p.k) {
            w = w_decode(r, row, c8);
        } else {
            w = load_w8(row, c8);  // the last, partial chunk of a row
        }
    }
    let base = j * 8u * WS + nl / 4u;
    let lane = nl % 4u;
    ws[base][lane] = w.lo.x;
    ws[base + WS][lane] = w.lo.y;
    ws[base + 2u * WS][lane] = w.lo.z;
    ws[base + 3u * WS][lane] = w.lo.w;
    ws[base + 4u * WS][lane] = w.hi.x;
    ws[base + 5u * WS][lane] = w.hi.y;
    ws[base + 6u * WS][lane] = w.hi.z;
    ws[base + 7u * WS][lane] = w.hi.w;
}

fn store_staged(s: Staged, n0: u32, k0: u32, lid: u32) {
    store_x(s.x0, lid);
    if (XE > 1u) { store_x(s.x1, lid + NT); }
    if (XE > 2u) { store_x(s.x2, lid + 2u * NT); }
    if (XE > 3u) { store_x(s.x3, lid + 3u * NT); }
    store_w(s.w0, n0, k0, lid);
    if (WE > 1u) { store_w(s.w1, n0, k0, lid + NT); }
}

// Writes 4 consecutive outputs of row gm from column gn (bias added, bounds checked).
fn store_y(gm: u32, gn: u32, v: vec4<f32>) {
    if (gm >= p.m) {
        return;
    }
    for (var c = 0u; c < 4u; c = c + 1u) {
        if (gn + c < p.n) {
            var o = v[c];
            if (p.has_bias != 0u) {
                o = o + bias[p.bias_row0 + gn + c];
            }
            y[gm * p.ldy + p.y_col0 + gn + c] = o;
        }
    }
}

fn tile_main(wid: vec3<u32>, lid: u32) {
    let n0 = wid.x * BN;
    let m0 = wid.y * BM;
    let tx = lid % MM_TX;
    let ty = lid / MM_TX;
    // acc[(ci * 4 + r) * 2 + cj]: token ci * BM / 2 + 4 ty + r, features cj * BN / 2 + 4 tx ..
    var acc: array<vec4<f32>, 16>;
    var staged = stage(m0, n0, 0u, lid);
    for (var k0 = 0u; k0 < p.k; k0 = k0 + BK) {
        store_staged(staged, n0, k0, lid);
        workgroupBarrier();
        if (k0 + BK < p.k) {
            staged = stage(m0, n0, k0 + BK, lid);
        }
        // With MM_PER_STEP_SUM each K step is summed on its own, then added to the total
        // (pipelines.rs MatmulSum::PerStep); otherwise `part` starts from the total and is
        // the running sum (the compiler folds the copies away).
        var part: array<vec4<f32>, 16>;
        if (!MM_PER_STEP_SUM) {
            part = acc;
        }
        for (var kk = 0u; kk < BK; kk = kk + 1u) {
            let a0 = xs[kk * XS + ty];
            let a1 = xs[kk * XS + MM_TY + ty];
            let b0 = ws[kk * WS + tx];
            let b1 = ws[kk * WS + MM_TX + tx];
            part[0] = part[0] + a0.x * b0;
            part[1] = part[1] + a0.x * b1;
            part[2] = part[2] + a0.y * b0;
            part[3] = part[3] + a0.y * b1;
            part[4] = part[4] + a0.z * b0;
            part[5] = part[5] + a0.z * b1;
            part[6] = part[6] + a0.w * b0;
            part[7] = part[7] + a0.w * b1;
            part[8] = part[8] + a1.x * b0;
            part[9] = part[9] + a1.x * b1;
            part[10] = part[10] + a1.y * b0;
            part[11] = part[11] + a1.y * b1;
            part[12] = part[12] + a1.z * b0;
            part[13] = part[13] + a1.z * b1;
            part[14] = part[14] + a1.w * b0;
            part[15] = part[15] + a1.w * b1;
        }
        if (!MM_PER_STEP_SUM) {
            acc = part;
        } else {
            acc[0] = acc[0] + part[0];
            acc[1] = acc[1] + part[1];
            acc[2] = acc[2] + part[2];
            acc[3] = acc[3] + part[3];
            acc[4] = acc[4] + part[4];
            acc[5] = acc[5] + part[5];
            acc[6] = acc[6] + part[6];
            acc[7] = acc[7] + part[7];
            acc[8] = acc[8] + part[8];
            acc[9] = acc[9] + part[9];
            acc[10] = acc[10] + part[10];
            acc[11] = acc[11] + part[11];
            acc[12] = acc[12] + part[12];
            acc[13] = acc[13] + part[13];
            acc[14] = acc[14] + part[14];
            acc[15] = acc[15] + part[15];
        }
        workgroupBarrier();
    }
    let r0 = m0 + ty * 4u;
    let r1 = r0 + BM / 2u;
    let c0 = n0 + tx * 4u;
    let c1 = c0 + BN / 2u;
    store_y(r0 + 0u, c0, acc[0]);
    store_y(r0 + 0u, c1, acc[1]);
    store_y(r0 + 1u, c0, acc[2]);
    store_y(r0 + 1u, c1, acc[3]);
    store_y(r0 + 2u, c0, acc[4]);
    store_y(r0 + 2u, c1, acc[5]);
    store_y(r0 + 3u, c0, acc[6]);
    store_y(r0 + 3u, c1, acc[7]);
    store_y(r1 + 0u, c0, acc[8]);
    store_y(r1 + 0u, c1, acc[9]);
    store_y(r1 + 1u, c0, acc[10]);
    store_y(r1 + 1u, c1, acc[11]);
    store_y(r1 + 2u, c0, acc[12]);
    store_y(r1 + 2u, c1, acc[13]);
    store_y(r1 + 3u, c0, acc[14]);
    store_y(r1 + 3u, c1, acc[15]);
}
