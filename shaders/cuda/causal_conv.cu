// The depthwise causal convolution of the recurrent layers: y[t, c] = act(bias[c] + sum_j
// w[c, j] * x[t - K + 1 + j, c]), taps before the token's sequence reading zeros; act SiLU
// where `silu` (gated DeltaNet, Mamba-2), else none (LFM2); `bias` may be null. One thread per
// output value, f32 sums, one rounding per bf16 output.
template <typename Tin, typename Tout>
__device__ void causal_conv_t(Tout* y, const Tin* x, const float* w, const float* bias,
                              const u32* seq_start, long long n, int channels, int taps,
                              int silu) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    long long t = i / channels;
    int c = (int)(i % channels);
    long long first = seq_start[t];
    float s = 0.0f;
    for (int j = 0; j < taps; ++j) {
        long long src = t - (taps - 1) + j;
        if (src >= first) s += w[(long long)c * taps + j] * ld(x, src * channels + c);
    }
    if (bias) s += bias[c];
    st(y, i, silu ? s / (1.0f + expf(-s)) : s);
}

#define CAUSAL_CONV_ENTRY(IN, TIN, OUT, TOUT)                                                  \
    extern "C" __global__ void causal_conv_##IN##_##OUT(                                       \
        TOUT* y, const TIN* x, const float* w, const float* bias, const u32* seq_start,        \
        long long n, int channels, int taps, int silu) {                                       \
        causal_conv_t(y, x, w, bias, seq_start, n, channels, taps, silu);                      \
    }

CAUSAL_CONV_ENTRY(bf16, bf16_t, bf16, bf16_t)
CAUSAL_CONV_ENTRY(bf16, bf16_t, f32, float)
CAUSAL_CONV_ENTRY(f32, float, bf16, bf16_t)
CAUSAL_CONV_ENTRY(f32, float, f32, float)
