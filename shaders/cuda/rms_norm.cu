// y = weight * (x * rsqrt(mean(x^2) + eps)), one block per row, f32 math, bf16 in and out.
extern "C" __global__ void rms_norm(bf16_t* out, const bf16_t* x, const float* weight, int cols,
                                    float eps) {
    const bf16_t* row = x + (long long)blockIdx.x * cols;
    bf16_t* orow = out + (long long)blockIdx.x * cols;
    float ss = 0.0f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        float v = bf16_to_f32(row[c]);
        ss += v * v;
    }
    ss = block_sum(ss);
    float inv = 1.0f / sqrtf(ss / (float)cols + eps);
    for (int c = threadIdx.x; c < cols; c += blockDim.x)
        orow[c] = f32_to_bf16(weight[c] * (bf16_to_f32(row[c]) * inv));
}
