// acc[t, :] = sum over token t's k picks of weight[p] * y[p, :] (or with `add`, acc[t, :] +=
// that sum: a mixture added straight into the residual stream), the picks' rows `p` (their
// `slots`, where routing put them) taken in ascending order: the rows are grouped by expert in
// expert order, so this is the order of transformers' expert loop, and each term is rounded to
// f32 before the sum as its `index_add_(out * weight)` does. The same values as k
// scatter_add.cu launches, expert by expert, into a zeroed accumulator; one pass instead.
// One thread per 8 consecutive values of a row (cols is a multiple of 8).

#define MAX_K 32

// This thread's token t and first column c (one thread per 8 values of a row); false past the
// last token.
__device__ __forceinline__ bool token_chunk(int tokens, int cols, long long& t, long long& c) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    int chunks = cols >> 3;
    if (i >= (long long)tokens * chunks) return false;
    t = i / chunks;
    c = (i % chunks) << 3;
    return true;
}

// acc[t, c .. c + 8] = a, or with `add` += a.
__device__ __forceinline__ void store_sum(float* acc, float (&a)[8], long long t, long long c,
                                          int cols, int add) {
    if (add) {
        float r[8];
        ld8(acc, t * cols + c, r);
#pragma unroll
        for (int q = 0; q < 8; ++q) a[q] = __fadd_rn(r[q], a[q]);
    }
    st8(acc, t * cols + c, a);
}

// Any k up to MAX_K: the picks sorted by insertion (in local memory: their places vary).
template <typename T>
__device__ void combine(float* acc, const T* y, const u32* slots, const float* weights,
                        int tokens, int k, int cols, int add) {
    long long t, c;
    if (!token_chunk(tokens, cols, t, c)) return;
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
    store_sum(acc, a, t, c, cols, add);
}

// K known: the picks sorted by a network of compare-exchanges and every row's load issued
// before the sum needs it, all in registers (the general loop keeps one load in flight and
// its picks in local memory). The same sum in the same order.
template <int K, typename T>
__device__ void combine_k(float* acc, const T* y, const u32* slots, const float* weights,
                          int tokens, int cols, int add) {
    long long t, c;
    if (!token_chunk(tokens, cols, t, c)) return;
    u32 p[K];
#pragma unroll
    for (int j = 0; j < K; ++j) p[j] = slots[t * K + j];
#pragma unroll
    for (int m = 0; m < K - 1; ++m)
#pragma unroll
        for (int j = 0; j < K - 1 - m; ++j) {
            u32 lo = min(p[j], p[j + 1]), hi = max(p[j], p[j + 1]);
            p[j] = lo;
            p[j + 1] = hi;
        }
    float v[K][8], w[K];
#pragma unroll
    for (int j = 0; j < K; ++j) {
        ld8(y, (long long)p[j] * cols + c, v[j]);
        w[j] = weights[p[j]];
    }
    float a[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int j = 0; j < K; ++j)
#pragma unroll
        for (int q = 0; q < 8; ++q) a[q] = __fadd_rn(a[q], __fmul_rn(v[j][q], w[j]));
    store_sum(acc, a, t, c, cols, add);
}

// The usual picks per token (Mixtral's 2, Qwen2-MoE's and gpt-oss's 4, Qwen3's and
// DeepSeek's 8) unrolled, any other k by the general loop.
template <typename T>
__device__ void combine_any(float* acc, const T* y, const u32* slots, const float* weights,
                            int tokens, int k, int cols, int add) {
    switch (k) {
    case 2: combine_k<2>(acc, y, slots, weights, tokens, cols, add); break;
    case 4: combine_k<4>(acc, y, slots, weights, tokens, cols, add); break;
    case 8: combine_k<8>(acc, y, slots, weights, tokens, cols, add); break;
    default: combine(acc, y, slots, weights, tokens, k, cols, add);
    }
}

extern "C" __global__ void combine_experts_bf16(float* acc, const bf16_t* y, const u32* slots,
                                                const float* weights, int tokens, int k,
                                                int cols, int add) {
    combine_any(acc, y, slots, weights, tokens, k, cols, add);
}

extern "C" __global__ void combine_experts_f32(float* acc, const float* y, const u32* slots,
                                               const float* weights, int tokens, int k,
                                               int cols, int add) {
    combine_any(acc, y, slots, weights, tokens, k, cols, add);
}
