// acc[rows[i], :] += weights[i] * y[i, :]: one expert's output rows (activation type), scaled by
// each token's routing weight and added into the mixture's f32 accumulator. The product is
// rounded to f32 before the sum, as transformers' `index_add_(out * weight)` does. The rows
// of one group are distinct, so no two threads write the same value.
template <typename T>
__device__ void scatter_add(float* acc, const T* y, const u32* rows, const float* weights,
                            int n_rows, int cols) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long long)n_rows * cols) return;
    long long r = i / cols;
    long long e = (long long)rows[r] * cols + i % cols;
    acc[e] = __fadd_rn(acc[e], __fmul_rn(ld(y, i), weights[r]));
}

extern "C" __global__ void scatter_add_bf16(float* acc, const bf16_t* y, const u32* rows,
                                            const float* weights, int n_rows, int cols) {
    scatter_add(acc, y, rows, weights, n_rows, cols);
}

extern "C" __global__ void scatter_add_f32(float* acc, const float* y, const u32* rows,
                                           const float* weights, int n_rows, int cols) {
    scatter_add(acc, y, rows, weights, n_rows, cols);
}
