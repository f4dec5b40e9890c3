// An f32 matrix as bf16 parts, for products of f32 operands on bf16 tensor cores (`--dtype
// split-bf16`): v = hi + lo + r with hi = bf16(v), lo = bf16(v - hi) (v - hi is exact in f32)
// and |r| <= 2^-16 |v|. For a GEMM each row becomes `parts` column blocks, block i the residual
// where bit i of `lo_parts` is set, else the high part: activations [hi | hi | lo] and weights
// [hi | lo | hi], so one GEMM over the tripled inner dimension sums hi*hi + hi*lo + lo*hi in
// f32 (the dropped lo*lo and r terms are ~2^-16 of each product). With `planes` the parts are
// whole planes instead, every row's hi, then every row's lo (attention's operands,
// flash_attention.cu, and activations against weights whose values are bf16).
extern "C" __global__ void split_bf16(bf16_t* out, const float* in, int rows, int cols,
                                      int parts, int lo_parts, int planes) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    long long n = (long long)rows * cols;
    if (i >= n) return;
    float v = in[i];
    bf16_t hi = f32_to_bf16(v);
    bf16_t lo = f32_to_bf16(v - bf16_to_f32(hi));
    long long r = i / cols, c = i % cols;
    // Part p of element i: planes are n apart; blocks of a row cols apart in rows of parts*cols.
    long long first = planes ? i : r * parts * cols + c, step = planes ? n : cols;
    for (int p = 0; p < parts; ++p) out[first + p * step] = (lo_parts >> p) & 1 ? lo : hi;
}
