// nvrtc: sm_80+
// Causal GQA attention on the tensor cores for heads of 512 (Gemma 4's full-attention layers),
// which flash_attention.cu cannot hold: its warps keep their queries and a whole head of
// output in registers, 384 a thread at 512. Here a block of 8 warps takes 64 query rows of one
// head; warps w and w + 4 share rows 16 (w % 4) .. + 15 and each keeps one half of the head's
// output columns (128 registers), reading its queries from shared memory, where the block's Q
// tile stays. Both warps of a pair compute the same scores (S = Q K^T over all 512 values) and
// run the same online softmax, so each half's O / l is the whole head's: 1.5x the minimum
// products, all on mma.sync.m16n8k16 with f32 accumulation, in exchange for one pass over the
// keys. Key and value tiles of 32 rows are double-buffered in shared memory (cp.async), as in
// flash_attention.cu, whose masking, sinks, soft cap, sliding window and selection mask
// (common.cuh's softmax_tile) this kernel shares.

#define FW_WARPS 8
#define FW_BM 64  // query rows per block: 16 per pair of warps
#define FW_BN 32  // keys per tile

template <int D, typename To>
__device__ void flash_attention_wide(To* out, const bf16_t* q, const bf16_t* k, const bf16_t* v,
                                     const u32* seq_start, int tokens, int heads, int kv_heads,
                                     float scale_log2, float softcap, int window,
                                     const float* sinks, const u32* key_mask, int mask_words) {
    constexpr int LD = D + 8;  // padded rows: the 8 rows of an ldmatrix hit distinct banks
    constexpr int CH = D / 8;  // 16-byte chunks per row
    constexpr int NT = FW_BN / 8;  // 8-key tiles of S
    constexpr int HALF = D / 2;  // output columns per warp
    constexpr int DT = HALF / 8;  // 8-wide tiles of a warp's O
    constexpr int KV = FW_BN * LD;  // one K or V tile
    extern __shared__ __align__(16) unsigned char fw_smem[];
    bf16_t* qs = (bf16_t*)fw_smem;  // [FW_BM][LD]
    bf16_t* kvs = qs + FW_BM * LD;  // two stages of [K, V]

    int h = blockIdx.y, kh = h / (heads / kv_heads);
    int q0 = (gridDim.x - 1 - blockIdx.x) * FW_BM;  // the longest rows first
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int rows = warp & 3, half = warp >> 2;  // which 16 query rows, which output columns
    int g = lane >> 2, t = lane & 3;
    int lm = lane >> 3, lr = lane & 7;  // ldmatrix: which 8x8 matrix, which of its rows
    long long qw = (long long)heads * D, kw = (long long)kv_heads * D;
    int qlast = min(q0 + FW_BM, tokens) - 1;
    int kstart = first_key(q0, (int)seq_start[q0], window);  // never decreases along the rows
    int n_tiles = (qlast - kstart) / FW_BN + 1;

    for (int i = threadIdx.x; i < FW_BM * CH; i += blockDim.x) {
        int r = i / CH, c = (i % CH) * 8, tok = q0 + r;
        cp_async16(qs + r * LD + c, q + (long long)min(tok, tokens - 1) * qw + h * D + c,
                   tok < tokens);
    }
    cp_async_commit();
    // Keys and values of tile `n` into stage n % 2; rows past the block's last query are zero.
    auto load_tile = [&](int n) {
        int k0 = kstart + n * FW_BN;
        bf16_t* ks = kvs + (n & 1) * 2 * KV;
        for (int i = threadIdx.x; i < FW_BN * CH; i += blockDim.x) {
            int r = i / CH, c = (i % CH) * 8, tok = k0 + r;
            bool ok = tok <= qlast;
            long long off = (long long)(ok ? tok : k0) * kw + kh * D + c;
            cp_async16(ks + r * LD + c, k + off, ok);
            cp_async16(ks + KV + r * LD + c, v + off, ok);
        }
    };
    load_tile(0);
    cp_async_commit();
    cp_async_wait_prev();  // Q has landed
    __syncthreads();

    int warp_first = q0 + rows * 16;
    SoftmaxRows r = softmax_rows(warp_first, g, tokens, seq_start, window);
    add_sink(r, sinks, h, scale_log2, t);
    int warp_last = min(warp_first + 15, qlast);
    // Keys before this start belong to an earlier sequence (or lie outside the window) of some
    // row of this warp.
    int warp_start =
        warp_first <= qlast ? first_key(warp_last, (int)seq_start[warp_last], window) : 0x7fffffff;
    const bf16_t* qa = qs + (rows * 16 + lr + 8 * (lm & 1)) * LD + 8 * (lm >> 1);

    float o[DT][4];
    zero_tiles(o);

    for (int n = 0; n < n_tiles; ++n) {
        next_tile(n, n_tiles, load_tile);
        __syncthreads();
        int k0 = kstart + n * FW_BN;
        const bf16_t* ks = kvs + (n & 1) * 2 * KV;
        const bf16_t* vs = ks + KV + half * HALF;
        if (k0 <= warp_last) {  // causal: later tiles hold no key visible to this warp
            float s[NT][4];
            qk_tiles<NT, D / 16, 8>(s, qa, ks, LD, lm, lr);
            // Only tiles that reach past a row's own position or before its sequence's start
            // need the mask.
            float alpha[2];
            softmax_tile(s, r, k0 + FW_BN - 1 > warp_first || k0 < warp_start, k0, t, scale_log2,
                         softcap, alpha, key_mask, mask_words);
            scale_rows(o, alpha);
            // O += P V over this warp's half of the columns, P rounded to bf16 as the A operand
            // straight from the S registers.
            pv_tiles(o, s, vs, LD, lm, lr);
        }
        __syncthreads();  // every warp is done with this stage before it is refilled
    }
    store_rows(out + h * D + half * HALF, o, r, tokens, qw, t);
}

// One block per multiprocessor: the Q tile and two key/value stages take 195 KiB.
FLASH_ENTRY(flash_attention_wide, __launch_bounds__(FW_WARPS * 32, 1), const bf16_t*, 512, bf16,
            bf16_t)
FLASH_ENTRY(flash_attention_wide, __launch_bounds__(FW_WARPS * 32, 1), const bf16_t*, 512, f32,
            float)
