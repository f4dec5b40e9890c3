// One vocabulary tile of the fused log-softmax-gather: merges the tile's logits of each row
// into a running (max, sum of exp, argmax, target logit) state, and on the last tile writes
// NLL = max + log(sum) - logit[target]. One row per workgroup; logits never leave the GPU.

struct Params {
    rows: u32,
    // Columns in this tile, the vocabulary index of its first column, row stride of `logits`.
    width: u32, v0: u32, ld: u32,
    first: u32, last: u32, _pad0: u32, _pad1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> logits: array<f32>;
@group(0) @binding(2) var<storage, read> targets: array<u32>;
// Per row: running max, running sum of exp(l - max), argmax (u32 bits), target logit.
@group(0) @binding(3) var<storage, read_write> state: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read_write> nll: array<f32>;

var<workgroup> rm: array<f32, 256>;
var<workgroup> rs: array<f32, 256>;
var<workgroup> ri: array<u32, 256>;

@compute @workgroup_size(256)
fn lse_update(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
              @builtin(local_invocation_index) lid: u32) {
    let row = wid.y * nwg.x + wid.x;
    if (row >= p.rows) {
        return;
    }
    let base = row * p.ld;
    var m = NEG_BIG;
    var s = 0.0;
    var im = 0u;
    for (var c = lid; c < p.width; c = c + 256u) {
        let v = logits[base + c];
        if (v > m) {
            s = s * exp(m - v) + 1.0;
            m = v;
            im = c;
        } else {
            s = s + exp(v - m);
        }
    }
    rm[lid] = m;
    rs[lid] = s;
    ri[lid] = im;
    workgroupBarrier();
    for (var w = 128u; w > 0u; w = w >> 1u) {
        if (lid < w) {
            let m1 = rm[lid];
            let m2 = rm[lid + w];
            let mm = max(m1, m2);
            rs[lid] = rs[lid] * exp(m1 - mm) + rs[lid + w] * exp(m2 - mm);
            // First index wins ties, as in the CPU reference.
            if (m2 > m1 || (m2 == m1 && ri[lid + w] < ri[lid])) {
                ri[lid] = ri[lid + w];
            }
            rm[lid] = mm;
        }
        workgroupBarrier();
    }
    if (lid != 0u) {
        return;
    }
    var st = vec4<f32>(NEG_BIG, 0.0, 0.0, 0.0);
    if (p.first == 0u) {
        st = state[row];
    }
    let tm = rm[0];
    let mm = max(st.x, tm);
    st.y = st.y * exp(st.x - mm) + rs[0] * exp(tm - mm);
    // Earlier tiles hold smaller indices: a later tile wins only with a strictly larger max.
    if (tm > st.x) {
        st.z = bitcast<f32>(p.v0 + ri[0]);
    }
    st.x = mm;
    let tg = targets[row];
    if (tg >= p.v0 && tg < p.v0 + p.width) {
        st.w = logits[base + tg - p.v0];
    }
    state[row] = st;
    if (p.last != 0u) {
        nll[row] = st.x + log(st.y) - st.w;
    }
}
