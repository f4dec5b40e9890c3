// Gated DeltaNet's RMSNormGated: each d-wide head of x RMS-normed, times weight, times
// silu(gate). A warp per head, 8 heads a block; f32 math, one rounding per bf16 output.
template <typename Tin, typename Tout>
__device__ void gated_rms_norm_t(Tout* y, const Tin* x, const Tin* gate, const float* w,
                                 long long heads, int d, float eps) {
    long long head = (long long)blockIdx.x * 8 + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (head >= heads) return;
    long long base = head * d;
    float ss = 0.0f;
    for (int c = lane; c < d; c += 32) {
        float v = ld(x, base + c);
        ss += v * v;
    }
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    float inv = 1.0f / sqrtf(ss / d + eps);
    for (int c = lane; c < d; c += 32) {
        float g = ld(gate, base + c);
        st(y, base + c, w[c] * (ld(x, base + c) * inv) * (g / (1.0f + expf(-g))));
    }
}

#define GATED_RMS_NORM_ENTRY(IN, TIN, OUT, TOUT)                                               \
    extern "C" __global__ void gated_rms_norm_##IN##_##OUT(TOUT* y, const TIN* x,              \
                                                           const TIN* gate, const float* w,    \
                                                           long long heads, int d, float eps) { \
        gated_rms_norm_t(y, x, gate, w, heads, d, eps);                                        \
    }

GATED_RMS_NORM_ENTRY(bf16, bf16_t, bf16, bf16_t)
GATED_RMS_NORM_ENTRY(bf16, bf16_t, f32, float)
GATED_RMS_NORM_ENTRY(f32, float, bf16, bf16_t)
GATED_RMS_NORM_ENTRY(f32, float, f32, float)
