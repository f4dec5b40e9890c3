// x[i] *= s[i % cols], in place: a projection's output scaled column by column (Falcon-H1's
// muP multipliers).

struct Params {
    n: u32, cols: u32, _pad0: u32, _pad1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> x: array<f32>;
@group(0) @binding(2) var<storage, read> s: array<f32>;

@compute @workgroup_size(256)
fn scale_columns(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                 @builtin(local_invocation_index) lid: u32) {
    let i = (wid.y * nwg.x + wid.x) * 256u + lid;
    if (i < p.n) {
        x[i] = x[i] * s[i % p.cols];
    }
}
