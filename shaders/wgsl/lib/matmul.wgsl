// The tiled body shared by every dequantizing matmul: y[m, y_col0 + n] = sum_k x[m, k] W[w_row0 + n, k]
// (+ bias[bias_row0 + n]). Each kernel file declares `p` (its Params, starting with the fields
// used here) and `load_w(row, col)`, the exact reference dequantization of one weight, which
// runs once per weight per 64-token tile while the K-tile is staged in shared memory.
// 64x64 output tile per workgroup of 256 threads, a 4x4 micro-tile per thread, f32 accumulation.

const BM: u32 = 64u;
const BN: u32 = 64u;
const BK: u32 = 16u;

@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<storage, read> bias: array<f32>;

// [BK][BM] activations and [BK][BN] decoded weights of the current K-tile.
var<workgroup> xs: array<f32, 1024>;
var<workgroup> ws: array<f32, 1024>;

fn matmul_tile(wid: vec3<u32>, lid: u32) {
    let n0 = wid.x * BN;
    let m0 = wid.y * BM;
    let tx = lid % 16u;
    let ty = lid / 16u;
    var acc: array<vec4<f32>, 4>;
    for (var k0 = 0u; k0 < p.k; k0 = k0 + BK) {
        for (var e = 0u; e < 4u; e = e + 1u) {
            let idx = lid + e * 256u;
            let r = idx / BK;
            let kk = idx % BK;
            let gk = k0 + kk;
            var xv = 0.0;
            if (m0 + r < p.m && gk < p.k) {
                xv = x[(m0 + r) * p.k + gk];
            }
            xs[kk * BM + r] = xv;
            var wv = 0.0;
            if (n0 + r < p.n && gk < p.k) {
                wv = load_w(p.w_row0 + n0 + r, gk);
            }
            ws[kk * BN + r] = wv;
        }
        workgroupBarrier();
        // Two-level sum: each K-tile is summed on its own, then added to the total, so the
        // rounding error grows with K / BK + BK rather than K (closer to the f64 reference,
        // which matters where activation fake-quant turns tiny differences into flips).
        var part: array<vec4<f32>, 4>;
        for (var kk = 0u; kk < BK; kk = kk + 1u) {
            let a = vec4<f32>(xs[kk * BM + ty * 4u], xs[kk * BM + ty * 4u + 1u],
                              xs[kk * BM + ty * 4u + 2u], xs[kk * BM + ty * 4u + 3u]);
            let b = vec4<f32>(ws[kk * BN + tx * 4u], ws[kk * BN + tx * 4u + 1u],
                              ws[kk * BN + tx * 4u + 2u], ws[kk * BN + tx * 4u + 3u]);
            part[0] = part[0] + a.x * b;
            part[1] = part[1] + a.y * b;
            part[2] = part[2] + a.z * b;
            part[3] = part[3] + a.w * b;
        }
        for (var i = 0u; i < 4u; i = i + 1u) {
            acc[i] = acc[i] + part[i];
        }
        workgroupBarrier();
    }
    for (var i = 0u; i < 4u; i = i + 1u) {
        let gm = m0 + ty * 4u + i;
        if (gm >= p.m) {
            continue;
        }
        for (var j = 0u; j < 4u; j = j + 1u) {
            let gn = n0 + tx * 4u + j;
            if (gn < p.n) {
                var v = acc[i][j];
                if (p.has_bias != 0u) {
                    v = v + bias[p.bias_row0 + gn];
                }
                y[gm * p.ldy + p.y_col0 + gn] = v;
            }
        }
    }
}
