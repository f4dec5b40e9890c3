// What follows a GEMM that wrote f32 (or, from 8-bit integer operands, exact int32) sums:
// out = acc * row_scale[r] * col_scale[c] + bias[c], each factor left out where its pointer is
// null, rounded once to the activation type (as a fused epilogue would). In f32 `out` may be
// `acc` itself. The scales are the 8-bit operands' (a token's activation scale, a channel's
// weight scale); the bias is the linear's, in f32.
template <typename Tacc, typename T>
__device__ void epilogue_t(T* out, const Tacc* acc, const float* row_scale,
                           const float* col_scale, const float* bias, int rows, int cols) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long long)rows * cols) return;
    int r = (int)(i / cols), c = (int)(i % cols);
    float v = (float)acc[i];
    if (row_scale) v *= row_scale[r];
    if (col_scale) v *= col_scale[c];
    if (bias) v += bias[c];
    st(out, i, v);
}

// gemm_epilogue_<acc>_<out>.
#define EPILOGUE_ENTRY(ACC, TACC, OUT, TOUT)                                                   \
    extern "C" __global__ void gemm_epilogue_##ACC##_##OUT(                                    \
        TOUT* out, const TACC* acc, const float* row_scale, const float* col_scale,            \
        const float* bias, int rows, int cols) {                                               \
        epilogue_t(out, acc, row_scale, col_scale, bias, rows, cols);                          \
    }

EPILOGUE_ENTRY(f32, float, bf16, bf16_t)
EPILOGUE_ENTRY(f32, float, f32, float)
EPILOGUE_ENTRY(i32, int, bf16, bf16_t)
EPILOGUE_ENTRY(i32, int, f32, float)
