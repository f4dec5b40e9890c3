// The format's part of a split matmul (pipelines.rs MatmulSum::Split): weight rows
// w_row0 .. w_row0 + n, decoded by the format file's w_fetch / w_decode (lib/weights.wgsl),
// scaled by the layer's power of two `p.w_scale` (its largest magnitude near 2^13: no f16
// overflow, residuals far above f16's subnormals) and written to binding 2 as split_gemm.wgsl
// reads them (lib/planes.wgsl): f16 high parts, then f16 residuals (the exact rest, rounded),
// each plane [n, plane_ld(k)], zeros past k. One invocation per 8 weights:
// workgroups of 8 rows x 32 chunks.

const NT: u32 = 256u;

@group(0) @binding(2) var<storage, read_write> planes: array<vec4<f16>>;

// v's high parts (lib/planes.wgsl's f16_high, four at once).
fn high_part(v: vec4<f32>) -> vec4<f32> {
    return vec4<f32>(f16_high(v.x), f16_high(v.y), f16_high(v.z), f16_high(v.w));
}

fn tile_main(wid: vec3<u32>, lid: u32) {
    let n = wid.y * 8u + lid / 32u;
    let c8 = wid.x * 32u + lid % 32u;
    let ld = plane_ld(p.k);
    if (n >= p.n || c8 * 8u >= ld) {
        return;
    }
    let row = p.w_row0 + n;
    var w: W8;
    if (c8 * 8u + 8u <= p.k) {
        w = w_decode(w_fetch(row, c8), row, c8);
    } else {
        w = load_w8(row, c8);  // the last, partial chunk of a row (zeros past k)
    }
    let a = w.lo * p.w_scale;
    let b = w.hi * p.w_scale;
    let ah = high_part(a);
    let bh = high_part(b);
    let i = (n * ld + c8 * 8u) / 4u;
    let residuals = p.n * ld / 4u;
    planes[i] = vec4<f16>(ah);
    planes[i + 1u] = vec4<f16>(bh);
    planes[residuals + i] = vec4<f16>(a - ah);
    planes[residuals + i + 1u] = vec4<f16>(b - bh);
}
