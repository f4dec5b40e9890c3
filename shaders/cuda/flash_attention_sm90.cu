// Causal grouped-query attention on Hopper's warpgroup tensor-core instructions (sm_90a):
// bf16 q, k, v, f32 accumulation, no score matrix in memory. The same algorithm and register
// layouts as flash_attention.cu (see there and common.cuh), with S = Q K^T and O += P V issued
// as wgmma by a warpgroup of 4 warps for 64 query rows at once, reading Q, K and V straight
// from shared memory, and the tiles brought there by the tensor memory accelerator (TMA): one
// thread asks for each tile with cp.async.bulk.tensor, the copy engine signals an mbarrier,
// and no other thread spends an instruction on loading (BENCHMARKS.md: twice the rate of the
// same kernel loading with cp.async, whose per-thread copies bounded it).
// A block of 2 warpgroups takes 128 query rows of one head; key and value tiles of 64 rows are
// double-buffered. Causal skipping is per warpgroup (wgmma is issued by all four warps
// together), masking per warp.
//
// Shared memory holds every tile as the TMA writes it with 128-byte swizzling, which is also a
// layout wgmma reads: boxes of 64 rows x 64 columns (128 bytes per row, the 16-byte chunks of
// row r permuted by r % 8), 8-row groups 1024 bytes apart, one box per 64 columns of the head.
// A wgmma descriptor names a start address, the swizzle mode and the byte distances between
// core-matrix groups: for Q and K (K-major, K = head dimension) SBO = 1024 between 8-row
// groups, a k16 step being 32 bytes further inside the box (the hardware applies the swizzle
// to the address). V serves as B = V (keys x head dimension) with K = keys, so it is MN-major:
// SBO = 1024 between 8-key groups, LBO = one box between 64-column halves, and the
// instruction's transpose flag set. Rows past the last token arrive as zeros.

#define FH_WARPS 8
#define FH_BM 128  // query rows per block: 64 per warpgroup
#define FH_BN 64   // keys per tile

#define FH_BOX (64 * 128)  // bytes of a 64 x 64 box of bf16

// s = Q K^T over one k16 slice of the head dimension (m64n64k16), both operands in shared
// memory (K-major); `accumulate` false for the first slice.
__device__ __forceinline__ void wgmma_qk(float (&d)[8][4], unsigned long long q,
                                         unsigned long long k, bool accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " WG_REGS32
        ", %32, %33, p, 1, 1, 0, 0;\n}\n"
        : WG_TILES8(d, 0)
        : "l"(q), "l"(k), "r"((int)accumulate));
}

// o += P V over 16 keys (m64nDk16): P from registers (the A layout of m16n8k16 per warp),
// V in shared memory as stored, keys x head dimension, so transposed (MN-major). D = 64, 128.
__device__ __forceinline__ void wgmma_pv(float (&d)[8][4], const u32 (&p)[4],
                                         unsigned long long v) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " WG_REGS32
        ", {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
        : WG_TILES8(d, 0)
        : "r"(p[0]), "r"(p[1]), "r"(p[2]), "r"(p[3]), "l"(v));
}

__device__ __forceinline__ void wgmma_pv(float (&d)[16][4], const u32 (&p)[4],
                                         unsigned long long v) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " WG_REGS64
        ", {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
        : WG_TILES8(d, 0), WG_TILES8(d, 8)
        : "r"(p[0]), "r"(p[1]), "r"(p[2]), "r"(p[3]), "l"(v));
}

template <int D, typename To>
__device__ void flash_attention_sm90(To* out, const TensorMap& q, const TensorMap& k,
                                     const TensorMap& v, const u32* seq_start, int tokens,
                                     int heads, int kv_heads, float scale_log2, float softcap,
                                     int window, const float* sinks) {
    constexpr int NB = D / 64;          // boxes per 64 rows of a head
    constexpr int TILE = NB * FH_BOX;   // bytes of 64 rows
    constexpr int NT = FH_BN / 8;       // 8-key tiles of S
    constexpr int DT = D / 8;           // 8-wide tiles of O
    extern __shared__ unsigned char fh_smem[];
    // FH_BM query rows, then two stages of [K tile, V tile], then the barriers of Q and of the
    // two stages; the swizzle pattern repeats every 1024 bytes, so the tiles start aligned.
    u32 qs = (smem_addr(fh_smem) + 1023) & ~1023u;
    u32 kvs = qs + 2 * TILE, bar_q = kvs + 4 * TILE, bar_kv = bar_q + 8;

    int h = blockIdx.y, kh = h / (heads / kv_heads);
    int q0 = (gridDim.x - 1 - blockIdx.x) * FH_BM;  // the longest rows first
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, wg = warp >> 2;
    int g = lane >> 2, t = lane & 3;
    int qlast = min(q0 + FH_BM, tokens) - 1;
    int kstart = first_key(q0, (int)seq_start[q0], window);  // never decreases along the rows
    int n_tiles = (qlast - kstart) / FH_BN + 1;

    // Keys and values of tile `n` into stage n % 2 (issued by thread 0). Rows past the block's
    // last query hold later tokens' keys, which the causal mask hides.
    auto load_tile = [&](int n) {
        int k0 = kstart + n * FH_BN;
        u32 stage = kvs + (n & 1) * 2 * TILE, bar = bar_kv + 8 * (n & 1);
        mbarrier_expect(bar, 2 * TILE);
#pragma unroll
        for (int b = 0; b < NB; ++b) {
            tma_box(stage + b * FH_BOX, k, bar, kh * D + b * 64, k0);
            tma_box(stage + TILE + b * FH_BOX, v, bar, kh * D + b * 64, k0);
        }
    };
    if (threadIdx.x == 0) {
        mbarrier_init(bar_q, 1);
        mbarrier_init(bar_kv, 1);
        mbarrier_init(bar_kv + 8, 1);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        mbarrier_expect(bar_q, 2 * TILE);
#pragma unroll
        for (int w = 0; w < 2; ++w)
#pragma unroll
            for (int b = 0; b < NB; ++b)
                tma_box(qs + w * TILE + b * FH_BOX, q, bar_q, h * D + b * 64, q0 + w * 64);
        load_tile(0);
    }

    int warp_first = q0 + warp * 16;
    SoftmaxRows r = softmax_rows(warp_first, g, tokens, seq_start, window);
    add_sink(r, sinks, h, scale_log2, t);
    int warp_last = min(warp_first + 15, qlast);
    // Keys before this start belong to an earlier sequence (or lie outside the window) of some
    // row of this warp.
    int warp_start =
        warp_first <= qlast ? first_key(warp_last, (int)seq_start[warp_last], window) : 0x7fffffff;
    int wg_last = min(q0 + wg * 64 + 63, qlast);
    u32 q_addr = qs + wg * TILE;

    float o[DT][4];
    zero_tiles(o);
    mbarrier_wait(bar_q, 0);

    for (int n = 0; n < n_tiles; ++n) {
        // Stage (n + 1) % 2 was released by the barrier that ended the previous iteration.
        if (threadIdx.x == 0 && n + 1 < n_tiles) load_tile(n + 1);
        int k0 = kstart + n * FH_BN;
        u32 k_addr = kvs + (n & 1) * 2 * TILE, v_addr = k_addr + TILE;
        // Causal: later tiles hold no key visible to this warpgroup. The last warpgroup waits
        // on every tile, so no copy is still in flight when the block exits.
        if (k0 <= wg_last) {
            mbarrier_wait(bar_kv + 8 * (n & 1), (n >> 1) & 1);
            float s[NT][4];
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < D / 16; ++kk) {
                u32 at = (kk / 4) * FH_BOX + (kk % 4) * 32;
                wgmma_qk(s, wgmma_desc(q_addr + at, 16, 1024), wgmma_desc(k_addr + at, 16, 1024),
                         kk > 0);
            }
            wgmma_commit_wait();
            hold(s);

            // Only tiles that reach past a row's own position or before its sequence's start
            // need the mask.
            float alpha[2];
            softmax_tile(s, r, k0 + FH_BN - 1 > warp_first || k0 < warp_start, k0, t, scale_log2,
                         softcap, alpha);
            scale_rows(o, alpha);

            // O += P V, P rounded to bf16 as the A operand straight from the S registers.
            u32 p[FH_BN / 16][4];
#pragma unroll
            for (int ks = 0; ks < FH_BN / 16; ++ks) p_operand(s, ks, p[ks]);
            wgmma_fence();
#pragma unroll
            for (int ks = 0; ks < FH_BN / 16; ++ks)
                wgmma_pv(o, p[ks], wgmma_desc(v_addr + ks * 2048, FH_BOX, 1024));
            wgmma_commit_wait();
            hold(o);
        }
        __syncthreads();  // every warp is done with this stage before it is refilled
    }

    store_rows(out + h * D, o, r, tokens, (long long)heads * D, t);
}

// Two blocks per SM (97 KB of shared memory each): their four warpgroups keep the tensor cores
// busy while each waits on its wgmma groups and runs the softmax.
FLASH_ENTRIES(flash_attention_sm90, __launch_bounds__(FH_WARPS * 32, 2),
              const __grid_constant__ TensorMap)
