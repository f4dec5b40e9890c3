// acc[t, :] = sum over token t's k picks of weight[p] * y[p, :] (or with `add`, acc[t, :] +=
// that sum: a mixture added straight into the residual stream), the picks' rows `p` (their
// `slots`, where routing put them) taken in ascending order: the rows are grouped by expert in
// expert order, so this is the order of transformers' expert loop, and each term is rounded to
// f32 before the sum as its `index_add_(out * weight)` does. The same values as k
// scatter_add.cu launches, expert by expert, into a zeroed accumulator; one pass instead.
// One thread per 8 consecutive values of a row (cols is a multiple of 8).

#define MAX_K 32

template <typename T>
__device__ void combine(float* acc, const T* y, const u32* slots, const float* weights,
                        int tokens, int k, int cols, int add) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    int chunks = cols >> 3;
    if (i >= (long long)tokens * chunks) return;
    long long t = i / chunks, c = (i % chunks) << 3;
    u32 p[MAX_K];
    for (int j = 0; j < k; ++j) {
        u32 v = slots[t * k + j];
        int m = j;
        for (; m > 0 && p[m - 1] > v; --m) p[m] = p[m - 1];
        p[m] = v;
    }
    float a[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    for (int j = 0; j < k; ++j) {
        float v[8];
        ld8(y, (long long)p[j] * cols + c, v);
        float w = weights[p[j]];
#pragma unroll
        for (int q = 0; q < 8; ++q) a[q] = __fadd_rn(a[q], __fmul_rn(v[q], w));
    }
    if (add) {
        float r[8];
        ld8(acc, t * cols + c, r);
#pragma unroll
        for (int q = 0; q < 8; ++q) a[q] = __fadd_rn(r[q], a[q]);
    }
    st8(acc, t * cols + c, a);
}

extern "C" __global__ void combine_experts_bf16(float* acc, const bf16_t* y, const u32* slots,
                                                const float* weights, int tokens, int k,
                                                int cols, int add) {
    combine(acc, y, slots, weights, tokens, k, cols, add);
}

extern "C" __global__ void combine_experts_f32(float* acc, const float* y, const u32* slots,
                                               const float* weights, int tokens, int k,
                                               int cols, int add) {
    combine(acc, y, slots, weights, tokens, k, cols, add);
}
