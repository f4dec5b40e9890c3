// DeepSeek-V4's hyper-connections (`Backend::mix_streams`): out[r, k, c] = sum_j w[r, j * m + k]
// * s[r, j, c] over the n streams of each row (f32, the sum in stream order), plus
// scales[r, k] * x[r, c] where `x` is given (the block's output, of type T, spread over the
// streams); f32 out. m = 1 collapses the streams, m = n mixes them. A thread a column of a
// row: it reads the column's n stream values once and writes its m outputs (a thread a value
// read each stream value m times).
#define MIX_MAX_STREAMS 8

template <typename T>
__device__ void mix_streams_t(float* out, const float* s, const float* w, const T* x,
                              const float* scales, long long rows, int n, int m, int d) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= rows * d) return;
    long long r = i / d;
    int c = (int)(i % d);
    float v[MIX_MAX_STREAMS];
#pragma unroll
    for (int j = 0; j < MIX_MAX_STREAMS; ++j) v[j] = j < n ? s[(r * n + j) * d + c] : 0.0f;
    float xc = x ? ld(x, r * d + c) : 0.0f;
    const float* wr = w + r * n * m;
    for (int k = 0; k < m; ++k) {
        float acc = 0.0f;
#pragma unroll
        for (int j = 0; j < MIX_MAX_STREAMS; ++j)
            if (j < n) acc = __fadd_rn(acc, __fmul_rn(wr[j * m + k], v[j]));
        if (x) acc = __fadd_rn(__fmul_rn(scales[r * m + k], xc), acc);
        out[(r * m + k) * d + c] = acc;
    }
}

#define MIX_ENTRY(IN, TIN)                                                                   \
    extern "C" __global__ void mix_streams_##IN(float* out, const float* s, const float* w, \
                                                const TIN* x, const float* scales,          \
                                                long long rows, int n, int m, int d) {      \
        mix_streams_t(out, s, w, x, scales, rows, n, m, d);                                  \
    }

MIX_ENTRY(bf16, bf16_t)
MIX_ENTRY(f32, float)
