// Attention over the keys each query's list names (`Backend::sparse_attention`): row t of
// `keys` holds `n_keys` positions in t's sequence, ascending, then -1s, and t attends to those
// keys alone, so that the cost grows with the keys selected, not with the window. Values may be
// narrower than keys (`dv` <= `dk`): latent attention attends over the latent as one key head
// of 512 + 64 values, its values the latent's 512. Any GQA shape (dk <= 576, dv <= 512), f32
// or bf16, on the CUDA cores: a warp per (token, head), lane j scoring key j of a tile of 32
// with the warp's dot products, then each lane accumulating output columns lane, lane + 32, ...
// A listed position past the query's sequence names a row past the batch's tokens all the
// same (DeepSeek-V4's compressed entries); `sinks` (or null) adds one logit per head to the
// softmax's denominator. (listed_attention_mma.cu takes latent attention's bf16 heads on the
// tensor cores.)

#define LC_WARPS 4
#define LC_MAXK 18  // dk <= 576
#define LC_MAXV 16  // dv <= 512

template <typename T, typename To>
__device__ void listed_attention_t(To* out, const T* q, const T* k, const T* v,
                                   const u32* seq_start, const float* keys, int n_keys,
                                   int tokens, int heads, int kv_heads, int dk, int dv,
                                   float scale, float softcap, const float* sinks) {
    const float NEG_INF = -__int_as_float(0x7f800000);
    int lane = threadIdx.x & 31;
    long long i = (long long)blockIdx.x * LC_WARPS + (threadIdx.x >> 5);
    if (i >= (long long)tokens * heads) return;
    long long tok = i / heads;
    int h = (int)(i % heads), kh = h / (heads / kv_heads);
    long long start = seq_start[tok];
    const float* list = keys + tok * n_keys;
    float qr[LC_MAXK];
#pragma unroll
    for (int c = 0; c < LC_MAXK; ++c) {
        int d = lane + 32 * c;
        qr[c] = d < dk ? ld(q, (tok * heads + h) * dk + d) : 0.0f;
    }
    float m = NEG_INF, l = 0.0f;
    float acc[LC_MAXV];
#pragma unroll
    for (int c = 0; c < LC_MAXV; ++c) acc[c] = 0.0f;
    for (int j0 = 0; j0 < n_keys; j0 += 32) {
        int j = j0 + lane;
        float pos = j < n_keys ? list[j] : -1.0f;
        long long row = start + (long long)pos;
        // Lane j keeps key j's score; every lane takes part in each key's dot product.
        float mine = NEG_INF;
        unsigned live = __ballot_sync(0xffffffffu, pos >= 0.0f);
        for (int e = 0; e < 32 && (live >> e) & 1u; ++e) {
            long long rr = __shfl_sync(0xffffffffu, row, e);
            float part = 0.0f;
#pragma unroll
            for (int c = 0; c < LC_MAXK; ++c) {
                int d = lane + 32 * c;
                if (d < dk) part += qr[c] * ld(k, (rr * kv_heads + kh) * dk + d);
            }
            float sc = warp_sum(part) * scale;
            if (softcap > 0.0f) sc = softcap * tanhf(sc / softcap);
            if (lane == e) mine = sc;
        }
        float mx = fmaxf(m, warp_max(mine));
        float corr = mx == NEG_INF ? 1.0f : __expf(m - mx);
        float p = mine == NEG_INF ? 0.0f : __expf(mine - mx);
        l = l * corr + warp_sum(p);
        m = mx;
#pragma unroll
        for (int c = 0; c < LC_MAXV; ++c) acc[c] *= corr;
        for (int e = 0; e < 32 && (live >> e) & 1u; ++e) {
            long long rr = __shfl_sync(0xffffffffu, row, e);
            float pe = __shfl_sync(0xffffffffu, p, e);
#pragma unroll
            for (int c = 0; c < LC_MAXV; ++c) {
                int d = lane + 32 * c;
                if (d < dv) acc[c] += pe * ld(v, (rr * kv_heads + kh) * dv + d);
            }
        }
        if (live != 0xffffffffu) break;  // the list ends inside this tile
    }
    if (sinks) {
        // One more logit in the denominator, with no value.
        float sink = sinks[h], mx = fmaxf(m, sink);
        float corr = m == NEG_INF ? 0.0f : __expf(m - mx);
        l = l * corr + __expf(sink - mx);
#pragma unroll
        for (int c = 0; c < LC_MAXV; ++c) acc[c] *= corr;
    }
    float inv = l > 0.0f ? 1.0f / l : 0.0f;
#pragma unroll
    for (int c = 0; c < LC_MAXV; ++c) {
        int d = lane + 32 * c;
        if (d < dv) st(out, (tok * heads + h) * dv + d, acc[c] * inv);
    }
}

// listed_attention_<in>_<out>: q, k, v of type <in>; the output f32 where a linear quantizes it
// next.
#define LISTED_ENTRY(IN, TIN, OUT, TOUT)                                                       \
    extern "C" __global__ void listed_attention_##IN##_##OUT(                                  \
        TOUT* out, const TIN* q, const TIN* k, const TIN* v, const u32* seq_start,             \
        const float* keys, int n_keys, int tokens, int heads, int kv_heads, int dk, int dv,    \
        float scale, float softcap, const float* sinks) {                                      \
        listed_attention_t(out, q, k, v, seq_start, keys, n_keys, tokens, heads, kv_heads, dk, \
                           dv, scale, softcap, sinks);                                         \
    }

LISTED_ENTRY(bf16, bf16_t, bf16, bf16_t)
LISTED_ENTRY(bf16, bf16_t, f32, float)
LISTED_ENTRY(f32, float, bf16, bf16_t)
LISTED_ENTRY(f32, float, f32, float)
