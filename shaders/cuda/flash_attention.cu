// nvrtc: sm_80+
// Causal grouped-query attention on the tensor cores (sm_80 and later), FlashAttention-2
// style: bf16 q, k, v, f32 accumulation, no score matrix in memory. A block of 8 warps takes
// 128 query rows of one head, each warp 16 of them, so every key/value tile read from global
// memory serves 128 rows. Key and value tiles of 64 rows are double-buffered in shared memory:
// cp.async copies the next tile while the current one is used. S = Q K^T and O += P V run on
// mma.sync.m16n8k16 with operands loaded by ldmatrix; the online softmax (running max m,
// running sum l) and the output accumulator O stay in registers. Key tiles past a warp's last
// query are skipped, so the causal half costs nothing, and only tiles that cross a row's own
// position or its sequence's start (sequences are laid end to end) pay for masking; with
// sparse attention's selection (`key_mask`) every tile is masked by it.
//
// With SPLIT (`--dtype split-bf16`, f32 activations) q, k and v each arrive as two f16 planes,
// the high parts and then the residuals, 22 bits of each value: q and k with a power of two per
// token and head (`split_rows_f16.cu`), undone on S from `q_undo` and `k_undo`; v with one per
// column (`split_columns_f16.cu`: a per-key scale could not leave the sum over keys), undone on
// O's columns from `v_top`; P is split into f16 parts after 2^14 from its f32 registers. Every
// product sums hi·hi + hi·lo + lo·hi on the tensor cores: three times the MMAs, with both
// planes of a key/value tile in shared memory. (With bf16 parts, 16 bits, the 8B's per-token
// error against f32 was 1.95e-4; with these planes 1.41e-4, and 1.24e-4 with f32 attention,
// under the promoted GEMMs 1.13e-4, and 1.11e-4 with f32 attention; docs/decisions.md: Split
// attention on f16 planes.)
//
// Register layouts: see common.cuh (the A operand of m16n8k16, 16 x 16 row-major, holds
// (g, 2t..2t+1), (g + 8, 2t..), (g, 2t+8..), (g + 8, 2t+8..) in a[0..3]; the B operand, 16 x 8
// k-major, holds k = 2t..2t+1 and k = 2t+8..2t+9 of column g in b0 and b1).

#define FA_WARPS 8
#define FA_BM 128  // query rows per block: 16 per warp
#define FA_BN 64   // keys per tile

// c += a b for one 16 x 8 tile of f16 operands.
__device__ __forceinline__ void mma_f16(float* c, const u32* a, u32 b0, u32 b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// P's operand of one 16-key slice `ks` as two f16 parts of p * 2^14 (p <= 1: the scale keeps
// small probabilities out of f16's subnormals), in p_operand's register layout.
#define P_F16_SCALE 16384.0f
template <int NT>
__device__ __forceinline__ void p_operand_f16(const float (&s)[NT][4], int ks, u32 (&hi)[4],
                                              u32 (&lo)[4]) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const float* p = s[2 * ks + (i >> 1)] + 2 * (i & 1);
        split2_f16(p[0] * P_F16_SCALE, p[1] * P_F16_SCALE, hi[i], lo[i]);
    }
}

template <int D, bool SPLIT, typename To>
__device__ void flash_attention_planes(To* out, const bf16_t* q, const bf16_t* k,
                                       const bf16_t* v, const u32* seq_start, int tokens,
                                       int heads, int kv_heads, float scale_log2, float softcap,
                                       int window, const float* sinks, const float* q_undo,
                                       const float* k_undo, const u32* v_top,
                                       const u32* key_mask, int mask_words) {
    constexpr int LD = D + 8;  // padded rows: the 8 rows of an ldmatrix hit distinct banks
    constexpr int CH = D / 8;  // 16-byte chunks per row
    constexpr int NT = FA_BN / 8;  // 8-key tiles of S
    constexpr int DT = D / 8;  // 8-wide tiles of O
    constexpr int KV = FA_BN * LD;  // one K or V tile
    constexpr int P = SPLIT ? 2 : 1;  // planes: high parts, then residuals
    extern __shared__ __align__(16) unsigned char fa_smem[];
    bf16_t* qs = (bf16_t*)fa_smem;  // [FA_BM][LD], one plane at a time
    bf16_t* kvs = qs + FA_BM * LD;  // two stages of [K planes, V planes]

    int h = blockIdx.y, kh = h / (heads / kv_heads);
    int q0 = (gridDim.x - 1 - blockIdx.x) * FA_BM;  // the longest rows first
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int g = lane >> 2, t = lane & 3;
    int lm = lane >> 3, lr = lane & 7;  // ldmatrix: which 8x8 matrix, which of its rows
    long long qw = (long long)heads * D, kw = (long long)kv_heads * D;
    int qlast = min(q0 + FA_BM, tokens) - 1;
    int kstart = first_key(q0, (int)seq_start[q0], window);  // never decreases along the rows
    int n_tiles = (qlast - kstart) / FA_BN + 1;

    // The residual planes follow the high parts' `tokens` rows.
    long long q_plane = (long long)tokens * qw, kv_plane = (long long)tokens * kw;
    auto load_q = [&](int p) {
        for (int i = threadIdx.x; i < FA_BM * CH; i += blockDim.x) {
            int r = i / CH, c = (i % CH) * 8, tok = q0 + r;
            cp_async16(qs + r * LD + c,
                       q + p * q_plane + (long long)min(tok, tokens - 1) * qw + h * D + c,
                       tok < tokens);
        }
    };
    load_q(0);
    cp_async_commit();
    // Keys and values of tile `n` into stage n % 2; rows past the block's last query are zero.
    auto load_tile = [&](int n) {
        int k0 = kstart + n * FA_BN;
        bf16_t* ks = kvs + (n & 1) * 2 * P * KV;
        for (int i = threadIdx.x; i < FA_BN * CH; i += blockDim.x) {
            int r = i / CH, c = (i % CH) * 8, tok = k0 + r;
            bool ok = tok <= qlast;
            long long off = (long long)(ok ? tok : k0) * kw + kh * D + c;
#pragma unroll
            for (int p = 0; p < P; ++p) {
                cp_async16(ks + p * KV + r * LD + c, k + p * kv_plane + off, ok);
                cp_async16(ks + (P + p) * KV + r * LD + c, v + p * kv_plane + off, ok);
            }
        }
    };
    load_tile(0);
    cp_async_commit();
    cp_async_wait_prev();  // Q has landed
    __syncthreads();

    // This warp's Q as A operands, one per plane and 16-wide slice of the head dimension.
    u32 qf[P][D / 16][4];
#pragma unroll
    for (int p = 0; p < P; ++p) {
        if (p > 0) {  // the residuals into the staging tile the high parts have left
            __syncthreads();
            load_q(p);
            cp_async_commit();
            asm volatile("cp.async.wait_group 0;\n" ::: "memory");
            __syncthreads();
        }
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk)
            ldsm_x4(qf[p][kk],
                    qs + (warp * 16 + lr + 8 * (lm & 1)) * LD + kk * 16 + 8 * (lm >> 1));
    }

    int warp_first = q0 + warp * 16;
    // Under SPLIT, this thread's two rows' scales back (rows past the end: any finite one).
    float uq[2];
#pragma unroll
    for (int i = 0; i < 2; ++i)
        uq[i] = SPLIT ? q_undo[(long long)min(warp_first + g + 8 * i, tokens - 1) * heads + h] : 1.0f;
    SoftmaxRows r = softmax_rows(warp_first, g, tokens, seq_start, window);
    add_sink(r, sinks, h, scale_log2, t);
    int warp_last = min(warp_first + 15, qlast);
    // Keys before this start belong to an earlier sequence (or lie outside the window) of some
    // row of this warp.
    int warp_start =
        warp_first <= qlast ? first_key(warp_last, (int)seq_start[warp_last], window) : 0x7fffffff;

    float o[DT][4];
    zero_tiles(o);

    for (int n = 0; n < n_tiles; ++n) {
        next_tile(n, n_tiles, load_tile);
        __syncthreads();
        int k0 = kstart + n * FA_BN;
        const bf16_t* ks = kvs + (n & 1) * 2 * P * KV;
        const bf16_t* vs = ks + P * KV;
        if (k0 <= warp_last) {  // causal: later tiles hold no key visible to this warp
            float s[NT][4];
            zero_tiles(s);
#pragma unroll
            for (int kk = 0; kk < D / 16; ++kk) {
#pragma unroll
                for (int jp = 0; jp < NT / 2; ++jp) {
                    int at = (jp * 16 + lr + 8 * (lm >> 1)) * LD + kk * 16 + 8 * (lm & 1);
                    u32 b[4];
                    ldsm_x4(b, ks + at);
                    if (SPLIT) {
                        u32 bl[4];
                        ldsm_x4(bl, ks + KV + at);
                        mma_f16(s[2 * jp], qf[0][kk], b[0], b[1]);
                        mma_f16(s[2 * jp + 1], qf[0][kk], b[2], b[3]);
                        mma_f16(s[2 * jp], qf[0][kk], bl[0], bl[1]);
                        mma_f16(s[2 * jp + 1], qf[0][kk], bl[2], bl[3]);
                        mma_f16(s[2 * jp], qf[P - 1][kk], b[0], b[1]);
                        mma_f16(s[2 * jp + 1], qf[P - 1][kk], b[2], b[3]);
                    } else {
                        mma_bf16(s[2 * jp], qf[0][kk], b[0], b[1]);
                        mma_bf16(s[2 * jp + 1], qf[0][kk], b[2], b[3]);
                    }
                }
            }
            if (SPLIT) {  // the rows' and keys' powers of two undone (exact)
#pragma unroll
                for (int j = 0; j < NT; ++j) {
#pragma unroll
                    for (int c = 0; c < 2; ++c) {
                        int key = min(k0 + 8 * j + 2 * t + c, tokens - 1);
                        float uk = k_undo[(long long)key * kv_heads + kh];
                        s[j][c] *= uq[0] * uk;
                        s[j][2 + c] *= uq[1] * uk;
                    }
                }
            }

            // Only tiles that reach past a row's own position or before its sequence's start
            // need the mask.
            float alpha[2];
            softmax_tile(s, r, k0 + FA_BN - 1 > warp_first || k0 < warp_start, k0, t, scale_log2,
                         softcap, alpha, key_mask, mask_words);
            scale_rows(o, alpha);

            // O += P V, P rounded to bf16 as the A operand straight from the S registers. Under
            // SPLIT P and V are f16 planes, and a tile's products are summed in registers of
            // their own and then added to O in f32, rounded to nearest: the tensor cores'
            // accumulation truncates, and O runs over every key.
            float ot[DT][4];
            float(&acc)[DT][4] = SPLIT ? ot : o;
            if (SPLIT) zero_tiles(ot);
#pragma unroll
            for (int ks16 = 0; ks16 < FA_BN / 16; ++ks16) {
                u32 a[4], al[4];
                if (SPLIT) {
                    p_operand_f16(s, ks16, a, al);
                } else {
                    p_operand(s, ks16, a);
                }
#pragma unroll
                for (int jp = 0; jp < DT / 2; ++jp) {
                    int at = (ks16 * 16 + lr + 8 * (lm & 1)) * LD + jp * 16 + 8 * (lm >> 1);
                    u32 b[4];
                    ldsm_x4_trans(b, vs + at);
                    if (SPLIT) {
                        u32 bl[4];
                        ldsm_x4_trans(bl, vs + KV + at);
                        mma_f16(acc[2 * jp], a, b[0], b[1]);
                        mma_f16(acc[2 * jp + 1], a, b[2], b[3]);
                        mma_f16(acc[2 * jp], a, bl[0], bl[1]);
                        mma_f16(acc[2 * jp + 1], a, bl[2], bl[3]);
                        mma_f16(acc[2 * jp], al, b[0], b[1]);
                        mma_f16(acc[2 * jp + 1], al, b[2], b[3]);
                    } else {
                        mma_bf16(acc[2 * jp], a, b[0], b[1]);
                        mma_bf16(acc[2 * jp + 1], a, b[2], b[3]);
                    }
                }
            }
            if (SPLIT) {
#pragma unroll
                for (int d = 0; d < DT; ++d)
#pragma unroll
                    for (int i = 0; i < 4; ++i) o[d][i] += ot[d][i];
            }
        }
        __syncthreads();  // every warp is done with this stage before it is refilled
    }

    if (SPLIT) {  // P's 2^14 and each column's power of two (split_columns_f16.cu) undone
#pragma unroll
        for (int j = 0; j < DT; ++j) {
#pragma unroll
            for (int c = 0; c < 2; ++c) {
                float top = __uint_as_float(v_top[kh * D + j * 8 + 2 * t + c]);
                float undo = ldexpf(1.0f / P_F16_SCALE, -f16_plane_exponent(top));
                o[j][c] *= undo;
                o[j][2 + c] *= undo;
            }
        }
    }
    store_rows(out + h * D, o, r, tokens, qw, t);
}

template <int D, typename To>
__device__ void flash_attention(To* out, const bf16_t* q, const bf16_t* k, const bf16_t* v,
                                const u32* seq_start, int tokens, int heads, int kv_heads,
                                float scale_log2, float softcap, int window,
                                const float* sinks, const u32* key_mask, int mask_words) {
    flash_attention_planes<D, false>(out, q, k, v, seq_start, tokens, heads, kv_heads,
                                     scale_log2, softcap, window, sinks, nullptr, nullptr,
                                     nullptr, key_mask, mask_words);
}

// The explicit minimum of one block per SM is measured, not cosmetic: with the thread count
// alone the driver's PTX compiler produced a head_dim-128 kernel that took 0.85 ms instead of
// 0.66 ms on an 8B layer (H200). The kernel is bound by its ALU work between the MMAs (the
// softmax), which is also why P is packed with cvt.rn.bf16x2 and the scale is folded into exp2.
FLASH_ENTRIES(flash_attention, __launch_bounds__(FA_WARPS * 32, 1), const bf16_t*)

// The split entries take f16 planes (16-bit values, passed as bf16_t) and what undoes their
// scales: q's and k's rows', v's columns' largest magnitudes.
#define FLASH_SPLIT_ENTRY(D, OUT, TOUT)                                                         \
    extern "C" __global__ void __launch_bounds__(FA_WARPS * 32, 1)                              \
        flash_attention_split_d##D##_##OUT(TOUT* out, const bf16_t* q, const bf16_t* k,         \
                                           const bf16_t* v, const u32* seq_start, int tokens,   \
                                           int heads, int kv_heads, float scale_log2,           \
                                           float softcap, int window, const float* sinks,       \
                                           const u32* key_mask, int mask_words,                 \
                                           const float* q_undo, const float* k_undo,            \
                                           const u32* v_top) {                                  \
        flash_attention_planes<D, true>(out, q, k, v, seq_start, tokens, heads, kv_heads,       \
                                        scale_log2, softcap, window, sinks, q_undo, k_undo,     \
                                        v_top, key_mask, mask_words);                           \
    }
FLASH_SPLIT_ENTRY(64, bf16, bf16_t)
FLASH_SPLIT_ENTRY(64, f32, float)
FLASH_SPLIT_ENTRY(128, bf16, bf16_t)
FLASH_SPLIT_ENTRY(128, f32, float)

// Wider heads on this kernel only: DeepSeek's 192-value query/key heads (latent attention's
// values padded to them) and the 256 of Gemma 2 9B / Gemma 3 4B-27B's smaller siblings. Their
// Q tile and two K/V stages need 153 and 202 KiB of shared memory; attention.rs loads them
// where the device allows that much.
#define FLASH_WIDE(D)                                                                          \
    FLASH_ENTRY(flash_attention, __launch_bounds__(FA_WARPS * 32, 1), const bf16_t*, D, bf16,  \
                bf16_t)                                                                        \
    FLASH_ENTRY(flash_attention, __launch_bounds__(FA_WARPS * 32, 1), const bf16_t*, D, f32,   \
                float)
FLASH_WIDE(192)
FLASH_WIDE(256)
