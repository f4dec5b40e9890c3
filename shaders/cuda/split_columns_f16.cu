// nvrtc: exact
// An f32 matrix as two f16 planes with one power of two per column, for products that sum over
// its rows: attention's P·V under `--dtype split-bf16`, whose sum over keys no per-key (row)
// scale could leave, while a column's is undone on the output's column (flash_attention.cu).
// `column_top` first gathers each column's largest magnitude into `top` (zeroed before; f32
// bits, which order as the values do for non-negative floats), then `split_columns_f16` scales
// each column by 2^f16_plane_exponent(top) and writes hi = f16(v) and lo = f16(v - hi) (exact in
// f32): 22 bits of every value down to 2^-17 of its column's largest.

#define CT_ROWS 64  // rows a thread of column_top reads

// One thread a column of a chunk of CT_ROWS rows (blockIdx.y): a warp reads 128 contiguous
// bytes a row.
extern "C" __global__ void column_top(u32* top, const float* x, int rows, int cols) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= cols) return;
    int r0 = blockIdx.y * CT_ROWS, r1 = min(rows, r0 + CT_ROWS);
    float m = 0.0f;
    for (int r = r0; r < r1; ++r) m = fmaxf(m, fabsf(x[(long long)r * cols + c]));
    atomicMax(top + c, __float_as_uint(m));
}

// Four values a thread (`cols` a multiple of 4), `n` values in all.
extern "C" __global__ void split_columns_f16(uint2* hi, uint2* lo, const float4* x,
                                             const u32* top, long long n, int cols) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (4 * i >= n) return;
    int c = (int)(4 * i % cols);
    float4 q = x[i];
    float v[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
    for (int j = 0; j < 4; ++j)
        v[j] *= ldexpf(1.0f, f16_plane_exponent(__uint_as_float(top[c + j])));
    uint2 h, l;
    split2_f16(v[0], v[1], h.x, l.x);
    split2_f16(v[2], v[3], h.y, l.y);
    hi[i] = h;
    lo[i] = l;
}
