// The tiled body shared by every dequantizing matmul: y[m, y_col0 + n] = sum_k x[m, k] W[w_row0 + n, k]
// (+ bias[bias_row0 + n]). Each kernel file declares `p` (its Params, starting with the fields
// used here) and three functions over its weight:
//   load_w(row, col)            the exact reference dequantization of one weight;
//   w_fetch(row, c8) -> WRaw    the raw words behind weights (row, 8 c8 .. 8 c8 + 7), loads only;
//   w_decode(raw, row, c8) -> W8  those 8 weights, decoded exactly as load_w would.
// The split lets the next K step's words be in flight while the current one is multiplied.
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

// Raw words of 8 consecutive weights of a row, as each format's w_fetch fills them.
struct WRaw {
    a: vec4<u32>,
    b: vec4<u32>,
}

// 8 decoded weights, in column order.
struct W8 {
    lo: vec4<f32>,
    hi: vec4<f32>,
}

// Loads of one K step held in registers between the global reads and the shared stores.
struct Staged {
    xv: array<vec4<f32>, XE>,
    wr: array<WRaw, WE>,
}

fn stage(m0: u32, n0: u32, k0: u32, lid: u32) -> Staged {
    var s: Staged;
    for (var e = 0u; e < XE; e = e + 1u) {
        let c = lid + e * NT;
        let gk = k0 + c % BK;
        let r = m0 + (c / BK) * 4u;
        var v = vec4<f32>(0.0);
        if (gk < p.k) {
            for (var i = 0u; i < 4u; i = i + 1u) {
                if (r + i < p.m) {
                    v[i] = x[(r + i) * p.k + gk];
                }
            }
        }
        s.xv[e] = v;
    }
    for (var e = 0u; e < WE; e = e + 1u) {
        let c = lid + e * NT;
        let n = n0 + c % BN;
        let c8 = k0 / 8u + c / BN;
        if (n < p.n && c8 * 8u + 8u <= p.k) {
            s.wr[e] = w_fetch(p.w_row0 + n, c8);
        }
    }
    return s;
}

fn store_staged(s: Staged, n0: u32, k0: u32, lid: u32) {
    for (var e = 0u; e < XE; e = e + 1u) {
        let c = lid + e * NT;
        xs[(c % BK) * XS + c / BK] = s.xv[e];
    }
    for (var e = 0u; e < WE; e = e + 1u) {
        let c = lid + e * NT;
        let nl = c % BN;
        let n = n0 + nl;
        let j = c / BN;
        let c8 = k0 / 8u + j;
        var w = W8(vec4<f32>(0.0), vec4<f32>(0.0));
        if (n < p.n) {
            let row = p.w_row0 + n;
            if (c8 * 8u + 8u <= p.k) {
                w = w_decode(s.wr[e], row, c8);
            } else {
                // The last, partial chunk of a row.
                for (var i = 0u; i < 4u; i = i + 1u) {
                    if (c8 * 8u + i < p.k) {
                        w.lo[i] = load_w(row, c8 * 8u + i);
                    }
                    if (c8 * 8u + 4u + i < p.k) {
                        w.hi[i] = load_w(row, c8 * 8u + 4u + i);
                    }
                }
            }
        }
        let base = j * 8u * WS + nl / 4u;
        let lane = nl % 4u;
        for (var i = 0u; i < 4u; i = i + 1u) {
            ws[base + i * WS][lane] = w.lo[i];
            ws[base + (4u + i) * WS][lane] = w.hi[i];
        }
    }
}

fn matmul_tile(wid: vec3<u32>, lid: u32) {
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
        // Two-level sum: each K step is summed on its own, then added to the total, so the
        // rounding error grows with K / BK + BK rather than K (closer to the f64 reference,
        // which matters where activation fake-quant turns tiny differences into flips).
        var part: array<vec4<f32>, 16>;
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
        for (var i = 0u; i < 16u; i = i + 1u) {
            acc[i] = acc[i] + part[i];
        }
        workgroupBarrier();
    }
    for (var ci = 0u; ci < 2u; ci = ci + 1u) {
        for (var r = 0u; r < 4u; r = r + 1u) {
            let gm = m0 + ci * (BM / 2u) + ty * 4u + r;
            if (gm >= p.m) {
                continue;
            }
            for (var cj = 0u; cj < 2u; cj = cj + 1u) {
                let v4 = acc[(ci * 4u + r) * 2u + cj];
                for (var c = 0u; c < 4u; c = c + 1u) {
                    let gn = n0 + cj * (BN / 2u) + tx * 4u + c;
                    if (gn < p.n) {
                        var v = v4[c];
                        if (p.has_bias != 0u) {
                            v = v + bias[p.bias_row0 + gn];
                        }
                        y[gm * p.ldy + p.y_col0 + gn] = v;
                    }
                }
            }
        }
    }
}
