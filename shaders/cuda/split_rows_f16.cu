// nvrtc: exact
// An f32 matrix as two f16 planes for f32-grade products on f16 tensor cores (`--dtype
// split-bf16`: `split_gemm.cu`'s activations and f32-valued weights, split attention's q and k
// over rows of one head): each row scaled by the power of two that puts its
// largest magnitude in [2^14, 2^15), then hi = f16(v) and lo = f16(v - hi) (v - hi is exact in
// f32): 22 of each value's bits down to 2^-17 of its row's largest, past which the residual
// turns subnormal (what is lost is below 2^-38 of that largest value). `undo[r]` is the power
// of two that scales the row's products back. One block a row (a warp for a short one), four
// values a thread at a time (`cols` a multiple of 4; the second pass reads the row from L2). The planes' rows are `ld`
// values apart (a multiple of 4; TMA wants 16-byte rows, split_gemm.cu), `x`'s `cols`: the
// padding is left as it is, split_gemm reads no further than `cols`.

// The second pass over row r (`row`, n4 groups of four, in global or shared memory), `m` the
// largest magnitude of this thread's share of it (each thread reads back the values it saw).
__device__ __forceinline__ void write_planes(uint2* hi, uint2* lo, float* undo, const float4* row,
                                             int r, int n4, int ld, float m) {
    m = block_max(m);
    int e = f16_plane_exponent(m);
    float s = ldexpf(1.0f, e);
    long long base = (long long)r * (ld / 4);
    for (int c = threadIdx.x; c < n4; c += blockDim.x) {
        float4 q = row[c];
        uint2 h, l;  // scaled by a power of two: exact
        split2_f16(q.x * s, q.y * s, h.x, l.x);
        split2_f16(q.z * s, q.w * s, h.y, l.y);
        hi[base + c] = h;
        lo[base + c] = l;
    }
    if (threadIdx.x == 0) undo[r] = ldexpf(1.0f, -e);
}

__device__ __forceinline__ float max_abs(float m, float4 v) {
    return fmaxf(fmaxf(m, fmaxf(fabsf(v.x), fabsf(v.y))), fmaxf(fabsf(v.z), fabsf(v.w)));
}

extern "C" __global__ void split_rows_f16(uint2* hi, uint2* lo, float* undo, const float4* x,
                                          int cols, int ld) {
    int r = blockIdx.x, n4 = cols / 4;
    const float4* row = x + (long long)r * n4;
    float m = 0.0f;
    for (int c = threadIdx.x; c < n4; c += blockDim.x) m = max_abs(m, row[c]);
    write_planes(hi, lo, undo, row, r, n4, ld, m);
}

// The gated MLP's activation (`gated_times`, gate and up apart) split as above in the same
// pass, for the down projection, and not kept: only the planes are written (h's f32 round
// trip through DRAM saved). The row waits in shared memory (`cols` values) for its scale.
extern "C" __global__ void split_gated_rows_f16(uint2* hi, uint2* lo, float* undo,
                                                const float4* gate, const float4* up, int cols,
                                                int ld, int act, float alpha, float limit) {
    extern __shared__ float4 row_values[];
    int r = blockIdx.x, n4 = cols / 4;
    long long at = (long long)r * n4;
    float m = 0.0f;
    for (int c = threadIdx.x; c < n4; c += blockDim.x) {
        float4 g = gate[at + c], u = up[at + c];
        float4 v = make_float4(gated_times(g.x, u.x, act, alpha, limit),
                               gated_times(g.y, u.y, act, alpha, limit),
                               gated_times(g.z, u.z, act, alpha, limit),
                               gated_times(g.w, u.w, act, alpha, limit));
        row_values[c] = v;
        m = max_abs(m, v);
    }
    write_planes(hi, lo, undo, row_values, r, n4, ld, m);
}
