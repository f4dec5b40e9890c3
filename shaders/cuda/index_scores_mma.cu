// nvrtc: sm_80+
// DeepSeek sparse attention's lightning indexer scores on the tensor cores, without the
// per-head products: for query row t and each key j of its sequence up to itself (with `rate`
// > 1 the keys j < (position + 1) / rate, as index_top_k.cu's),
//   s_j = sum_h w[t, h] * weight_scale * max(scale * (q[t, h] . k[j]), 0)
// written to the row's scratch row (`max_len` u32 a row, its first for row `row0`) as
// order_key(s_j), as index_top_k.cu's index_scores writes it from cuBLAS's products (which,
// written and read again in f32, cost 512 bytes a query and key at 64 heads; here the heads
// are summed in registers). bf16 q `[tokens, heads * D]`, k `[tokens, D]`, w `[tokens, heads]`;
// heads a multiple of 16 up to 64.
//
// A block of 4 warps takes IM_QB consecutive query rows of one sequence (their queries in
// shared memory, `[heads][D]` each) and walks their keys in tiles of IM_BN (double-buffered,
// cp.async). Per query and tile each warp multiplies its groups of 16 heads (group w, w + 4,
// ...) by the tile's keys (mma.sync.m16n8k16, f32 accumulation: the products exact, as
// cuBLAS's), weighs and sums its heads in registers and across its lanes, and the four warps'
// sums meet in shared memory.

#define IM_WARPS 4
#define IM_QB 4   // query rows a block
#define IM_BN 64  // keys a tile

template <int D>
__device__ void index_scores_mma(u32* scratch, const bf16_t* q, const bf16_t* k, const bf16_t* w,
                                 const u32* seq_start, int heads, float scale,
                                 float weight_scale, int row0, int rows, int max_len, int rate) {
    constexpr int LD = D + 8;  // padded rows: the 8 rows of an ldmatrix hit distinct banks
    constexpr int CH = D / 8;  // 16-byte chunks a row
    constexpr int NT = IM_BN / 8;  // 8-key tiles of a warp's products
    constexpr int KT = IM_BN * LD;
    extern __shared__ __align__(16) unsigned char im_smem[];
    bf16_t* qs = (bf16_t*)im_smem;  // [IM_QB][heads][LD]
    bf16_t* kts = qs + IM_QB * heads * LD;  // two stages of [IM_BN][LD]
    float* red = (float*)(kts + 2 * KT);  // [IM_WARPS][IM_BN]

    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int g = lane >> 2, t = lane & 3;
    int lm = lane >> 3, lr = lane & 7;
    int first = blockIdx.x * IM_QB;  // the block's first row, from row0
    int n_rows = min(IM_QB, rows - first);
    long long t0 = (long long)row0 + first, a = seq_start[t0];
    long long last = t0 + n_rows - 1;
    int n_keys = (int)((last - a + 1) / rate);
    int n_tiles = (n_keys + IM_BN - 1) / IM_BN;
    int groups = heads / 16;

    for (int i = threadIdx.x; i < IM_QB * heads * CH; i += blockDim.x) {
        int r = i / (heads * CH), rest = i % (heads * CH), h = rest / CH, c = (rest % CH) * 8;
        bool ok = r < n_rows;
        cp_async16(qs + (r * heads + h) * LD + c, q + ((t0 + (ok ? r : 0)) * heads + h) * D + c,
                   ok);
    }
    cp_async_commit();
    auto load_tile = [&](int n) {
        long long j0 = a + (long long)n * IM_BN;
        bf16_t* ks = kts + (n & 1) * KT;
        for (int i = threadIdx.x; i < IM_BN * CH; i += blockDim.x) {
            int r = i / CH, c = (i % CH) * 8;
            bool ok = j0 + r < a + n_keys;
            cp_async16(ks + r * LD + c, k + (ok ? j0 + r : a) * D + c, ok);
        }
    };
    if (n_tiles > 0) load_tile(0);
    cp_async_commit();
    cp_async_wait_prev();
    __syncthreads();

    for (int n = 0; n < n_tiles; ++n) {
        next_tile(n, n_tiles, load_tile);
        __syncthreads();
        const bf16_t* ks = kts + (n & 1) * KT;
        int j0 = n * IM_BN;  // the tile's first key, from the sequence's start
        for (int r = 0; r < n_rows; ++r) {
            long long tr = t0 + r;
            int count = (int)((tr - a + 1) / rate);  // the keys row tr sees
            if (j0 >= count) continue;  // (uniform over the block)
            float sum[NT][2];
#pragma unroll
            for (int j = 0; j < NT; ++j) sum[j][0] = sum[j][1] = 0.0f;
            for (int grp = warp; grp < groups; grp += IM_WARPS) {
                const bf16_t* qa =
                    qs + (r * heads + grp * 16 + lr + 8 * (lm & 1)) * LD + 8 * (lm >> 1);
                float s[NT][4];
                qk_tiles<NT, D / 16, D / 16>(s, qa, ks, LD, lm, lr);
                // Rows g and g + 8 of the group are heads grp * 16 + g and + 8.
                long long wrow = tr * heads + grp * 16 + g;
                float w0 = ld(w, wrow) * weight_scale, w1 = ld(w, wrow + 8) * weight_scale;
#pragma unroll
                for (int j = 0; j < NT; ++j) {
                    sum[j][0] += w0 * fmaxf(s[j][0] * scale, 0.0f) + w1 * fmaxf(s[j][2] * scale, 0.0f);
                    sum[j][1] += w0 * fmaxf(s[j][1] * scale, 0.0f) + w1 * fmaxf(s[j][3] * scale, 0.0f);
                }
            }
            // The warp's heads summed over its lanes of equal t (g = 0..7).
#pragma unroll
            for (int j = 0; j < NT; ++j)
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    float v = sum[j][e];
                    v += __shfl_xor_sync(0xffffffffu, v, 4);
                    v += __shfl_xor_sync(0xffffffffu, v, 8);
                    v += __shfl_xor_sync(0xffffffffu, v, 16);
                    if (g == 0) red[warp * IM_BN + j * 8 + 2 * t + e] = v;
                }
            __syncthreads();
            if (threadIdx.x < IM_BN && j0 + (int)threadIdx.x < count) {
                int j = threadIdx.x;
                float v = 0.0f;
                for (int wv = 0; wv < IM_WARPS; ++wv) v += red[wv * IM_BN + j];
                scratch[(long long)(first + r) * max_len + j0 + j] = order_key(v);
            }
            __syncthreads();
        }
        __syncthreads();  // every warp is done with this stage before it is refilled
    }
}

#define INDEX_SCORES_MMA_ENTRY(D)                                                              \
    extern "C" __global__ void __launch_bounds__(IM_WARPS * 32)                                \
        index_scores_mma_d##D(u32* scratch, const bf16_t* q, const bf16_t* k, const bf16_t* w, \
                              const u32* seq_start, int heads, float scale,                    \
                              float weight_scale, int row0, int rows, int max_len, int rate) { \
        index_scores_mma<D>(scratch, q, k, w, seq_start, heads, scale, weight_scale, row0,     \
                            rows, max_len, rate);                                              \
    }
INDEX_SCORES_MMA_ENTRY(32)
INDEX_SCORES_MMA_ENTRY(64)
INDEX_SCORES_MMA_ENTRY(128)
