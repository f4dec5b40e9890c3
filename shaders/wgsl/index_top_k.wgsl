// DeepSeek sparse attention's lightning indexer: for query row t (a workgroup each, rows
// row0 .. row0 + rows), the scores of its sequence's keys up to itself (with `rate` > 1, the
// keys j < (position + 1) / rate: DeepSeek-V4's compressed entries, key j at row start + j),
//   s_j = sum_h w[t, h] * weight_scale * max(scale * q[t, h] . k[j], 0),
// then the positions of its top_k best, ascending, a higher score first and at equal scores
// the earlier key (every key where it has no more than top_k), the row's rest -1. The scores
// go to `scratch` (a row of max_len each); the top_k-th best is found by a radix select on
// their order-preserving u32 keys (four 8-bit digits, most significant first), and the
// selected keys are written in order by a prefix sum per chunk of 256.

const WG: u32 = 256u;

struct Params {
    tokens: u32, heads: u32, head_dim: u32, top_k: u32,
    scale: f32, weight_scale: f32, row0: u32, max_len: u32,
    rate: u32, _pad0: u32, _pad1: u32, _pad2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> q: array<f32>;
@group(0) @binding(2) var<storage, read> k: array<f32>;
@group(0) @binding(3) var<storage, read> w: array<f32>;
// [sequence start of each token | position of each token], see WgpuLayout.
@group(0) @binding(4) var<storage, read> seq: array<u32>;
@group(0) @binding(5) var<storage, read_write> scratch: array<u32>;
@group(0) @binding(6) var<storage, read_write> out: array<f32>;

var<workgroup> hist: array<atomic<u32>, 256>;
var<workgroup> scan: array<u32, WG>;
var<workgroup> chosen: array<u32, 2>;

// A score as a u32 whose order is the scores' (-0 as +0).
fn order_key(s: f32) -> u32 {
    let b = bitcast<u32>(s + 0.0);
    if ((b & 0x80000000u) != 0u) {
        return ~b;
    }
    return b | 0x80000000u;
}

// Inclusive prefix sum of `v` over the workgroup (every invocation calls it).
fn prefix_sum(lid: u32, v: u32) -> u32 {
    scan[lid] = v;
    workgroupBarrier();
    for (var o = 1u; o < WG; o = o << 1u) {
        var add = 0u;
        if (lid >= o) {
            add = scan[lid - o];
        }
        workgroupBarrier();
        scan[lid] = scan[lid] + add;
        workgroupBarrier();
    }
    let r = scan[lid];
    workgroupBarrier();
    return r;
}

@compute @workgroup_size(WG)
fn index_top_k(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) lid: u32) {
    let slot = wid.y * nwg.x + wid.x;
    let t = p.row0 + slot;
    if (t >= p.tokens) {
        return;
    }
    // Loaded through shared memory so that the loops with barriers are provably uniform.
    if (lid == 0u) {
        chosen[0] = seq[t];
    }
    let start = workgroupUniformLoad(&chosen[0]);
    let count = (t - start + 1u) / p.rate;
    let o = t * p.top_k;
    if (count <= p.top_k) {
        for (var j = lid; j < p.top_k; j = j + WG) {
            out[o + j] = select(-1.0, f32(j), j < count);
        }
        return;
    }
    let hd = p.head_dim;
    let base = slot * p.max_len;
    for (var j = lid; j < count; j = j + WG) {
        let kr = (start + j) * hd;
        var s = 0.0;
        for (var h = 0u; h < p.heads; h = h + 1u) {
            let qr = (t * p.heads + h) * hd;
            var dot = 0.0;
            for (var d = 0u; d < hd; d = d + 1u) {
                dot = dot + q[qr + d] * k[kr + d];
            }
            s = s + w[t * p.heads + h] * p.weight_scale * max(dot * p.scale, 0.0);
        }
        scratch[base + j] = order_key(s);
    }
    // The top_k-th largest key, digit by digit: `prefix` its digits so far, `need` how many
    // keys still to take among those matching them.
    var prefix = 0u;
    var need = p.top_k;
    for (var shift = 24i; shift >= 0i; shift = shift - 8i) {
        atomicStore(&hist[lid], 0u);
        workgroupBarrier();
        let high = select(0xFFFFFFFFu << u32(shift + 8i), 0u, shift == 24i);
        for (var j = lid; j < count; j = j + WG) {
            let key = scratch[base + j];
            if ((key & high) == prefix) {
                atomicAdd(&hist[(key >> u32(shift)) & 255u], 1u);
            }
        }
        workgroupBarrier();
        if (lid == 0u) {
            var above = 0u;
            var digit = 255u;
            loop {
                let n = atomicLoad(&hist[digit]);
                if (above + n >= need || digit == 0u) {
                    break;
                }
                above = above + n;
                digit = digit - 1u;
            }
            chosen[0] = prefix | (digit << u32(shift));
            chosen[1] = need - above;
        }
        prefix = workgroupUniformLoad(&chosen[0]);
        need = workgroupUniformLoad(&chosen[1]);
    }
    // Keys above the threshold, and the first `need` equal to it, in order.
    var taken = 0u;
    var ties = 0u;
    for (var c = 0u; c < count; c = c + WG) {
        let j = c + lid;
        var key = 0u;
        if (j < count) {
            key = scratch[base + j];
        }
        let equal = u32(j < count && key == prefix);
        let tie_rank = ties + prefix_sum(lid, equal) - equal;
        let keep = u32(j < count && (key > prefix || (equal == 1u && tie_rank < need)));
        let at = taken + prefix_sum(lid, keep) - keep;
        if (keep == 1u) {
            out[o + at] = f32(j);
        }
        // The chunk's totals, read by every invocation after the last sums.
        if (lid == WG - 1u) {
            chosen[0] = at + keep;
            chosen[1] = tie_rank + equal;
        }
        taken = workgroupUniformLoad(&chosen[0]);
        ties = workgroupUniformLoad(&chosen[1]);
        workgroupBarrier();
    }
}
