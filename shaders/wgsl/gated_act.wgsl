// y = act(gate) * up, elementwise: act 0 is SiLU, 1 GELU with the tanh approximation
// (transformers' gelu_pytorch_tanh), 2 gpt-oss's clamped SwiGLU, 3 sigmoid (an attention
// output gate), 4 none (`gate * up`: LFM2's short convolution), 5 relu(gate)^2 alone
// (Nemotron-H's ungated MLP; `up` not read), 6 DeepSeek-V4's SiLU of the gate clamped above
// at `limit` times up clamped to +-limit. With `interleaved` gate and up alternate in
// `gate` (gate the even columns: gpt-oss's checkpoints; `up` is not read).

struct Params {
    n: u32, act: u32, alpha: f32, limit: f32,
    interleaved: u32, _pad0: u32, _pad1: u32, _pad2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> gate: array<f32>;
@group(0) @binding(2) var<storage, read> up: array<f32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;

@compute @workgroup_size(256)
fn gated_act(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
             @builtin(local_invocation_index) lid: u32) {
    let i = (wid.y * nwg.x + wid.x) * 256u + lid;
    if (i >= p.n) {
        return;
    }
    var g = gate[i];
    var u = up[i];
    if (p.interleaved == 1u) {
        g = gate[2u * i];
        u = gate[2u * i + 1u];
    }
    if (p.act == 2u) {
        let gc = min(g, p.limit);
        let uc = clamp(u, -p.limit, p.limit);
        let glu = gc * (1.0 / (1.0 + exp(-(gc * p.alpha))));
        y[i] = (uc + 1.0) * glu;
        return;
    }
    if (p.act == 6u) {
        let gc = min(g, p.limit);
        y[i] = gc / (1.0 + exp(-gc)) * clamp(u, -p.limit, p.limit);
        return;
    }
    if (p.act == 5u) {
        let r = max(g, 0.0);
        y[i] = r * r;
        return;
    }
    var a: f32;
    if (p.act == 0u) {
        a = g / (1.0 + exp(-g));
    } else if (p.act == 3u) {
        a = 1.0 / (1.0 + exp(-g));
    } else if (p.act == 4u) {
        a = g;
    } else {
        let z = 0.7978845608028654 * (g + 0.044715 * g * g * g);
        a = 0.5 * g * (1.0 + tanh_f32(z));
    }
    y[i] = a * u;
}
