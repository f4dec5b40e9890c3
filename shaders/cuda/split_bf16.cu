// An f32 matrix as two bf16 parts, for products of f32 operands on bf16 tensor cores (`--dtype
// split-bf16`): v = hi + lo + r with hi = bf16(v), lo = bf16(v - hi) (v - hi is exact in f32)
// and |r| <= 2^-16 |v|. For a GEMM each row becomes two column blocks, the residual first where
// `lo_first` says so: activations [hi | lo] and weights [lo | hi], so a GEMM over the doubled
// inner dimension sums hi*lo + lo*hi and one over the halves hi*hi (the dropped lo*lo and r
// terms are ~2^-16 of each product). With `planes` the parts are whole planes instead, every
// row's hi, then every row's lo (attention's operands, flash_attention.cu, and activations
// against weights whose values are bf16).
extern "C" __global__ void split_bf16(bf16_t* out, const float* in, int rows, int cols,
                                      int lo_first, int planes) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    long long n = (long long)rows * cols;
    if (i >= n) return;
    float v = in[i];
    bf16_t hi = f32_to_bf16(v);
    bf16_t lo = f32_to_bf16(v - bf16_to_f32(hi));
    long long r = i / cols, c = i % cols;
    // Parts are n apart as planes, cols apart in rows of 2 * cols as blocks.
    long long first = planes ? i : 2 * r * cols + c, step = planes ? n : cols;
    out[first] = lo_first ? lo : hi;
    out[first + step] = lo_first ? hi : lo;
}
