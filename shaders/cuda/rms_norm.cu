// y = weight * (x * rsqrt(mean(x^2) + eps)), one block per row, the sum of squares in f64 (as
// the CPU reference). Input: the f32 residual stream or a q/k activation; output: the
// activation type.
template <typename Ti, typename To>
__device__ void rms_norm_row(To* out, const Ti* x, const float* weight, int cols, float eps) {
    const Ti* row = x + (long long)blockIdx.x * cols;
    To* orow = out + (long long)blockIdx.x * cols;
    bool vec = (cols & 7) == 0;  // whole 16-byte accesses from every row start
    double ss = 0.0;
    if (vec) {
        for (int c = 8 * threadIdx.x; c < cols; c += 8 * blockDim.x) {
            float v[8];
            ld8(row, c, v);
#pragma unroll
            for (int j = 0; j < 8; ++j) ss += (double)v[j] * v[j];
        }
    } else {
        for (int c = threadIdx.x; c < cols; c += blockDim.x) {
            double v = ld(row, c);
            ss += v * v;
        }
    }
    ss = block_sum_f64(ss);
    float inv = 1.0f / sqrtf((float)(ss / (double)cols) + eps);
    if (vec) {
        for (int c = 8 * threadIdx.x; c < cols; c += 8 * blockDim.x) {
            float v[8], w[8];
            ld8(row, c, v);
            ld8(weight, c, w);
#pragma unroll
            for (int j = 0; j < 8; ++j) v[j] = w[j] * (v[j] * inv);
            st8(orow, c, v);
        }
    } else {
        for (int c = threadIdx.x; c < cols; c += blockDim.x)
            st(orow, c, weight[c] * (ld(row, c) * inv));
    }
}

extern "C" __global__ void rms_norm_bf16(bf16_t* out, const bf16_t* x, const float* weight,
                                         int cols, float eps) {
    rms_norm_row(out, x, weight, cols, eps);
}

extern "C" __global__ void rms_norm_f32_bf16(bf16_t* out, const float* x, const float* weight,
                                             int cols, float eps) {
    rms_norm_row(out, x, weight, cols, eps);
}

extern "C" __global__ void rms_norm_f32(float* out, const float* x, const float* weight,
                                        int cols, float eps) {
    rms_norm_row(out, x, weight, cols, eps);
}
