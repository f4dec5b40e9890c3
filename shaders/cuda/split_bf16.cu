// An f32 matrix as three bf16 column blocks per row, for GEMMs of f32 operands on bf16 tensor
// cores (`--dtype split-bf16`): v = hi + lo + r with hi = bf16(v), lo = bf16(v - hi) (v - hi
// is exact in f32) and |r| <= 2^-16 |v|. Activations are laid out [hi | hi | lo], weights
// [hi | lo | hi], so one GEMM over the tripled inner dimension sums hi*hi + hi*lo + lo*hi in
// f32; the dropped lo*lo and r terms are ~2^-16 of each product. Attention's operands are laid
// out as two planes instead, every row's hi, then every row's lo (flash_attention.cu).
#define LAYOUT_WEIGHTS 1
#define LAYOUT_PLANES 2

extern "C" __global__ void split_bf16(bf16_t* out, const float* in, int rows, int cols,
                                      int layout) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    long long n = (long long)rows * cols;
    if (i >= n) return;
    float v = in[i];
    bf16_t hi = f32_to_bf16(v);
    bf16_t lo = f32_to_bf16(v - bf16_to_f32(hi));
    if (layout == LAYOUT_PLANES) {
        out[i] = hi;
        out[n + i] = lo;
        return;
    }
    long long r = i / cols, c = i % cols;
    bf16_t* o = out + r * 3 * cols + c;
    o[0] = hi;
    o[cols] = layout == LAYOUT_WEIGHTS ? lo : hi;
    o[2 * cols] = layout == LAYOUT_WEIGHTS ? hi : lo;
}
