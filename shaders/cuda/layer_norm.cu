// LayerNorm, one block per row: y = (x - mean) / sqrt(var + eps) * weight + bias, the mean and
// the (biased) variance summed in f64 as the CPU reference does; one rounding per bf16 output.
template <typename Tin, typename Tout>
__device__ void layer_norm_t(Tout* y, const Tin* x, const float* weight, const float* bias,
                             int cols, float eps) {
    long long base = (long long)blockIdx.x * cols;
    double s = 0.0;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) s += ld(x, base + c);
    double mean = block_sum_f64(s) / cols;
    double ss = 0.0;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        double d = ld(x, base + c) - mean;
        ss += d * d;
    }
    double inv = 1.0 / sqrt(block_sum_f64(ss) / cols + eps);
    for (int c = threadIdx.x; c < cols; c += blockDim.x)
        st(y, base + c, (float)((ld(x, base + c) - mean) * inv * weight[c] + bias[c]));
}

#define LAYER_NORM_ENTRY(IN, TIN, OUT, TOUT)                                                   \
    extern "C" __global__ void layer_norm_##IN##_##OUT(TOUT* y, const TIN* x, const float* w,  \
                                                       const float* b, int cols, float eps) {  \
        layer_norm_t(y, x, w, b, cols, eps);                                                   \
    }

LAYER_NORM_ENTRY(bf16, bf16_t, bf16, bf16_t)
LAYER_NORM_ENTRY(bf16, bf16_t, f32, float)
LAYER_NORM_ENTRY(f32, float, bf16, bf16_t)
LAYER_NORM_ENTRY(f32, float, f32, float)
