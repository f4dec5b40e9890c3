// A weight whose values are bf16 as f16 times a power of two (`scale`, lowering.rs
// `f16_exact_scale`), for `split_gemm.cu`: bf16's 8 significant bits fit f16's 11, and the
// scale keeps the layer inside f16's range, so every value is exact. Eight values a thread
// (`n` a multiple of 8), 16-byte loads and stores.
extern "C" __global__ void weight_f16(uint4* out, const bf16_t* w, long long n, float scale) {
    long long i = ((long long)blockIdx.x * blockDim.x + threadIdx.x) * 8;
    if (i >= n) return;
    float v[8];
    ld8(w, i, v);
#pragma unroll
    for (int j = 0; j < 8; ++j) v[j] *= scale;
    out[i / 8] = pack8_f16(v);
}
