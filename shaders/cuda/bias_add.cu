// out = y + bias from the f32 GEMM output, rounded once to the activation type (as a fused
// bias epilogue would). In f32 `out` may be `y` itself.
template <typename T>
__device__ void bias_add_t(T* out, const float* y, const float* bias, int rows, int cols) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long long)rows * cols) return;
    st(out, i, y[i] + bias[i % cols]);
}

extern "C" __global__ void bias_add_bf16(bf16_t* out, const float* y, const float* bias, int rows,
                                         int cols) {
    bias_add_t(out, y, bias, rows, cols);
}

extern "C" __global__ void bias_add_f32(float* out, const float* y, const float* bias, int rows,
                                        int cols) {
    bias_add_t(out, y, bias, rows, cols);
}
