// The recurrent layers' gated RMSNorm over groups of d values of x (mode: NormGate's numbers):
// 0 normed, times weight, times silu(gate) (gated DeltaNet's RMSNormGated, a group a head); 1
// gated by silu(gate), then normed, times weight (Mamba-2's); 2 normed, times weight, times
// sigmoid(gate) (Kimi Delta Attention's o_norm). The weight (wlen values) repeats along the row
// where shorter. A group per segment of SEG invocations (lib/row_sums.wgsl).

struct Params {
    groups: u32, d: u32, eps: f32, wlen: u32,
    mode: u32, _pad0: u32, _pad1: u32, _pad2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> gate: array<f32>;
@group(0) @binding(3) var<storage, read> weight: array<f32>;
@group(0) @binding(4) var<storage, read_write> y: array<f32>;

// The gate's activation: sigmoid in mode 2, silu otherwise.
fn act(g: f32) -> f32 {
    if (p.mode == 2u) {
        return 1.0 / (1.0 + exp(-g));
    }
    return g / (1.0 + exp(-g));
}

@compute @workgroup_size(256)
fn gated_rms_norm(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                  @builtin(local_invocation_index) lid: u32) {
    let at = segment_of(wid.y * nwg.x + wid.x, lid, p.groups);
    let base = at.row * p.d;
    var ss = 0.0;
    if (at.live) {
        for (var c = at.t; c < p.d; c = c + SEG) {
            var v = x[base + c];
            if (p.mode == 1u) {
                v = v * act(gate[base + c]);
            }
            ss = ss + v * v;
        }
    }
    let total = segment_sum(lid, ss);
    if (!at.live) {
        return;
    }
    let inv = 1.0 / sqrt(total / f32(p.d) + p.eps);
    for (var c = at.t; c < p.d; c = c + SEG) {
        let g = act(gate[base + c]);
        let wc = weight[(base + c) % p.wlen];
        if (p.mode == 1u) {
            y[base + c] = wc * (x[base + c] * g * inv);
        } else {
            y[base + c] = wc * (x[base + c] * inv) * g;
        }
    }
}
