// How a format file hands its weights to the f32 matmul tile (lib/matmul.wgsl) or to the split
// matmul's weight planes (lib/weight_planes.wgsl); its entry point runs `tile_main`.
// Each format file declares `p` (its Params, starting with the shape fields) and:
//   load_w(row, col)            the exact reference dequantization of one weight;
//   w_fetch(row, c8) -> WRaw    the raw words behind weights (row, 8 c8 .. 8 c8 + 7), loads only;
//   w_decode(raw, row, c8) -> W8  those 8 weights, decoded exactly as load_w would.
// The split lets the next K step's words be in flight while the current one is multiplied.

// Raw words of 8 consecutive weights of a row, as each format's w_fetch fills them (with the
// scale index in b.x where the format has one, so w_decode need not compute it again).
struct WRaw {
    a: vec4<u32>,
    b: vec4<u32>,
}

// 8 decoded weights, in column order.
struct W8 {
    lo: vec4<f32>,
    hi: vec4<f32>,
}

fn w8_of(v: array<f32, 8>) -> W8 {
    return W8(vec4<f32>(v[0], v[1], v[2], v[3]), vec4<f32>(v[4], v[5], v[6], v[7]));
}

// Weights (row, 8 c8 .. 8 c8 + 7) one by one through the format's load_w, 0 past the row's
// end: the partial last chunk of a row, and chunks a format's w_decode has no fast path for.
fn load_w8(row: u32, c8: u32) -> W8 {
    var w = W8(vec4<f32>(0.0), vec4<f32>(0.0));
    for (var i = 0u; i < 4u; i = i + 1u) {
        if (c8 * 8u + i < p.k) {
            w.lo[i] = load_w(row, c8 * 8u + i);
        }
        if (c8 * 8u + 4u + i < p.k) {
            w.hi[i] = load_w(row, c8 * 8u + 4u + i);
        }
    }
    return w;
}

