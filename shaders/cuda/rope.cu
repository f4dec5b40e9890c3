// Rotate-half RoPE in place: x[t, h, i] and x[t, h, i + half] rotated by the angle of the
// token's position; cos/sin are f32 tables [max_position, half]. One thread per pair.
template <typename T>
__device__ void rope_t(T* x, const u32* positions, const float* cos_t, const float* sin_t,
                       int tokens, int heads, int head_dim) {
    int half = head_dim / 2;
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long long)tokens * heads * half) return;
    int k = (int)(i % half);
    long long th = i / half;  // token * heads + head
    long long t = th / heads;
    long long p = (long long)positions[t] * half + k;
    float c = cos_t[p], s = sin_t[p];
    T* v = x + th * head_dim;
    float a = ld(v, k), b = ld(v, k + half);
    st(v, k, a * c - b * s);
    st(v, k + half, b * c + a * s);
}

extern "C" __global__ void rope_bf16(bf16_t* x, const u32* positions, const float* cos_t,
                                     const float* sin_t, int tokens, int heads, int head_dim) {
    rope_t(x, positions, cos_t, sin_t, tokens, heads, head_dim);
}

extern "C" __global__ void rope_f32(float* x, const u32* positions, const float* cos_t,
                                    const float* sin_t, int tokens, int heads, int head_dim) {
    rope_t(x, positions, cos_t, sin_t, tokens, heads, head_dim);
}
