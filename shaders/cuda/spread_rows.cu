// A mixture's routed rows in group order, written token by token: each token's row of x is
// read once and written to its k places (`slots[t * k + j]`, where routing put its picks),
// then row 0 to each place between groups (`gaps`: rows computed by the padded GEMMs, never
// added). The values gather_rows.cu writes from the rows table, which reads every token's row
// k times. One thread per 8 consecutive values (cols is a multiple of 8).
template <typename T>
__device__ void spread(T* out, const T* x, const u32* slots, int tokens, int k, const u32* gaps,
                       int n_gaps, int cols) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    int chunks = cols >> 3;
    if (i >= (long long)(tokens + n_gaps) * chunks) return;
    long long r = i / chunks, c = (i % chunks) << 3;
    float v[8];
    if (r < tokens) {
        ld8(x, r * cols + c, v);
        for (int j = 0; j < k; ++j) st8(out, (long long)slots[r * k + j] * cols + c, v);
    } else {
        ld8(x, c, v);
        st8(out, (long long)gaps[r - tokens] * cols + c, v);
    }
}

#define SPREAD_ENTRY(NAME, T)                                                                  \
    extern "C" __global__ void spread_rows_##NAME(T* out, const T* x, const u32* slots,        \
                                                  int tokens, int k, const u32* gaps,          \
                                                  int n_gaps, int cols) {                      \
        spread(out, x, slots, tokens, k, gaps, n_gaps, cols);                                  \
    }

SPREAD_ENTRY(bf16, bf16_t)
SPREAD_ENTRY(f32, float)
