// y = weight * (x * rsqrt(mean(x^2) + eps)), one block per row, f32 math, bf16 out. The input
// is bf16 (q/k norms) or the f32 residual stream.
__device__ __forceinline__ float load(const bf16_t* p, long long i) { return bf16_to_f32(p[i]); }
__device__ __forceinline__ float load(const float* p, long long i) { return p[i]; }

template <typename T>
__device__ void rms_norm_row(bf16_t* out, const T* x, const float* weight, int cols, float eps) {
    const T* row = x + (long long)blockIdx.x * cols;
    bf16_t* orow = out + (long long)blockIdx.x * cols;
    float ss = 0.0f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        float v = load(row, c);
        ss += v * v;
    }
    ss = block_sum(ss);
    float inv = 1.0f / sqrtf(ss / (float)cols + eps);
    for (int c = threadIdx.x; c < cols; c += blockDim.x)
        orow[c] = f32_to_bf16(weight[c] * (load(row, c) * inv));
}

extern "C" __global__ void rms_norm(bf16_t* out, const bf16_t* x, const float* weight, int cols,
                                    float eps) {
    rms_norm_row(out, x, weight, cols, eps);
}

extern "C" __global__ void rms_norm_f32in(bf16_t* out, const float* x, const float* weight,
                                         int cols, float eps) {
    rms_norm_row(out, x, weight, cols, eps);
}
