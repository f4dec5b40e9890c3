// DeepSeek-V4's compressors (`Backend::pool_windows`): entry e of a sequence (row start + e of
// the output) pools the tokens of its window of `rate`, value by value: the softmax over the
// window's slots of gate + bias[slot] weighing kv. With `overlap` kv and gate hold 2w values a
// token and entry e pools the first halves of window e - 1 (slots 0..rate; none for the first
// entry) with the second halves of window e. Rows past a sequence's whole windows are zero.
// One invocation a value.

struct Params {
    rows: u32, w: u32, rate: u32, overlap: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> kv: array<f32>;
@group(0) @binding(2) var<storage, read> gate: array<f32>;
@group(0) @binding(3) var<storage, read> bias: array<f32>;
// [sequence start of each token | position of each token], see WgpuLayout.
@group(0) @binding(4) var<storage, read> seq: array<u32>;
@group(0) @binding(5) var<storage, read_write> out: array<f32>;

// Slot s of entry e (its window's first row `first`): x its row, y the column offset, z the
// bias row; x = 0xffffffff where the slot is empty (the first entry's earlier window).
fn slot(s: u32, e: u32, first: u32) -> vec3<u32> {
    if (p.overlap == 0u) {
        return vec3<u32>(first + s, 0u, s);
    }
    if (s < p.rate) {
        if (e == 0u) {
            return vec3<u32>(0xffffffffu, 0u, 0u);
        }
        return vec3<u32>(first - p.rate + s, 0u, s);
    }
    return vec3<u32>(first + s - p.rate, p.w, s - p.rate);
}

@compute @workgroup_size(256)
fn pool_windows(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                @builtin(local_invocation_index) lid: u32) {
    let i = (wid.y * nwg.x + wid.x) * 256u + lid;
    if (i >= p.rows * p.w) {
        return;
    }
    let r = i / p.w;
    let c = i % p.w;
    let start = seq[r];
    let e = r - start;
    let first = start + e * p.rate;
    let last = first + p.rate - 1u;
    // The window's last token lies in the same sequence.
    if (last >= p.rows || seq[last] != start) {
        out[i] = 0.0;
        return;
    }
    let cols = select(p.w, 2u * p.w, p.overlap != 0u);
    let slots = select(p.rate, 2u * p.rate, p.overlap != 0u);
    var mx = -3.4028234663852886e38;
    for (var s = 0u; s < slots; s = s + 1u) {
        let at = slot(s, e, first);
        if (at.x != 0xffffffffu) {
            mx = max(mx, gate[at.x * cols + at.y + c] + bias[at.z * cols + at.y + c]);
        }
    }
    var sum = 0.0;
    for (var s = 0u; s < slots; s = s + 1u) {
        let at = slot(s, e, first);
        if (at.x != 0xffffffffu) {
            sum = sum + exp(gate[at.x * cols + at.y + c] + bias[at.z * cols + at.y + c] - mx);
        }
    }
    var acc = 0.0;
    for (var s = 0u; s < slots; s = s + 1u) {
        let at = slot(s, e, first);
        if (at.x != 0xffffffffu) {
            let g = gate[at.x * cols + at.y + c] + bias[at.z * cols + at.y + c];
            acc = acc + kv[at.x * cols + at.y + c] * (exp(g - mx) / sum);
        }
    }
    out[i] = acc;
}
