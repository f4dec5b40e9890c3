// Rows reduced by segments of a 256-invocation workgroup: SEG invocations a row (a power of two,
// at most 256; a constant of the module, so that the loops' bounds are), 256 / SEG rows a
// workgroup. A short row (a head of 128 under Qwen3's q/k norms) then takes a segment of 32
// instead of a workgroup of 256 of which half sat idle, and a workgroup waits at 6 barriers for
// 8 rows instead of 9 for one: on lavapipe, where each barrier switches every invocation out and
// back, the per-head norms cost more than attention.

var<workgroup> row_red: array<f32, 256>;

// The sum of `v` over the segment that `lid` belongs to, in every one of its invocations: a
// tree over the segment, the same shape for every segment. Every invocation of the workgroup
// calls it, live row or not. A second sum must wait at a barrier first (the last read of
// row_red is this one's result): not ending on one saves a barrier a workgroup.
fn segment_sum(lid: u32, v: f32) -> f32 {
    row_red[lid] = v;
    workgroupBarrier();
    let t = lid & (SEG - 1u);
    for (var w = SEG >> 1u; w > 0u; w = w >> 1u) {
        if (t < w) {
            row_red[lid] = row_red[lid] + row_red[lid + w];
        }
        workgroupBarrier();
    }
    return row_red[lid - t];
}

// Where invocation `lid` of workgroup `wg` works, rows in order, 256 / SEG a workgroup: its row,
// whether the row exists (`rows` of them), and its place `t` among the row's invocations.
struct Segment {
    row: u32,
    live: bool,
    t: u32,
}

fn segment_of(wg: u32, lid: u32, rows: u32) -> Segment {
    // A workgroup a row: `lid` itself, so that a compiler sees adjacent invocations read
    // adjacent values (lavapipe loaded `lid & 255` lane by lane: rows of 1,024 took 1.6x).
    if (SEG == 256u) {
        return Segment(wg, wg < rows, lid);
    }
    let row = wg * (256u / SEG) + lid / SEG;
    return Segment(row, row < rows, lid & (SEG - 1u));
}
