// DeepSeek sparse attention on the CUDA cores: each query attends only to the keys row t of
// `keys` names (`n` positions in its sequence, ascending, then -1s; `Backend::index_top_k`).
// A warp per (query, head), SA_WARPS heads a block: its query head in shared memory, the keys
// in tiles of 32 (lane j scores key j), an online softmax (running max m, sum l), then the
// tile's probabilities broadcast with shuffles while each lane accumulates head dims lane,
// lane + 32, ... of the values. The work grows with the keys kept, not with the context.
#define SA_WARPS 4
#define SA_MAXT 8  // head_dim <= 256

template <typename T, typename To>
__device__ void sparse_attention_t(To* out, const T* q, const T* k, const T* v,
                                   const u32* seq_start, const float* keys, int n, int heads,
                                   int kv_heads, int d, float scale, float softcap) {
    extern __shared__ float smem[];  // [SA_WARPS][d]
    const float NEG_INF = -__int_as_float(0x7f800000);
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    long long t = blockIdx.x;
    int h = blockIdx.y * SA_WARPS + warp;
    if (h >= heads) return;  // a whole warp; no block barrier follows
    int kh = h / (heads / kv_heads);
    long long qw = (long long)heads * d, kw = (long long)kv_heads * d;
    float* qs = smem + warp * d;
    for (int c = lane; c < d; c += 32) qs[c] = ld(q, t * qw + h * d + c);
    __syncwarp();
    long long start = seq_start[t];
    const float* row_keys = keys + t * n;
    int count = 0;
    while (count < n && row_keys[count] >= 0.0f) ++count;
    float m = NEG_INF, l = 0.0f, acc[SA_MAXT];
#pragma unroll
    for (int i = 0; i < SA_MAXT; ++i) acc[i] = 0.0f;
    for (int j0 = 0; j0 < count; j0 += 32) {
        int j = j0 + lane;
        bool valid = j < count;
        long long row = valid ? start + (long long)row_keys[j] : start;
        float s = 0.0f;
        if (valid)
            for (int c = 0; c < d; ++c) s += qs[c] * ld(k, row * kw + kh * d + c);
        s *= scale;
        if (softcap > 0.0f) s = softcap * tanhf(s / softcap);
        s = valid ? s : NEG_INF;
        float mnew = fmaxf(m, warp_max(s));
        float p = valid ? expf(s - mnew) : 0.0f;
        float alpha = expf(m - mnew);
        l = l * alpha + warp_sum(p);
        m = mnew;
#pragma unroll
        for (int i = 0; i < SA_MAXT; ++i) acc[i] *= alpha;
        int tile = min(32, count - j0);
        for (int jj = 0; jj < tile; ++jj) {
            float pj = __shfl_sync(0xffffffffu, p, jj);
            long long rj = __shfl_sync(0xffffffffu, row, jj);
#pragma unroll
            for (int i = 0; i < SA_MAXT; ++i) {
                int c = lane + 32 * i;
                if (c < d) acc[i] += pj * ld(v, rj * kw + kh * d + c);
            }
        }
    }
#pragma unroll
    for (int i = 0; i < SA_MAXT; ++i) {
        int c = lane + 32 * i;
        if (c < d) st(out, t * qw + h * d + c, acc[i] / l);
    }
}

// sparse_attention_<in>_<out>: q, k, v of type <in>; the output f32 where a linear quantizes
// it next.
#define SPARSE_ATTENTION_ENTRY(IN, TIN, OUT, TOUT)                                             \
    extern "C" __global__ void sparse_attention_##IN##_##OUT(                                  \
        TOUT* out, const TIN* q, const TIN* k, const TIN* v, const u32* seq_start,             \
        const float* keys, int n, int heads, int kv_heads, int d, float scale,                 \
        float softcap) {                                                                       \
        sparse_attention_t(out, q, k, v, seq_start, keys, n, heads, kv_heads, d, scale,        \
                           softcap);                                                           \
    }

SPARSE_ATTENTION_ENTRY(bf16, bf16_t, bf16, bf16_t)
SPARSE_ATTENTION_ENTRY(bf16, bf16_t, f32, float)
SPARSE_ATTENTION_ENTRY(f32, float, bf16, bf16_t)
SPARSE_ATTENTION_ENTRY(f32, float, f32, float)
