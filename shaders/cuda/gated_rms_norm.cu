// The recurrent layers' gated RMSNorm over groups of d values of x (mode: NormGate's numbers):
// 0 normed, times weight, times silu(gate) (gated DeltaNet's RMSNormGated, a group a head); 1
// gated by silu(gate), then normed, times weight (Mamba-2's); 2 normed, times weight, times
// sigmoid(gate) (Kimi Delta Attention's o_norm). The weight (wlen values) repeats along the row
// where shorter. A warp per group, 8 groups a block; f32 math, one rounding per bf16 output.
template <typename Tin, typename Tout>
__device__ void gated_rms_norm_t(Tout* y, const Tin* x, const Tin* gate, const float* w,
                                 long long groups, int d, int wlen, int mode, float eps) {
    long long group = (long long)blockIdx.x * 8 + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (group >= groups) return;
    long long base = group * d;
    const bool gate_first = mode == 1;
    auto act = [mode](float g) { return (mode == 2 ? 1.0f : g) / (1.0f + expf(-g)); };
    float ss = 0.0f;
    for (int c = lane; c < d; c += 32) {
        float v = ld(x, base + c);
        if (gate_first) v *= act(ld(gate, base + c));
        ss += v * v;
    }
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    float inv = 1.0f / sqrtf(ss / d + eps);
    for (int c = lane; c < d; c += 32) {
        float g = act(ld(gate, base + c)), wc = w[(base + c) % wlen];
        float v = ld(x, base + c);
        st(y, base + c, gate_first ? wc * (v * g * inv) : wc * (v * inv) * g);
    }
}

#define GATED_RMS_NORM_ENTRY(IN, TIN, OUT, TOUT)                                               \
    extern "C" __global__ void gated_rms_norm_##IN##_##OUT(                                    \
        TOUT* y, const TIN* x, const TIN* gate, const float* w, long long groups, int d,       \
        int wlen, int mode, float eps) {                                                       \
        gated_rms_norm_t(y, x, gate, w, groups, d, wlen, mode, eps);                           \
    }

GATED_RMS_NORM_ENTRY(bf16, bf16_t, bf16, bf16_t)
GATED_RMS_NORM_ENTRY(bf16, bf16_t, f32, float)
GATED_RMS_NORM_ENTRY(f32, float, bf16, bf16_t)
GATED_RMS_NORM_ENTRY(f32, float, f32, float)
