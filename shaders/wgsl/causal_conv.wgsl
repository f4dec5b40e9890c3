// The depthwise causal convolution of the recurrent layers: y[t, c] = act(bias[c] + sum_j
// w[c, j] * x[t - K + 1 + j, c]), taps before the token's sequence reading zeros; act SiLU
// where flag 1 is set (gated DeltaNet, Mamba-2), else none (LFM2); the bias read where flag 2
// is set. One invocation per output value.

struct Params {
    n: u32, channels: u32, taps: u32, flags: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> w: array<f32>;
@group(0) @binding(3) var<storage, read> bias: array<f32>;
// [sequence start of each token | position of each token], see WgpuLayout.
@group(0) @binding(4) var<storage, read> seq: array<u32>;
@group(0) @binding(5) var<storage, read_write> y: array<f32>;

@compute @workgroup_size(256)
fn causal_conv(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) lid: u32) {
    let i = (wid.y * nwg.x + wid.x) * 256u + lid;
    if (i >= p.n) {
        return;
    }
    let t = i / p.channels;
    let c = i % p.channels;
    let first = seq[t];
    var s = 0.0;
    for (var j = 0u; j < p.taps; j = j + 1u) {
        // Token t - (taps - 1) + j, kept unsigned: it exists when t + j + 1 >= first + taps.
        if (t + j + 1u >= first + p.taps) {
            s = s + w[c * p.taps + j] * x[(t + j + 1u - p.taps) * p.channels + c];
        }
    }
    if ((p.flags & 2u) != 0u) {
        s = s + bias[c];
    }
    if ((p.flags & 1u) != 0u) {
        s = s / (1.0 + exp(-s));
    }
    y[i] = s;
}
