// y_bf16 = RN_bf16(y_f32 + bias): the GEMM of a layer with bias writes f32 so the sum is
// rounded once, as a fused bias epilogue would.
extern "C" __global__ void bias_add(bf16_t* out, const float* y, const float* bias, int rows,
                                    int cols) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long long)rows * cols) return;
    out[i] = f32_to_bf16(y[i] + bias[i % cols]);
}
