// Rotate-half RoPE in place over the first rot values of each head (the rest pass through:
// partial rotary): x[t, h, i] and x[t, h, i + half] rotated by the angle of the token's
// position, half = rot / 2; cos/sin are f32 tables [max_position, half].
__device__ __forceinline__ void rotate(float a, float b, float c, float s, float* ra, float* rb) {
    *ra = a * c - b * s;
    *rb = b * c + a * s;
}

// One thread per 8 consecutive pairs (16-byte accesses) when head_dim / 2 is a multiple of 8,
// else one per pair.
template <typename T>
__device__ void rope_t(T* x, const u32* positions, const float* cos_t, const float* sin_t,
                       int tokens, int heads, int head_dim, int rot) {
    int half = rot / 2;
    int per = (half & 7) == 0 ? 8 : 1;
    int chunks = half / per;
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long long)tokens * heads * chunks) return;
    int k = (int)(i % chunks) * per;
    long long th = i / chunks;  // token * heads + head
    long long t = th / heads;
    long long p = (long long)positions[t] * half + k;
    T* v = x + th * head_dim;
    if (per == 8) {
        float c[8], s[8], a[8], b[8];
        ld8(cos_t, p, c);
        ld8(sin_t, p, s);
        ld8(v, k, a);
        ld8(v, k + half, b);
#pragma unroll
        for (int j = 0; j < 8; ++j) rotate(a[j], b[j], c[j], s[j], &a[j], &b[j]);
        st8(v, k, a);
        st8(v, k + half, b);
    } else {
        float ra, rb;
        rotate(ld(v, k), ld(v, k + half), cos_t[p], sin_t[p], &ra, &rb);
        st(v, k, ra);
        st(v, k + half, rb);
    }
}

extern "C" __global__ void rope_bf16(bf16_t* x, const u32* positions, const float* cos_t,
                                     const float* sin_t, int tokens, int heads, int head_dim,
                                     int rot) {
    rope_t(x, positions, cos_t, sin_t, tokens, heads, head_dim, rot);
}

extern "C" __global__ void rope_f32(float* x, const u32* positions, const float* cos_t,
                                    const float* sin_t, int tokens, int heads, int head_dim,
                                    int rot) {
    rope_t(x, positions, cos_t, sin_t, tokens, heads, head_dim, rot);
}
