// One vocabulary tile of a running ranking: the k largest logits of each row as (logit, id)
// pairs, the larger logit first and the lower id first among equal ones (NEG_BIG and id
// 0xffffffff where fewer were seen). Only a logit that ranks before the row's k-th so far can
// enter: each invocation ranks its own such columns (ascending ids: a later equal logit never
// enters), and a tile with none for the whole workgroup (most tiles after the first few) leaves
// the ranking as it was. Otherwise invocation 0 adds the ranking so far, then k rounds of the
// workgroup's best head, each round's winner moving to its next. One row per workgroup.

const K_MAX: u32 = 20u;

struct Params {
    rows: u32,
    // Columns in this tile, the vocabulary index of its first column, row stride of `logits`.
    width: u32, v0: u32, ld: u32,
    k: u32, first: u32, _pad0: u32, _pad1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> logits: array<f32>;
// Per row: k logits (f32 bits), then their k ids.
@group(0) @binding(2) var<storage, read_write> ranking: array<u32>;

var<workgroup> best_v: array<f32, 256>;
var<workgroup> best_i: array<u32, 256>;
var<workgroup> entered: atomic<u32>;
var<workgroup> any_entered: u32;

fn ranks_before(v: f32, i: u32, w: f32, j: u32) -> bool {
    return v > w || (v == w && i < j);
}

fn rank_insert(tv: ptr<function, array<f32, K_MAX>>, ti: ptr<function, array<u32, K_MAX>>,
               v: f32, i: u32) {
    let k = p.k;
    if (!ranks_before(v, i, (*tv)[k - 1u], (*ti)[k - 1u])) {
        return;
    }
    var at = k - 1u;
    loop {
        if (at == 0u || !ranks_before(v, i, (*tv)[at - 1u], (*ti)[at - 1u])) {
            break;
        }
        (*tv)[at] = (*tv)[at - 1u];
        (*ti)[at] = (*ti)[at - 1u];
        at = at - 1u;
    }
    (*tv)[at] = v;
    (*ti)[at] = i;
}

@compute @workgroup_size(256)
fn rank_update(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) lid: u32) {
    let row = wid.y * nwg.x + wid.x;
    if (row >= p.rows) {
        return;
    }
    let k = p.k;
    var tv: array<f32, K_MAX>;
    var ti: array<u32, K_MAX>;
    for (var j = 0u; j < k; j = j + 1u) {
        tv[j] = NEG_BIG;
        ti[j] = 0xffffffffu;
    }
    let at = row * 2u * k;
    var bar_v = NEG_BIG;
    var bar_i = 0xffffffffu;
    if (p.first == 0u) {
        bar_v = bitcast<f32>(ranking[at + k - 1u]);
        bar_i = ranking[at + 2u * k - 1u];
    }
    if (lid == 0u) {
        atomicStore(&entered, 0u);
    }
    workgroupBarrier();
    let base = row * p.ld;
    var mine_entered = 0u;
    for (var c = lid; c < p.width; c = c + 256u) {
        let v = logits[base + c];
        if (ranks_before(v, p.v0 + c, bar_v, bar_i)) {
            rank_insert(&tv, &ti, v, p.v0 + c);
            mine_entered = 1u;
        }
    }
    if (mine_entered != 0u) {
        atomicAdd(&entered, 1u);
    }
    workgroupBarrier();
    if (lid == 0u) {
        any_entered = atomicLoad(&entered);
    }
    if (workgroupUniformLoad(&any_entered) == 0u) {
        return;
    }
    if (lid == 0u && p.first == 0u) {
        for (var j = 0u; j < k; j = j + 1u) {
            rank_insert(&tv, &ti, bitcast<f32>(ranking[at + j]), ranking[at + k + j]);
        }
    }
    var h = 0u;
    for (var j = 0u; j < k; j = j + 1u) {
        var mine = 0xffffffffu;
        if (h < k) {
            best_v[lid] = tv[h];
            mine = ti[h];
        } else {
            best_v[lid] = NEG_BIG;
        }
        best_i[lid] = mine;
        workgroupBarrier();
        for (var w = 128u; w > 0u; w = w >> 1u) {
            if (lid < w && ranks_before(best_v[lid + w], best_i[lid + w], best_v[lid], best_i[lid])) {
                best_v[lid] = best_v[lid + w];
                best_i[lid] = best_i[lid + w];
            }
            workgroupBarrier();
        }
        let winner = best_i[0];
        if (lid == 0u) {
            ranking[at + j] = bitcast<u32>(best_v[0]);
            ranking[at + k + j] = winner;
        }
        if (h < k && mine == winner) {
            h = h + 1u;
        }
        workgroupBarrier();
    }
}
