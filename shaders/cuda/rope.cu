// RoPE in place over the values of each head that the span names (the rest pass through:
// partial rotary, latent attention's unrotated part). Pair j of a head is (start + j,
// start + j + half) in rotate-half layout, or (start + 2j, start + 2j + 1) interleaved
// (DeepSeek), rotated by the angle of the token's position; cos/sin are f32 tables
// [max_position, half].
__device__ __forceinline__ void rotate(float a, float b, float c, float s, float* ra, float* rb) {
    *ra = a * c - b * s;
    *rb = b * c + a * s;
}

// One thread per `per` consecutive pairs: 8 (16-byte accesses) where the host found the
// rotate-half halves aligned (rope.rs), else 1.
template <typename T>
__device__ void rope_t(T* x, const u32* positions, const float* cos_t, const float* sin_t,
                       int tokens, int heads, int head_dim, int start, int rot, int interleaved,
                       int per) {
    int half = rot / 2;
    int chunks = half / per;
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long long)tokens * heads * chunks) return;
    int k = (int)(i % chunks) * per;
    long long th = i / chunks;  // token * heads + head
    long long t = th / heads;
    long long p = (long long)positions[t] * half + k;
    T* v = x + th * head_dim + start;
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
        int ia = interleaved ? 2 * k : k;
        int ib = interleaved ? 2 * k + 1 : k + half;
        float ra, rb;
        rotate(ld(v, ia), ld(v, ib), cos_t[p], sin_t[p], &ra, &rb);
        st(v, ia, ra);
        st(v, ib, rb);
    }
}

#define ROPE_ENTRY(NAME, T)                                                                    \
    extern "C" __global__ void rope_##NAME(T* x, const u32* positions, const float* cos_t,    \
                                           const float* sin_t, int tokens, int heads,          \
                                           int head_dim, int start, int rot, int interleaved,  \
                                           int per) {                                          \
        rope_t(x, positions, cos_t, sin_t, tokens, heads, head_dim, start, rot, interleaved,   \
               per);                                                                           \
    }

ROPE_ENTRY(bf16, bf16_t)
ROPE_ENTRY(f32, float)
