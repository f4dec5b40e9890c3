// x = cap * tanh(x / cap) in place: Gemma 2's soft-capping of the output logits.

struct Params {
    n: u32, cap: f32, _pad0: u32, _pad1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> x: array<f32>;

@compute @workgroup_size(256)
fn softcap(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
           @builtin(local_invocation_index) lid: u32) {
    let i = (wid.y * nwg.x + wid.x) * 256u + lid;
    if (i < p.n) {
        x[i] = tanh_f32(x[i] / p.cap) * p.cap;
    }
}
