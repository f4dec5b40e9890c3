// nvrtc: exact
// An f32 matrix as bf16 parts, for products of f32 operands on bf16 tensor cores: v = hi + lo
// + r with hi = bf16(v), lo = bf16(v - hi) (v - hi is exact in f32) and |r| <= 2^-16 |v|. For
// a GEMM (`--dtype split-bf16`) each row becomes two column blocks, the residual first where
// `lo_first` says so: activations [hi | lo] and weights [lo | hi], so a GEMM over the doubled
// inner dimension sums hi*lo + lo*hi and one over the halves hi*hi (the dropped lo*lo and r
// terms are ~2^-16 of each product). With `planes` the parts are whole planes instead: every
// row's hi at `out`, then the residuals at `rest`, every row's lo and, where `parts` is 3, every
// row's r = v - hi - lo after them (`split3` in common.cuh: hi + lo + r == v exactly, so
// products against bf16 weights are exact in f32 part by part: the router's f32 input).
extern "C" __global__ void split_bf16(bf16_t* out, bf16_t* rest, const float* in, int rows,
                                      int cols, int lo_first, int planes, int parts) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    long long n = (long long)rows * cols;
    if (i >= n) return;
    float h, l, left;
    split3(in[i], h, l, left);  // every part already a bf16 value: stored exactly
    bf16_t hi = f32_to_bf16(h), lo = f32_to_bf16(l);
    if (planes) {
        out[i] = hi;
        rest[i] = lo;
        if (parts == 3) rest[n + i] = f32_to_bf16(left);
        return;
    }
    // Parts are cols apart in rows of 2 * cols.
    long long r = i / cols, c = i % cols;
    long long first = 2 * r * cols + c;
    out[first] = lo_first ? lo : hi;
    out[first + cols] = lo_first ? hi : lo;
}
