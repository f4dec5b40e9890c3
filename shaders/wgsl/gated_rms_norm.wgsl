// The recurrent layers' gated RMSNorm over groups of d values of x (mode: NormGate's numbers):
// 0 normed, times weight, times silu(gate) (gated DeltaNet's RMSNormGated, a group a head); 1
// gated by silu(gate), then normed, times weight (Mamba-2's); 2 normed, times weight, times
// sigmoid(gate) (Kimi Delta Attention's o_norm). The weight (wlen values) repeats along the row
// where shorter. One group per workgroup.

struct Params {
    groups: u32, d: u32, eps: f32, wlen: u32,
    mode: u32, _pad0: u32, _pad1: u32, _pad2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> gate: array<f32>;
@group(0) @binding(3) var<storage, read> weight: array<f32>;
@group(0) @binding(4) var<storage, read_write> y: array<f32>;

var<workgroup> red: array<f32, 64>;

// The gate's activation: sigmoid in mode 2, silu otherwise.
fn act(g: f32) -> f32 {
    if (p.mode == 2u) {
        return 1.0 / (1.0 + exp(-g));
    }
    return g / (1.0 + exp(-g));
}

@compute @workgroup_size(64)
fn gated_rms_norm(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                  @builtin(local_invocation_index) lid: u32) {
    let group = wid.y * nwg.x + wid.x;
    if (group >= p.groups) {
        return;
    }
    let base = group * p.d;
    var ss = 0.0;
    for (var c = lid; c < p.d; c = c + 64u) {
        var v = x[base + c];
        if (p.mode == 1u) {
            v = v * act(gate[base + c]);
        }
        ss = ss + v * v;
    }
    red[lid] = ss;
    workgroupBarrier();
    for (var w = 32u; w > 0u; w = w >> 1u) {
        if (lid < w) {
            red[lid] = red[lid] + red[lid + w];
        }
        workgroupBarrier();
    }
    let inv = 1.0 / sqrt(red[0] / f32(p.d) + p.eps);
    for (var c = lid; c < p.d; c = c + 64u) {
        let g = act(gate[base + c]);
        let wc = weight[(base + c) % p.wlen];
        if (p.mode == 1u) {
            y[base + c] = wc * (x[base + c] * g * inv);
        } else {
            y[base + c] = wc * (x[base + c] * inv) * g;
        }
    }
}
