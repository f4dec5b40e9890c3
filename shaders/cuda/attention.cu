// Causal grouped-query attention on the CUDA cores, for f32 activations and for head sizes the
// tensor-core kernel (flash_attention.cu) does not take. Sequences are laid end to end, flash
// style: a block takes
// WARPS * ROWS query rows of one head, walks the keys of their sequences in tiles of 32 held
// in shared memory, and keeps an online softmax (running max m, sum l, output acc) per row,
// so no score matrix is ever stored. Lane j scores key j of a tile; the probabilities are
// then broadcast with shuffles and each lane accumulates head dims lane, lane + 32, ...
// Sparse attention's selection (`key_mask`, see common.cuh's key_selected) hides the keys a
// query does not keep.
#define WARPS 4
#define ROWS 4
#define KT 32
#define MAXT 16  // head_dim <= 512 (Gemma 4's full-attention heads)

template <typename T, typename To>
__device__ void attention_t(To* out, const T* q, const T* k, const T* v, const u32* seq_start,
                            int tokens, int heads, int kv_heads, int d, float scale,
                            float softcap, int window, const float* sinks, const u32* key_mask,
                            int mask_words) {
    extern __shared__ float smem[];
    const float NEG_INF = -__int_as_float(0x7f800000);
    int ds = d + 1;  // padded rows: lane j reading ks[j][c] hits distinct banks
    float* ks = smem;
    float* vs = ks + KT * ds;
    float* qs = vs + KT * ds;  // [WARPS * ROWS][d]
    int h = blockIdx.y;
    int kh = h / (heads / kv_heads);
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int q0 = blockIdx.x * (WARPS * ROWS);
    long long qw = (long long)heads * d, kw = (long long)kv_heads * d;
    for (int i = threadIdx.x; i < WARPS * ROWS * d; i += blockDim.x) {
        int r = i / d, c = i % d, t = q0 + r;
        qs[i] = t < tokens ? ld(q, t * qw + h * d + c) : 0.0f;
    }
    int qlast = min(q0 + WARPS * ROWS, tokens) - 1;
    int kstart = first_key(q0, (int)seq_start[q0], window);  // never decreases along the rows
    int qi[ROWS], first[ROWS];
    float m[ROWS], l[ROWS], acc[ROWS][MAXT];
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
        qi[r] = q0 + warp * ROWS + r;
        first[r] = qi[r] < tokens ? first_key(qi[r], (int)seq_start[qi[r]], window) : 0;
        // A sink (gpt-oss) is a logit already seen, of weight exp(0), with no value.
        m[r] = sinks ? sinks[h] : NEG_INF;
        l[r] = sinks ? 1.0f : 0.0f;
#pragma unroll
        for (int t = 0; t < MAXT; ++t) acc[r][t] = 0.0f;
    }
    __syncthreads();
    for (int k0 = kstart; k0 <= qlast; k0 += KT) {
        for (int i = threadIdx.x; i < KT * d; i += blockDim.x) {
            int j = i / d, c = i % d, kj = k0 + j;
            float kv = 0.0f, vv = 0.0f;
            if (kj <= qlast) {
                kv = ld(k, kj * kw + kh * d + c);
                vv = ld(v, kj * kw + kh * d + c);
            }
            ks[j * ds + c] = kv;
            vs[j * ds + c] = vv;
        }
        __syncthreads();
        int kj = k0 + lane;
        float s[ROWS];
#pragma unroll
        for (int r = 0; r < ROWS; ++r) s[r] = 0.0f;
        for (int c = 0; c < d; ++c) {
            float kk = ks[lane * ds + c];
#pragma unroll
            for (int r = 0; r < ROWS; ++r) s[r] += qs[(warp * ROWS + r) * d + c] * kk;
        }
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
            bool valid = qi[r] < tokens && kj >= first[r] && kj <= qi[r] &&
                         (!key_mask || key_selected(key_mask, mask_words, qi[r], kj - first[r]));
            float sc = s[r] * scale;
            if (softcap > 0.0f) sc = softcap * tanhf(sc / softcap);
            sc = valid ? sc : NEG_INF;
            float mnew = fmaxf(m[r], warp_max(sc));
            if (mnew == NEG_INF) continue;  // uniform across the warp
            float p = valid ? expf(sc - mnew) : 0.0f;
            float alpha = expf(m[r] - mnew);
            l[r] = l[r] * alpha + warp_sum(p);
            m[r] = mnew;
#pragma unroll
            for (int t = 0; t < MAXT; ++t) acc[r][t] *= alpha;
            for (int j = 0; j < KT; ++j) {
                float pj = __shfl_sync(0xffffffffu, p, j);
#pragma unroll
                for (int t = 0; t < MAXT; ++t) {
                    int c = lane + 32 * t;
                    if (c < d) acc[r][t] += pj * vs[j * ds + c];
                }
            }
        }
        __syncthreads();
    }
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
        if (qi[r] >= tokens) continue;
#pragma unroll
        for (int t = 0; t < MAXT; ++t) {
            int c = lane + 32 * t;
            if (c < d) st(out, qi[r] * qw + h * d + c, acc[r][t] / l[r]);
        }
    }
}

// attention_<in>_<out>: q, k, v of type <in>; the output f32 where a linear quantizes it next.
#define ATTENTION_ENTRY(IN, TIN, OUT, TOUT)                                                    \
    extern "C" __global__ void attention_##IN##_##OUT(TOUT* out, const TIN* q, const TIN* k,   \
                                                      const TIN* v, const u32* seq_start,      \
                                                      int tokens, int heads, int kv_heads,     \
                                                      int d, float scale, float softcap,       \
                                                      int window, const float* sinks,          \
                                                      const u32* key_mask, int mask_words) {   \
        attention_t(out, q, k, v, seq_start, tokens, heads, kv_heads, d, scale, softcap,       \
                    window, sinks, key_mask, mask_words);                                      \
    }

ATTENTION_ENTRY(bf16, bf16_t, bf16, bf16_t)
ATTENTION_ENTRY(bf16, bf16_t, f32, float)
ATTENTION_ENTRY(f32, float, bf16, bf16_t)
ATTENTION_ENTRY(f32, float, f32, float)
