// Causal grouped-query attention on Hopper's warpgroup tensor-core instructions (sm_90a):
// bf16 q, k, v, f32 accumulation, no score matrix in memory. The same algorithm and register
// layouts as flash_attention.cu (see there and common.cuh), with S = Q K^T and O += P V issued
// as wgmma by a warpgroup of 4 warps for 64 query rows at once, reading Q, K and V straight
// from shared memory, instead of mma.sync per warp fed by ldmatrix (no operand loads, half the
// MMA instructions). The key/value tile loads now bound it (BENCHMARKS.md: the wgmma work alone
// runs at 2.3 times this kernel's rate; ncu finds L2 82 % busy): TMA is the next step.
// A block of 2 warpgroups takes 128 query rows of one head; key and value tiles of 64 rows are
// double-buffered with cp.async as there. Causal skipping is per warpgroup (wgmma is issued by
// all four warps together), masking per warp.
//
// Shared memory holds every tile in the no-swizzle "core matrix" layout of wgmma: 8 rows x 16
// bytes contiguous (128 bytes), the core matrices of 8 rows laid out along the head dimension
// (128 bytes apart), then the next 8 rows (D * 16 bytes apart). A descriptor names a start
// address, the byte distance between core matrices adjacent along the product's K dimension
// (LBO) and along M or N (SBO). Q and K are K-major (K = head dimension): LBO 128, SBO D * 16.
// V serves as B = V (keys x head dimension) with K = keys, so it is MN-major: LBO D * 16 (the
// next 8 keys), SBO 128 (the next 8 columns), and the instruction's transpose flag set.

#define FH_WARPS 8
#define FH_BM 128  // query rows per block: 64 per warpgroup
#define FH_BN 64   // keys per tile

__device__ __forceinline__ unsigned long long wgmma_desc(u32 addr, u32 lbo, u32 sbo) {
    return (unsigned long long)((addr & 0x3ffff) >> 4) | ((unsigned long long)(lbo >> 4) << 16) |
           ((unsigned long long)(sbo >> 4) << 32);
}

// Register accesses before this are ordered before the warpgroup's next wgmma.
__device__ __forceinline__ void wgmma_fence() {
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}

// Commits the issued wgmmas and waits until they are done.
__device__ __forceinline__ void wgmma_commit_wait() {
    asm volatile("wgmma.commit_group.sync.aligned;\nwgmma.wait_group.sync.aligned 0;\n" :::
                     "memory");
}

// Shared memory written by the generic proxy (cp.async) is read by wgmma through the async
// proxy: each writing thread fences before the barrier that publishes it.
__device__ __forceinline__ void fence_proxy_async() {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// The compiler sees an accumulator as written by the wgmma asm statement, though the hardware
// writes it only by the wait: this keeps its uses from moving above the wait.
template <int N>
__device__ __forceinline__ void hold(float (&r)[N][4]) {
#pragma unroll
    for (int j = 0; j < N; ++j)
        asm volatile("" : "+f"(r[j][0]), "+f"(r[j][1]), "+f"(r[j][2]), "+f"(r[j][3])::"memory");
}

// s = Q K^T over one k16 slice of the head dimension (m64n64k16), both operands in shared
// memory (K-major); `accumulate` false for the first slice.
__device__ __forceinline__ void wgmma_qk(float (&d)[8][4], unsigned long long q,
                                         unsigned long long k, bool accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
        "%32, %33, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]),
          "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
          "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
          "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]),
          "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]),
          "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
          "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]),
          "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
        : "l"(q), "l"(k), "r"((int)accumulate));
}

// o += P V over 16 keys (m64nDk16): P from registers (the A layout of m16n8k16 per warp),
// V in shared memory as stored, keys x head dimension, so transposed (MN-major). D = 64, 128.
__device__ __forceinline__ void wgmma_pv(float (&d)[8][4], const u32 (&p)[4],
                                         unsigned long long v) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
        "{%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]),
          "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
          "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
          "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]),
          "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]),
          "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
          "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]),
          "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
        : "r"(p[0]), "r"(p[1]), "r"(p[2]), "r"(p[3]), "l"(v));
}

__device__ __forceinline__ void wgmma_pv(float (&d)[16][4], const u32 (&p)[4],
                                         unsigned long long v) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
        "{%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]),
          "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
          "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
          "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]),
          "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]),
          "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
          "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]),
          "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]),
          "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]),
          "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]),
          "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]),
          "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]),
          "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]),
          "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]),
          "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]),
          "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3])
        : "r"(p[0]), "r"(p[1]), "r"(p[2]), "r"(p[3]), "l"(v));
}

template <int D, typename To>
__device__ void flash_attention_sm90(To* out, const bf16_t* q, const bf16_t* k, const bf16_t* v,
                                     const u32* seq_start, int tokens, int heads, int kv_heads,
                                     float scale_log2) {
    constexpr int CH = D / 8;        // 16-byte chunks per row, core matrices along the row
    constexpr int ROW8 = CH * 128;   // bytes of 8 rows
    constexpr int NT = FH_BN / 8;    // 8-key tiles of S
    constexpr int DT = D / 8;        // 8-wide tiles of O
    constexpr int KV = FH_BN * D;    // elements of one K or V tile
    extern __shared__ __align__(128) unsigned char fh_smem[];
    bf16_t* qs = (bf16_t*)fh_smem;  // FH_BM rows
    bf16_t* kvs = qs + FH_BM * D;   // two stages of [K tile, V tile]

    int h = blockIdx.y, kh = h / (heads / kv_heads);
    int q0 = (gridDim.x - 1 - blockIdx.x) * FH_BM;  // the longest rows first
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, wg = warp >> 2;
    int g = lane >> 2, t = lane & 3;
    long long qw = (long long)heads * D, kw = (long long)kv_heads * D;
    int qlast = min(q0 + FH_BM, tokens) - 1;
    int kstart = (int)seq_start[q0];  // starts never decrease along the rows
    int n_tiles = (qlast - kstart) / FH_BN + 1;

    // 16-byte chunk i of a tile in the core-matrix layout is row 8 (i / (8 CH)) + i % 8,
    // columns 8 ((i / 8) % CH) onwards: 8 consecutive threads fill one core matrix.
    for (int i = threadIdx.x; i < FH_BM * CH; i += blockDim.x) {
        int r = (i / (8 * CH)) * 8 + (i & 7), c = ((i >> 3) % CH) * 8, tok = q0 + r;
        cp_async16(qs + i * 8, q + (long long)min(tok, tokens - 1) * qw + h * D + c, tok < tokens);
    }
    cp_async_commit();
    // Keys and values of tile `n` into stage n % 2; rows past the block's last query are zero.
    auto load_tile = [&](int n) {
        int k0 = kstart + n * FH_BN;
        bf16_t* ks = kvs + (n & 1) * 2 * KV;
        for (int i = threadIdx.x; i < FH_BN * CH; i += blockDim.x) {
            int r = (i / (8 * CH)) * 8 + (i & 7), c = ((i >> 3) % CH) * 8, tok = k0 + r;
            bool ok = tok <= qlast;
            long long off = (long long)(ok ? tok : k0) * kw + kh * D + c;
            cp_async16(ks + i * 8, k + off, ok);
            cp_async16(ks + KV + i * 8, v + off, ok);
        }
    };
    load_tile(0);
    cp_async_commit();

    int warp_first = q0 + warp * 16;
    SoftmaxRows r = softmax_rows(warp_first, g, tokens, seq_start);
    int warp_last = min(warp_first + 15, qlast);
    // Keys before this start belong to an earlier sequence of some row of this warp.
    int warp_start = warp_first <= qlast ? (int)seq_start[warp_last] : 0x7fffffff;
    int wg_last = min(q0 + wg * 64 + 63, qlast);
    u32 q_addr = smem_addr(qs) + wg * 64 * D * 2;

    float o[DT][4];
    zero_tiles(o);

    for (int n = 0; n < n_tiles; ++n) {
        next_tile(n, n_tiles, load_tile);
        fence_proxy_async();
        __syncthreads();
        int k0 = kstart + n * FH_BN;
        u32 k_addr = smem_addr(kvs + (n & 1) * 2 * KV), v_addr = k_addr + KV * 2;
        if (k0 <= wg_last) {  // causal: later tiles hold no key visible to this warpgroup
            float s[NT][4];
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < D / 16; ++kk)
                wgmma_qk(s, wgmma_desc(q_addr + kk * 256, 128, ROW8),
                         wgmma_desc(k_addr + kk * 256, 128, ROW8), kk > 0);
            wgmma_commit_wait();
            hold(s);

            // Only tiles that reach past a row's own position or before its sequence's start
            // need the mask.
            float alpha[2];
            softmax_tile(s, r, k0 + FH_BN - 1 > warp_first || k0 < warp_start, k0, t, scale_log2,
                         alpha);
            scale_rows(o, alpha);

            // O += P V, P rounded to bf16 as the A operand straight from the S registers.
            u32 p[FH_BN / 16][4];
#pragma unroll
            for (int ks = 0; ks < FH_BN / 16; ++ks) p_operand(s, ks, p[ks]);
            wgmma_fence();
#pragma unroll
            for (int ks = 0; ks < FH_BN / 16; ++ks)
                wgmma_pv(o, p[ks], wgmma_desc(v_addr + ks * 2 * ROW8, ROW8, 128));
            wgmma_commit_wait();
            hold(o);
        }
        __syncthreads();  // every warp is done with this stage before it is refilled
    }

    store_rows(out + h * D, o, r, tokens, qw, t);
}

// Two blocks per SM (127 registers, 96 KB of shared memory each): measured 0.578 ms against
// 0.734 ms with one (8B layer's attention, H200), whose two warpgroups alone leave the tensor
// cores idle while they wait on their wgmma groups and run the softmax.
FLASH_ENTRIES(flash_attention_sm90, flash_attention_sm90, __launch_bounds__(FH_WARPS * 32, 2))
