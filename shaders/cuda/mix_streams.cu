// DeepSeek-V4's hyper-connections (`Backend::mix_streams`): out[r, k, c] = sum_j w[r, j * m + k]
// * s[r, j, c] over the n streams of each row (f32, the sum in stream order), plus
// scales[r, k] * x[r, c] where `x` is given (the block's output, of type T, spread over the
// streams); f32 out. m = 1 collapses the streams, m = n mixes them. A thread a value.
template <typename T>
__device__ void mix_streams_t(float* out, const float* s, const float* w, const T* x,
                              const float* scales, long long rows, int n, int m, int d) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    long long per_row = (long long)m * d;
    if (i >= rows * per_row) return;
    long long r = i / per_row;
    int k = (int)(i % per_row) / d, c = (int)(i % d);
    float acc = 0.0f;
    for (int j = 0; j < n; ++j)
        acc = __fadd_rn(acc, __fmul_rn(w[r * n * m + j * m + k], s[(r * n + j) * d + c]));
    if (x) acc = __fadd_rn(__fmul_rn(scales[r * m + k], ld(x, r * d + c)), acc);
    out[i] = acc;
}

#define MIX_ENTRY(IN, TIN)                                                                   \
    extern "C" __global__ void mix_streams_##IN(float* out, const float* s, const float* w, \
                                                const TIN* x, const float* scales,          \
                                                long long rows, int n, int m, int d) {      \
        mix_streams_t(out, s, w, x, scales, rows, n, m, d);                                  \
    }

MIX_ENTRY(bf16, bf16_t)
MIX_ENTRY(f32, float)
