// nvrtc: sm_90a
// Causal grouped-query attention on Hopper's warpgroup tensor-core instructions (sm_90a):
// bf16 q, k, v, f32 accumulation, no score matrix in memory. The same algorithm and register
// layouts as flash_attention.cu (see there and common.cuh), with S = Q K^T and O += P V issued
// as wgmma by a warpgroup of 4 warps for 64 query rows at once, reading Q, K and V straight
// from shared memory, and the tiles brought there by the tensor memory accelerator (TMA).
// As FlashAttention-3 does it: a block is a loading warpgroup (one thread asks for every tile
// with cp.async.bulk.tensor; its registers given to the others with setmaxnreg) and two
// multiplying warpgroups of 64 query rows each (128 an item), one persistent block a
// multiprocessor taking items (a query tile of a head) in turn, keys in tiles of 128, keys and
// values in rings of two stages each, a stage full when its bytes have arrived and empty once
// both multiplying warpgroups are done with it (mbarriers, no block-wide barrier in the loop).
// Within a warpgroup, tile n's O += P V runs on the tensor cores while the CUDA cores take tile
// n + 1's softmax, its S = Q K^T issued just before; the two warpgroups take turns to issue.
// Causal skipping is per warpgroup (wgmma is issued by all four warps together), masking per
// warp. tools/fa_protocol.py model-checks the synchronization (the loader, both multiplying
// warpgroups, the mbarrier parities and the turns) over random schedules: run it after
// changing any wait, release or turn here.
//
// Shared memory holds every tile as the TMA writes it with 128-byte swizzling, which is also a
// layout wgmma reads: boxes of 64 rows x 64 columns (128 bytes per row, the 16-byte chunks of
// row r permuted by r % 8), 8-row groups 1024 bytes apart. Q: a warpgroup's 64 rows as one box
// per 64 columns of the head. K and V tiles: per 64 columns, the boxes of keys 0-63 and 64-127
// one after the other, so 128 keys are 16 groups 1024 bytes apart. A wgmma descriptor names a
// start address, the swizzle mode and the byte distances between core-matrix groups: for Q and
// K (K-major, K = head dimension) SBO = 1024 between 8-row groups, a k16 step being 32 bytes
// further inside the box (the hardware applies the swizzle to the address). V serves as B = V
// (keys x head dimension) with K = keys, so it is MN-major: SBO = 1024 between 8-key groups,
// LBO = two boxes between 64-column halves, and the instruction's transpose flag set. Rows
// past the last token arrive as zeros.

#define FH_WARPS 12  // a loading warpgroup and two multiplying ones
#define FH_BM 128    // query rows per block: 64 per multiplying warpgroup
#define FH_BN 128    // keys per tile
#define FH_LOAD_REGS 24  // 128 * 24 + 256 * 240 <= 65,536
#define FH_MMA_REGS 240

#define FH_BOX (64 * 128)  // bytes of a 64 x 64 box of bf16

// s = Q K^T over one k16 slice of the head dimension (m64n128k16), both operands in shared
// memory (K-major); `accumulate` false for the first slice.
__device__ __forceinline__ void wgmma_qk(float (&d)[16][4], unsigned long long q,
                                         unsigned long long k, bool accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " WG_REGS64
        ", %64, %65, p, 1, 1, 0, 0;\n}\n"
        : WG_TILES8(d, 0), WG_TILES8(d, 8)
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

// One query tile of one head: a block's unit of work.
struct FhItem {
    int q0, h, qlast, kstart, n_tiles;
};

// Work item i of a launch: the longest rows first (query tiles from the last), all heads of a
// tile together (a group's heads read the same keys).
__device__ __forceinline__ FhItem fh_item(int i, int heads, int tokens, const u32* seq_start,
                                          int window) {
    int q_tiles = (tokens + FH_BM - 1) / FH_BM;
    FhItem w;
    w.q0 = (q_tiles - 1 - i / heads) * FH_BM;
    w.h = i % heads;
    w.qlast = min(w.q0 + FH_BM, tokens) - 1;
    w.kstart = first_key(w.q0, (int)seq_start[w.q0], window);  // never decreases along the rows
    w.n_tiles = (w.qlast - w.kstart) / FH_BN + 1;
    return w;
}

template <int D, typename To>
__device__ void flash_attention_sm90(To* out, const TensorMap& q, const TensorMap& k,
                                     const TensorMap& v, const u32* seq_start, int tokens,
                                     int heads, int kv_heads, float scale_log2, float softcap,
                                     int window, const float* sinks, const u32* key_mask,
                                     int mask_words) {
    constexpr int NB = D / 64;            // boxes per 64 rows of a head
    constexpr int Q_TILE = NB * FH_BOX;   // bytes of a warpgroup's 64 query rows
    constexpr int KV_TILE = 2 * Q_TILE;   // bytes of a tile of 128 keys (or values)
    constexpr int NT = FH_BN / 8;         // 8-key tiles of S
    constexpr int DT = D / 8;             // 8-wide tiles of O
    extern __shared__ unsigned char fh_smem[];
    // Two Q buffers (a block's 128 rows each), two key stages, two value stages, then the
    // barriers, two of each: Q full and empty, keys full, values full, keys empty, values
    // empty; the swizzle pattern repeats every 1024 bytes, so the tiles start aligned.
    u32 qs = (smem_addr(fh_smem) + 1023) & ~1023u;
    u32 ks = qs + 4 * Q_TILE, vs = ks + 2 * KV_TILE;
    u32 q_full = vs + 2 * KV_TILE, q_empty = q_full + 16, k_full = q_empty + 16;
    u32 v_full = k_full + 16, k_empty = v_full + 16, v_empty = k_empty + 16;
    int items = (tokens + FH_BM - 1) / FH_BM * heads, group = heads / kv_heads;
    int wg = __shfl_sync(0xffffffffu, threadIdx.x / 128, 0);

    if (threadIdx.x == 0) {
        for (int i = 0; i < 2; ++i) {
            mbarrier_init(q_full + 8 * i, 1);
            mbarrier_init(q_empty + 8 * i, 256);
            mbarrier_init(k_full + 8 * i, 1);
            mbarrier_init(v_full + 8 * i, 1);
            mbarrier_init(k_empty + 8 * i, 256);
            mbarrier_init(v_empty + 8 * i, 256);
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();

    // Persistent blocks: block b takes items b, b + gridDim.x, ...; its j-th item uses Q buffer
    // j % 2, and its key and value tiles run on through one ring (`slot` counts them), so the
    // loader fetches the next item's Q and first tiles while this one's last are multiplied.
    // A ring slot's barriers complete once per use: use u of a buffer has parity u % 2.
    auto wait_slot = [](u32 bars, int slot) {
        mbarrier_wait(bars + 8 * (slot & 1), (slot >> 1) & 1);
    };
    if (wg == 0) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(FH_LOAD_REGS));
        if (threadIdx.x != 0) return;
        int slot = 0;
        for (int i = blockIdx.x, j = 0; i < items; i += gridDim.x, ++j) {
            FhItem w = fh_item(i, heads, tokens, seq_start, window);
            int kh = w.h / group;
            // Tile n of keys (or values) into ring slot `at` once both multiplying warpgroups
            // have released the tile two slots before. Rows past the item's last query hold
            // later tokens' keys, which the causal mask hides.
            auto load = [&](const TensorMap& map, u32 stages, u32 full, u32 empty, int at,
                            int n) {
                u32 stage = stages + (at & 1) * KV_TILE, bar = full + 8 * (at & 1);
                if (at >= 2) wait_slot(empty, at - 2);
                mbarrier_expect(bar, KV_TILE);
#pragma unroll
                for (int b = 0; b < NB; ++b)
#pragma unroll
                    for (int r = 0; r < 2; ++r)
                        tma_box(stage + (2 * b + r) * FH_BOX, map, bar, kh * D + b * 64,
                                w.kstart + n * FH_BN + r * 64);
            };
            u32 qbuf = qs + (j & 1) * 2 * Q_TILE, qbar = q_full + 8 * (j & 1);
            if (j >= 2) wait_slot(q_empty, j - 2);
            mbarrier_expect(qbar, 2 * Q_TILE);
#pragma unroll
            for (int half = 0; half < 2; ++half)
#pragma unroll
                for (int b = 0; b < NB; ++b)
                    tma_box(qbuf + half * Q_TILE + b * FH_BOX, q, qbar, w.h * D + b * 64,
                            w.q0 + half * 64);
            // Keys one tile ahead of values: a warpgroup needs tile n + 1's keys with tile n's
            // values.
            load(k, ks, k_full, k_empty, slot, 0);
            for (int n = 0; n < w.n_tiles; ++n) {
                if (n + 1 < w.n_tiles) load(k, ks, k_full, k_empty, slot + n + 1, n + 1);
                load(v, vs, v_full, v_empty, slot + n, n);
            }
            slot += w.n_tiles;
        }
        return;
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(FH_MMA_REGS));

    int lane = threadIdx.x & 31, warp = (threadIdx.x >> 5) - 4, mwg = wg - 1;
    int g = lane >> 2, t = lane & 3;
    auto release = [](u32 empty, int slot) { mbarrier_arrive(empty + 8 * (slot & 1)); };
    // Ping-pong: the two warpgroups take turns to issue their wgmmas (named barriers 1 and 2,
    // each completed by one warpgroup's bar.sync and the other's bar.arrive), so one's softmax
    // runs while the other's products keep the tensor cores busy. Both take n_tiles + 1 turns
    // an item.
    auto my_turn = [&] { asm volatile("bar.sync %0, 256;\n" ::"r"(1 + mwg) : "memory"); };
    auto their_turn = [&] { asm volatile("bar.arrive %0, 256;\n" ::"r"(2 - mwg) : "memory"); };
    if (mwg == 1) asm volatile("bar.arrive 1, 256;\n" ::: "memory");  // the first goes first

    int slot = 0;
    for (int i = blockIdx.x, j = 0; i < items; i += gridDim.x, ++j) {
        FhItem w = fh_item(i, heads, tokens, seq_start, window);
        int warp_first = w.q0 + warp * 16;
        SoftmaxRows r = softmax_rows(warp_first, g, tokens, seq_start, window);
        add_sink(r, sinks, w.h, scale_log2, t);
        int warp_last = min(warp_first + 15, w.qlast);
        // Keys before this start belong to an earlier sequence (or lie outside the window) of
        // some row of this warp.
        int warp_start = warp_first <= w.qlast
                             ? first_key(warp_last, (int)seq_start[warp_last], window)
                             : 0x7fffffff;
        int wg_last = min(w.q0 + mwg * 64 + 63, w.qlast);
        u32 q_addr = qs + (j & 1) * 2 * Q_TILE + mwg * Q_TILE;
        // Causal: tiles from this one on hold no key visible to this warpgroup (at most the
        // last tile, the warpgroups' last rows being 64 apart).
        int visible = min(w.n_tiles, (wg_last - w.kstart) / FH_BN + 1);

        // S = Q K^T of tile n into s (issued and committed, not waited for).
        auto issue_scores = [&](float (&s)[NT][4], int n) {
            u32 k_addr = ks + ((slot + n) & 1) * KV_TILE;
#pragma unroll
            for (int kk = 0; kk < D / 16; ++kk)
                wgmma_qk(s, wgmma_desc(q_addr + (kk / 4) * FH_BOX + (kk % 4) * 32, 16, 1024),
                         wgmma_desc(k_addr + (kk / 4) * 2 * FH_BOX + (kk % 4) * 32, 16, 1024),
                         kk > 0);
            wgmma_commit();
        };
        // Only tiles that reach past a row's own position or before its sequence's start need
        // the mask.
        auto softmax = [&](float (&s)[NT][4], int n, float (&alpha)[2]) {
            int k0 = w.kstart + n * FH_BN;
            softmax_tile(s, r, k0 + FH_BN - 1 > warp_first || k0 < warp_start, k0, t,
                         scale_log2, softcap, alpha, key_mask, mask_words);
        };

        float o[DT][4];
        zero_tiles(o);
        float s[NT][4];
        u32 p[FH_BN / 16][4];
        float alpha[2];
        auto issue_values = [&](int n) {
            u32 v_addr = vs + ((slot + n) & 1) * KV_TILE;
#pragma unroll
            for (int jj = 0; jj < FH_BN / 16; ++jj)
                wgmma_pv(o, p[jj], wgmma_desc(v_addr + (jj / 4) * FH_BOX + (jj % 4) * 2048,
                                              2 * FH_BOX, 1024));
            wgmma_commit();
        };
        wait_slot(q_full, j);
        wait_slot(k_full, slot);
        my_turn();
        wgmma_fence();
        issue_scores(s, 0);
        their_turn();
        wgmma_wait<0>();
        hold(s);
        release(k_empty, slot);
        softmax(s, 0, alpha);
#pragma unroll
        for (int jj = 0; jj < FH_BN / 16; ++jj) p_operand(s, jj, p[jj]);

        // O, rescaled by tile n + 1's alpha only once tile n's P V is done, sees the same
        // operations in the same order as without the overlap. The last visible tile's P V is
        // issued alone after the loop, so no wgmma here depends on a condition of its own
        // (which makes ptxas serialize them all).
        for (int n = 0; n + 1 < visible; ++n) {
            wait_slot(k_full, slot + n + 1);
            wait_slot(v_full, slot + n);
            my_turn();
            wgmma_fence();
            issue_scores(s, n + 1);
            issue_values(n);
            their_turn();
            wgmma_wait<1>();
            hold(s);
            release(k_empty, slot + n + 1);
            softmax(s, n + 1, alpha);
            wgmma_wait<0>();
            hold(o);
            hold(p);
            release(v_empty, slot + n);
            scale_rows(o, alpha);
#pragma unroll
            for (int jj = 0; jj < FH_BN / 16; ++jj) p_operand(s, jj, p[jj]);
        }
        wait_slot(v_full, slot + visible - 1);
        my_turn();
        wgmma_fence();
        issue_values(visible - 1);
        their_turn();
        wgmma_wait<0>();
        hold(o);
        hold(p);
        release(v_empty, slot + visible - 1);
        release(q_empty, j);
        // The tile this warpgroup does not see (if any) is still waited for and released, and
        // its turn taken: the loader reuses a slot only when both warpgroups have released it,
        // no copy is in flight when the block exits, and the turns stay paired.
        for (int n = visible; n < w.n_tiles; ++n) {
            wait_slot(k_full, slot + n);
            release(k_empty, slot + n);
            wait_slot(v_full, slot + n);
            release(v_empty, slot + n);
            my_turn();
            their_turn();
        }
        store_rows(out + w.h * D, o, r, tokens, (long long)heads * D, t);
        slot += w.n_tiles;
    }
}

// One persistent block a SM (193 KB of shared memory for heads of 128).
FLASH_ENTRIES(flash_attention_sm90, __launch_bounds__(FH_WARPS * 32, 1),
              const __grid_constant__ TensorMap)
