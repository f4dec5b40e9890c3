// The depthwise causal convolution of the recurrent layers: y[t, c] = act(bias[c] + sum_j
// w[c, j] * x[t - K + 1 + j, c]), taps before the token's sequence reading zeros; act SiLU
// where `silu` (gated DeltaNet, Mamba-2), else none (LFM2); `bias` may be null. A thread per
// channel and CONV_TOKENS consecutive tokens (a warp's reads of a token's row coalesced, each
// input read again by the next taps from L1), f32 sums, one rounding per bf16 output. Eight
// channels a thread in 16-byte accesses measured slower (too few threads to hide the loads).
#define CONV_TOKENS 16  // causal_conv.rs TOKENS_A_THREAD
template <typename Tin, typename Tout>
__device__ void causal_conv_t(Tout* y, const Tin* x, const float* w, const float* bias,
                              const u32* seq_start, long long tokens, int channels, int taps,
                              int silu) {
    const int c = blockIdx.y * blockDim.x + threadIdx.x;
    if (c >= channels) return;
    const float* wc = w + (long long)c * taps;
    const long long t0 = (long long)blockIdx.x * CONV_TOKENS;
    for (long long t = t0; t < t0 + CONV_TOKENS && t < tokens; ++t) {
        const long long first = seq_start[t];
        float s = 0.0f;
        for (int j = 0; j < taps; ++j) {
            const long long src = t - (taps - 1) + j;
            if (src >= first) s += wc[j] * ld(x, src * channels + c);
        }
        if (bias) s += bias[c];
        st(y, t * channels + c, silu ? s / (1.0f + expf(-s)) : s);
    }
}

#define CAUSAL_CONV_ENTRY(IN, TIN, OUT, TOUT)                                                  \
    extern "C" __global__ void causal_conv_##IN##_##OUT(                                       \
        TOUT* y, const TIN* x, const float* w, const float* bias, const u32* seq_start,        \
        long long tokens, int channels, int taps, int silu) {                                  \
        causal_conv_t(y, x, w, bias, seq_start, tokens, channels, taps, silu);                 \
    }

CAUSAL_CONV_ENTRY(bf16, bf16_t, bf16, bf16_t)
CAUSAL_CONV_ENTRY(bf16, bf16_t, f32, float)
CAUSAL_CONV_ENTRY(f32, float, bf16, bf16_t)
CAUSAL_CONV_ENTRY(f32, float, f32, float)
