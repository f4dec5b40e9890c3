// nvrtc: sm_80+
// listed_attention.cu's attention over listed keys on the tensor cores, for one key head shared
// by every query head in bf16: latent attention's keys of 576 values (the latent's 512 and 64
// rotated) with values of LA_DV (the latent's), or DeepSeek-V4's heads of 512 whose keys are
// their values, with a sink logit a head. A block of 8 warps takes 64 query heads of
// one token, which read the same gathered keys: the heads are the rows of Q K^T and P V on
// mma.sync.m16n8k16, as the positions are in flash_attention_wide.cu, whose division of work
// it follows (warps w and w + 4 share 16 heads, each keeping half of the output columns). Key
// and value tiles of 32 gathered rows are double-buffered in shared memory (cp.async).

#define LA_WARPS 8
#define LA_BM 64  // query heads per block: 16 per pair of warps
#define LA_BN 32  // keys per tile
#define LA_DV 512

// How many of row `t`'s listed keys are real (they come first), counted by the whole block.
__device__ __forceinline__ int listed_count(const float* keys, int n_keys, long long t) {
    int count = 0;
    for (int i0 = 0; i0 < n_keys; i0 += blockDim.x) {
        int i = i0 + threadIdx.x;
        count += __syncthreads_count(i < n_keys && keys[t * n_keys + i] >= 0.0f);
    }
    return count;
}

// DK: the keys' width (576 or 512). `sinks` (or null): a logit a head, of no value.
template <int DK, typename To>
__device__ void listed_attention_mma(To* out, const bf16_t* q, const bf16_t* k, const bf16_t* v,
                                     const u32* seq_start, const float* keys, int n_keys,
                                     int heads, float scale_log2, float softcap,
                                     const float* sinks) {
    constexpr int LD = DK + 8;  // padded rows: the 8 rows of an ldmatrix hit distinct banks
    constexpr int CH = DK / 8;  // 16-byte chunks per row
    constexpr int NT = LA_BN / 8;  // 8-key tiles of S
    constexpr int HALF = LA_DV / 2;  // output columns per warp
    constexpr int DT = HALF / 8;  // 8-wide tiles of a warp's O
    constexpr int LDV = LA_DV + 8;
    constexpr int CHV = LA_DV / 8;
    constexpr int KT = LA_BN * LD;  // one key tile
    constexpr int STAGE = KT + LA_BN * LDV;  // a key tile and its value tile
    extern __shared__ __align__(16) unsigned char la_smem[];
    bf16_t* qs = (bf16_t*)la_smem;  // [LA_BM][LD]
    bf16_t* kts = qs + LA_BM * LD;  // two stages of [K, V]

    long long tok = blockIdx.x;
    int h0 = blockIdx.y * LA_BM;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int rows = warp & 3, half = warp >> 2;  // which 16 heads, which output columns
    int g = lane >> 2, t = lane & 3;
    int lm = lane >> 3, lr = lane & 7;  // ldmatrix: which 8x8 matrix, which of its rows
    long long start = seq_start[tok];
    const float* list = keys + tok * n_keys;
    int count = listed_count(keys, n_keys, tok);
    int n_tiles = (count + LA_BN - 1) / LA_BN;

    for (int i = threadIdx.x; i < LA_BM * CH; i += blockDim.x) {
        int r = i / CH, c = (i % CH) * 8;
        cp_async16(qs + r * LD + c, q + (tok * heads + h0 + r) * DK + c, true);
    }
    cp_async_commit();
    // Keys and values n * LA_BN .. of the list into stage n % 2; entries past it are zero.
    auto load_tile = [&](int n) {
        int j0 = n * LA_BN;
        bf16_t* ks = kts + (n & 1) * STAGE;
        for (int i = threadIdx.x; i < LA_BN * CH; i += blockDim.x) {
            int r = i / CH, c = (i % CH) * 8, j = j0 + r;
            bool ok = j < count;
            long long row = start + (ok ? (long long)list[j] : 0);
            cp_async16(ks + r * LD + c, k + row * DK + c, ok);
        }
        for (int i = threadIdx.x; i < LA_BN * CHV; i += blockDim.x) {
            int r = i / CHV, c = (i % CHV) * 8, j = j0 + r;
            bool ok = j < count;
            long long row = start + (ok ? (long long)list[j] : 0);
            cp_async16(ks + KT + r * LDV + c, v + row * LA_DV + c, ok);
        }
    };
    if (n_tiles > 0) load_tile(0);
    cp_async_commit();
    cp_async_wait_prev();  // Q has landed
    __syncthreads();

    // The softmax runs over list indices: "row" count - 1 is the last key any head sees, so
    // softmax_tile's causal mask hides the entries past the list.
    // A head's sink is a logit already seen (add_sink's arithmetic), the rows being heads here.
    SoftmaxRows r;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        r.row[i] = count - 1;
        r.start[i] = 0;
        int h = h0 + rows * 16 + g + 8 * i;
        r.m[i] = sinks ? sinks[h] / (scale_log2 * 0.6931471805599453f) : -__int_as_float(0x7f800000);
        r.l[i] = sinks && t == 0 ? 1.0f : 0.0f;
    }
    const bf16_t* qa = qs + (rows * 16 + lr + 8 * (lm & 1)) * LD + 8 * (lm >> 1);
    float o[DT][4];
    zero_tiles(o);

    for (int n = 0; n < n_tiles; ++n) {
        next_tile(n, n_tiles, load_tile);
        __syncthreads();
        int j0 = n * LA_BN;
        const bf16_t* ks = kts + (n & 1) * STAGE;
        const bf16_t* vs = ks + KT + half * HALF;
        float s[NT][4];
        qk_tiles<NT, DK / 16, 4>(s, qa, ks, LD, lm, lr);
        float alpha[2];
        softmax_tile(s, r, j0 + LA_BN > count, j0, t, scale_log2, softcap, alpha, nullptr, 0);
        scale_rows(o, alpha);
        pv_tiles(o, s, vs, LDV, lm, lr);
        __syncthreads();  // every warp is done with this stage before it is refilled
    }
    // The output rows are this warp's heads of the token.
    r.row[0] = rows * 16 + g;
    r.row[1] = rows * 16 + g + 8;
    store_rows(out + (tok * heads + h0) * LA_DV + half * HALF, o, r, LA_BM, LA_DV, t);
}

// One block per multiprocessor: the Q tile and two key/value stages take 211 KiB (keys of 576)
// or 200 KiB (512).
#define LISTED_MMA_ENTRY(DK, OUT, TOUT)                                                         \
    extern "C" __global__ void __launch_bounds__(LA_WARPS * 32, 1)                               \
        listed_attention_mma_d##DK##_##OUT(TOUT* out, const bf16_t* q, const bf16_t* k,         \
                                           const bf16_t* v, const u32* seq_start,                \
                                           const float* keys, int n_keys, int heads,             \
                                           float scale_log2, float softcap, const float* sinks) { \
        listed_attention_mma<DK>(out, q, k, v, seq_start, keys, n_keys, heads, scale_log2,      \
                                 softcap, sinks);                                               \
    }
LISTED_MMA_ENTRY(576, bf16, bf16_t)
LISTED_MMA_ENTRY(576, f32, float)
LISTED_MMA_ENTRY(512, bf16, bf16_t)
LISTED_MMA_ENTRY(512, f32, float)
