// What the attention kernels share: their Params (attention.rs's mirror), the first key a
// query sees, and the soft cap. `p` is each kernel's uniform binding.

// `selected` and `v_dim` (sparse attention) are sparse_attention.wgsl's alone.
struct Params {
    tokens: u32, heads: u32, kv_heads: u32, head_dim: u32,
    scale: f32, softcap: f32, window: u32, has_sinks: u32,
    selected: u32, v_dim: u32, _pad1: u32, _pad2: u32,
}

// The first key query token `t` of a sequence starting at `start` sees.
fn first_key_of(t: u32, start: u32) -> u32 {
    if (p.window > 0u && t + 1u > p.window) {
        return max(start, t + 1u - p.window);
    }
    return start;
}

// A scaled score, soft-capped where the model asks.
fn capped(s: f32) -> f32 {
    if (p.softcap > 0.0) {
        return tanh_f32(s / p.softcap) * p.softcap;
    }
    return s;
}
