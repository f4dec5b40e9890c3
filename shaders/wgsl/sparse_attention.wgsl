// DeepSeek sparse attention: query t sees only the keys row t of `keys` names (`selected`
// positions in its sequence, ascending, then -1s), so that its cost grows with the keys
// selected, not with the window. Heads of GQA up to HD_KEYS values (a multiple of 4: the
// expanded heads of 192, or latent attention's one key head of 576, the latent beside its
// rotated part) and values up to 8 * KT, narrower than the keys where `v_dim` says (the
// latent's). Scores soft-capped as cap * tanh(s / cap) where softcap > 0, a sink logit per head
// where has_sinks (branched layouts attend here, their keys listed). One workgroup of KT
// threads per (query, head), its query staged in shared memory; per tile of KT keys each
// thread scores one key, then every thread runs the tile's online-softmax update and
// accumulates its own 4 output values (and 4 more, KT * 4 further on). Little workgroup memory
// (fits any adapter), few loop iterations per thread (llvmpipe stops a loop after 65535
// iterations of one invocation), exact in f32.

const HD_KEYS: u32 = 576u;
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

var<workgroup> qs: array<f32, HD_KEYS>;
// The tile's scaled (capped) scores; NEG_BIG for keys the query does not see.
var<workgroup> st: array<f32, KT>;
// The tile's key rows.
var<workgroup> rows: array<u32, KT>;
var<workgroup> first_key: u32;
var<workgroup> key_count: u32;

@compute @workgroup_size(KT)
fn sparse_attention(@builtin(workgroup_id) wid: vec3<u32>,
                    @builtin(num_workgroups) nwg: vec3<u32>,
                    @builtin(local_invocation_index) lid: u32) {
    // Uniform per workgroup: one (query, head).
    let i = wid.y * nwg.x + wid.x;
    if (i >= p.tokens * p.heads) {
        return;
    }
    let t = i / p.heads;
    let h = i % p.heads;
    let hd = p.head_dim;
    let vd = p.v_dim;
    let kh = h / (p.heads / p.kv_heads);
    let q_row = t * p.heads * hd + h * hd;
    let o_row = t * p.heads * vd + h * vd;
    for (var d = lid; d < hd; d = d + KT) {
        qs[d] = q[q_row + d];
    }
    // Its sequence's start and how many keys it sees; loaded through shared memory so that
    // the key loop (and its barriers) is provably uniform.
    if (lid == 0u) {
        var n = 0u;
        while (n < p.selected && keys[t * p.selected + n] >= 0.0) {
            n = n + 1u;
        }
        first_key = seq[t];
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
            let key = start + u32(keys[t * p.selected + mine]);
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
            let v_row = rows[j] * p.kv_heads * vd + kh * vd;
            if (d0 < vd) {
                let r = v_row + d0;
                o = o + pj * vec4<f32>(v[r], v[r + 1u], v[r + 2u], v[r + 3u]);
            }
            if (d1 < vd) {
                let r = v_row + d1;
                o1 = o1 + pj * vec4<f32>(v[r], v[r + 1u], v[r + 2u], v[r + 3u]);
            }
        }
        workgroupBarrier();
    }
    if (d0 < vd) {
        out[o_row + d0] = o.x / l;
        out[o_row + d0 + 1u] = o.y / l;
        out[o_row + d0 + 2u] = o.z / l;
        out[o_row + d0 + 3u] = o.w / l;
    }
    if (d1 < vd) {
        out[o_row + d1] = o1.x / l;
        out[o_row + d1 + 1u] = o1.y / l;
        out[o_row + d1 + 2u] = o1.z / l;
        out[o_row + d1 + 3u] = o1.w / l;
    }
}
