// What follows a GEMM that wrote f32 (or, from 8-bit integer operands, exact int32) sums:
// out = (acc * col_scale[c] + acc2 * col_scale2[c]) * row_scale[r] + bias[c], each part left
// out where its pointer is null, rounded once to the activation type (as a fused epilogue
// would). In f32 `out` may be `acc` itself. The scales are the 8-bit operands' (a channel's
// weight scale, a token's activation scale); `acc2` and `col_scale2` are an INT8 weight's
// residual sums and unit (int8_residual.cu); the bias is the linear's, in f32.
template <typename Tacc, typename T>
__device__ void epilogue_t(T* out, const Tacc* acc, const Tacc* acc2, const float* row_scale,
                           const float* col_scale, const float* col_scale2, const float* bias,
                           int rows, int cols) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long long)rows * cols) return;
    int r = (int)(i / cols), c = (int)(i % cols);
    float v = (float)acc[i];
    if (col_scale) v *= col_scale[c];
    if (acc2) v += (float)acc2[i] * col_scale2[c];
    if (row_scale) v *= row_scale[r];
    if (bias) v += bias[c];
    st(out, i, v);
}

// gemm_epilogue_<acc>_<out>.
#define EPILOGUE_ENTRY(ACC, TACC, OUT, TOUT)                                                   \
    extern "C" __global__ void gemm_epilogue_##ACC##_##OUT(                                    \
        TOUT* out, const TACC* acc, const TACC* acc2, const float* row_scale,                  \
        const float* col_scale, const float* col_scale2, const float* bias, int rows,          \
        int cols) {                                                                            \
        epilogue_t(out, acc, acc2, row_scale, col_scale, col_scale2, bias, rows, cols);        \
    }

EPILOGUE_ENTRY(f32, float, bf16, bf16_t)
EPILOGUE_ENTRY(f32, float, f32, float)
EPILOGUE_ENTRY(i32, int, bf16, bf16_t)
EPILOGUE_ENTRY(i32, int, f32, float)
