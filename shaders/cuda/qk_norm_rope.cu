// Qwen3's and Gemma 3's per-head q/k norms and the RoPE after them in one pass over q or k:
// each head of `head_dim` values is RMS-normed as rms_norm.cu normalizes a row (sum of squares
// in f64, y = w * (x * inv)), rounded to the activation type as rms_norm.cu stores it, and
// rotated in rotate-half layout over the whole head as rope.cu rotates it (f32 tables
// [max_position, head_dim / 2]): those two launches' values, with one read and one write of
// q instead of two each. `head_dim / 16` threads share a head, each holding 8 values of
// either half, the pairs rope rotates together (head_dim a multiple of 16, at most 512).
__device__ __forceinline__ float as_stored(const float*, float v) { return v; }
__device__ __forceinline__ float as_stored(const bf16_t*, float v) { return round_bf16(v); }

template <typename T>
__device__ void qk_norm_rope_t(T* x, const float* weight, const u32* positions,
                               const float* cos_t, const float* sin_t, long long rows, int heads,
                               int head_dim, float eps) {
    int group = head_dim / 16;  // threads a head: a power of two up to 32
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    long long r = i / group;
    bool live = r < rows;
    int half = head_dim / 2, k = 8 * (int)(i % group);
    T* v = x + (live ? r : 0) * head_dim;
    float a[8], b[8];
    double ss = 0.0;
    if (live) {
        ld8(v, k, a);
        ld8(v, k + half, b);
#pragma unroll
        for (int j = 0; j < 8; ++j) ss += (double)a[j] * a[j] + (double)b[j] * b[j];
    }
    // The group's lanes are adjacent and aligned within the warp.
    for (int o = group / 2; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    if (!live) return;
    float inv = 1.0f / sqrtf((float)(ss / (double)head_dim) + eps);
    float wa[8], wb[8], c[8], s[8];
    ld8(weight, k, wa);
    ld8(weight, k + half, wb);
    long long p = (long long)positions[r / heads] * half + k;
    ld8(cos_t, p, c);
    ld8(sin_t, p, s);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
        float na = as_stored(v, wa[j] * (a[j] * inv)), nb = as_stored(v, wb[j] * (b[j] * inv));
        a[j] = na * c[j] - nb * s[j];
        b[j] = nb * c[j] + na * s[j];
    }
    st8(v, k, a);
    st8(v, k + half, b);
}

#define QK_NORM_ROPE_ENTRY(NAME, T)                                                            \
    extern "C" __global__ void qk_norm_rope_##NAME(T* x, const float* weight,                  \
                                                   const u32* positions, const float* cos_t,   \
                                                   const float* sin_t, long long rows,         \
                                                   int heads, int head_dim, float eps) {       \
        qk_norm_rope_t(x, weight, positions, cos_t, sin_t, rows, heads, head_dim, eps);        \
    }

QK_NORM_ROPE_ENTRY(bf16, bf16_t)
QK_NORM_ROPE_ENTRY(f32, float)
