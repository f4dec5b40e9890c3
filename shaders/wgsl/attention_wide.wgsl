// Causal grouped-query attention for heads wider than attention.wgsl holds (head_dim a
// multiple of 4 up to HD_WIDE: Gemma's 256 and Gemma 4's 512, DeepSeek's 192-value query/key
// heads), with the
// same variants (a sliding window of `window` keys, scores soft-capped as cap * tanh(s / cap)
// where softcap > 0, a sink logit per head where has_sinks), and sparse attention: where
// `selected` > 0, query t sees only the keys row t of `keys` names (`selected` positions in
// its sequence, ascending, then -1s). One workgroup of KT threads per
// (query, head), its query staged in shared memory; per tile of KT keys each thread scores one
// key, then every thread runs the tile's online-softmax update and accumulates its own 4
// output values (and 4 more, KT * 4 further on, for heads wider than that). Little workgroup memory (fits any adapter), few loop iterations per thread
// (llvmpipe stops a loop after 65535 iterations of one invocation), exact in f32; a tiled
// multi-query kernel is the speed step.

const HD_WIDE: u32 = 512u;
const KT: u32 = 64u;

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> q: array<f32>;
@group(0) @binding(2) var<storage, read> k: array<f32>;
@group(0) @binding(3) var<storage, read> v: array<f32>;
// [sequence start of each token | position of each token], see WgpuLayout.
@group(0) @binding(4) var<storage, read> seq: array<u32>;
@group(0) @binding(5) var<storage, read> sinks: array<f32>;
// Sparse attention's key positions, `selected` a query (any buffer where 0).
@group(0) @binding(6) var<storage, read> keys: array<f32>;
@group(0) @binding(7) var<storage, read_write> out: array<f32>;

var<workgroup> qs: array<f32, HD_WIDE>;
// The tile's scaled (capped) scores; NEG_BIG for keys the query does not see.
var<workgroup> st: array<f32, KT>;
// The tile's key rows.
var<workgroup> rows: array<u32, KT>;
var<workgroup> first_key: u32;
var<workgroup> key_count: u32;

@compute @workgroup_size(KT)
fn attention_wide(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                  @builtin(local_invocation_index) lid: u32) {
    // Uniform per workgroup: one (query, head).
    let i = wid.y * nwg.x + wid.x;
    if (i >= p.tokens * p.heads) {
        return;
    }
    let t = i / p.heads;
    let h = i % p.heads;
    let hd = p.head_dim;
    let kh = h / (p.heads / p.kv_heads);
    let q_row = t * p.heads * hd + h * hd;
    for (var d = lid; d < hd; d = d + KT) {
        qs[d] = q[q_row + d];
    }
    // The first key this query sees (its sequence's start, or the window's) and how many it
    // sees; loaded through shared memory so that the key loop (and its barriers) is provably
    // uniform.
    if (lid == 0u) {
        var s0 = seq[t];
        var n = 0u;
        if (p.selected > 0u) {
            while (n < p.selected && keys[t * p.selected + n] >= 0.0) {
                n = n + 1u;
            }
        } else {
            s0 = first_key_of(t, s0);
            n = t + 1u - s0;
        }
        first_key = s0;
        key_count = n;
    }
    let start = workgroupUniformLoad(&first_key);
    let count = workgroupUniformLoad(&key_count);
    // A sink starts the running softmax as a seen logit of weight exp(0) and no value.
    var m = NEG_BIG;
    var l = 0.0;
    if (p.has_sinks != 0u) {
        m = sinks[h];
        l = 1.0;
    }
    // This thread's output values 4 lid .. 4 lid + 3, and as many from d1 = d0 + 4 KT.
    let d0 = 4u * lid;
    let d1 = d0 + 4u * KT;
    var o = vec4<f32>(0.0);
    var o1 = vec4<f32>(0.0);
    for (var kt = 0u; kt < count; kt = kt + KT) {
        let mine = kt + lid;
        var s = NEG_BIG;
        if (mine < count) {
            var key = start + mine;
            if (p.selected > 0u) {
                key = start + u32(keys[t * p.selected + mine]);
            }
            rows[lid] = key;
            let k_row = key * p.kv_heads * hd + kh * hd;
            var dot = 0.0;
            for (var d = 0u; d < hd; d = d + 1u) {
                dot = dot + qs[d] * k[k_row + d];
            }
            s = capped(dot * p.scale);
        }
        st[lid] = s;
        workgroupBarrier();
        let n = min(KT, count - kt);
        var mx = m;
        for (var j = 0u; j < n; j = j + 1u) {
            mx = max(mx, st[j]);
        }
        let corr = exp(m - mx);
        l = l * corr;
        o = o * corr;
        o1 = o1 * corr;
        m = mx;
        for (var j = 0u; j < n; j = j + 1u) {
            let pj = exp(st[j] - m);
            l = l + pj;
            let v_row = rows[j] * p.kv_heads * hd + kh * hd;
            if (d0 < hd) {
                let r = v_row + d0;
                o = o + pj * vec4<f32>(v[r], v[r + 1u], v[r + 2u], v[r + 3u]);
            }
            if (d1 < hd) {
                let r = v_row + d1;
                o1 = o1 + pj * vec4<f32>(v[r], v[r + 1u], v[r + 2u], v[r + 3u]);
            }
        }
        workgroupBarrier();
    }
    if (d0 < hd) {
        out[q_row + d0] = o.x / l;
        out[q_row + d0 + 1u] = o.y / l;
        out[q_row + d0 + 2u] = o.z / l;
        out[q_row + d0 + 3u] = o.w / l;
    }
    if (d1 < hd) {
        out[q_row + d1] = o1.x / l;
        out[q_row + d1 + 1u] = o1.y / l;
        out[q_row + d1 + 2u] = o1.z / l;
        out[q_row + d1 + 3u] = o1.w / l;
    }
}
