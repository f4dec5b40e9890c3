// acc[rows[i], :] += weights[i] * y[i, :]: one expert's output rows (activation type), scaled by
// each token's routing weight and added into the mixture's f32 accumulator. The product is
// rounded to f32 before the sum, as transformers' `index_add_(out * weight)` does. The rows
// of one group are distinct, so no two threads write the same value.
// One thread per 8 consecutive values when cols is a multiple of 8 (the launcher sizes the
// grid by `cols % 8`), else one per value.
template <typename T>
__device__ void scatter_add(float* acc, const T* y, const u32* rows, const float* weights,
                            int n_rows, int cols) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if ((cols & 7) == 0) {
        int chunks = cols >> 3;
        if (i >= (long long)n_rows * chunks) return;
        long long r = i / chunks, c = (i % chunks) << 3;
        long long e = (long long)rows[r] * cols + c;
        float a[8], v[8];
        ld8(acc, e, a);
        ld8(y, r * cols + c, v);
#pragma unroll
        for (int j = 0; j < 8; ++j) a[j] = __fadd_rn(a[j], __fmul_rn(v[j], weights[r]));
        st8(acc, e, a);
        return;
    }
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
