// The residual add and the SwiGLU gate: f32 math, one bf16 rounding per bf16 output.
extern "C" __global__ void add_assign(bf16_t* x, const bf16_t* y, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = f32_to_bf16(bf16_to_f32(x[i]) + bf16_to_f32(y[i]));
}

// The residual stream is kept in f32: it accumulates every layer's output, and rounding it to
// bf16 after each add is the largest error of a bf16 forward against the f32 reference.
extern "C" __global__ void add_assign_f32(float* x, const bf16_t* y, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += bf16_to_f32(y[i]);
}

extern "C" __global__ void silu_mul(bf16_t* out, const bf16_t* gate, const bf16_t* up,
                                    long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float g = bf16_to_f32(gate[i]);
    out[i] = f32_to_bf16(g / (1.0f + expf(-g)) * bf16_to_f32(up[i]));
}

// f32 -> bf16 (round to nearest even): activations handed in as f32 vectors (the generic op
// checks upload them with upload_vector) enter the bf16 ops through this.
extern "C" __global__ void to_bf16(bf16_t* out, const float* x, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = f32_to_bf16(x[i]);
}
