// RoPE in place over the values of each head that the span names (the rest pass through:
// partial rotary, latent attention's unrotated part): pair j of a head is (start + j,
// start + j + half) in rotate-half layout or (start + 2j, start + 2j + 1) interleaved
// (DeepSeek); (a, b) -> (a cos - b sin, b cos + a sin) for each token's position. One thread
// per (token, head, pair).

struct Params {
    tokens: u32, heads: u32, head_dim: u32, rotary_dim: u32,
    start: u32, interleaved: u32, _pad0: u32, _pad1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> x: array<f32>;
// [n_seq_starts(tokens) | positions(tokens)], see WgpuLayout.
@group(0) @binding(2) var<storage, read> seq: array<u32>;
@group(0) @binding(3) var<storage, read> cos_t: array<f32>;
@group(0) @binding(4) var<storage, read> sin_t: array<f32>;

@compute @workgroup_size(256)
fn rope(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let half = p.rotary_dim / 2u;
    let i = (wid.y * nwg.x + wid.x) * 256u + lid;
    if (i >= p.tokens * p.heads * half) {
        return;
    }
    let j = i % half;
    let th = i / half;
    let t = th / p.heads;
    let base = th * p.head_dim + p.start;
    var ia = j;
    var ib = j + half;
    if (p.interleaved != 0u) {
        ia = 2u * j;
        ib = 2u * j + 1u;
    }
    let pos = seq[p.tokens + t];
    let c = cos_t[pos * half + j];
    let s = sin_t[pos * half + j];
    let a = x[base + ia];
    let b = x[base + ib];
    x[base + ia] = a * c + (-b) * s;
    x[base + ib] = b * c + a * s;
}
