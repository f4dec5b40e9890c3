// nvrtc: sm_90a
// f32-grade y = x · w^T on f16 tensor cores (sm_90a): `--dtype split-bf16`'s GEMMs. x arrives
// as two f16 planes (split_rows_f16.cu: hi + lo, each row scaled by a power of two, `undo`
// scaling it back), each product summing hi·w + lo·w. A weight whose values are bf16 is one f16
// plane times a power of two (exact: dequant.cu writes it so, weight_f16.cu for a dense weight;
// `w_undo` its inverse); any other (f32
// values) is split like x, into two planes with a power of two per row (`w_rows` scales them
// back, per output column), and takes two launches, the second, on the residual plane,
// adding to y (`accumulate`): hi·w_hi + lo·w_hi, then hi·w_lo + lo·w_lo.
//
// Why not cuBLAS: the tensor cores' f32 accumulation truncates, and over 4,096 inner values
// that alone moved the 8B's per-token NLLs by 3e-4; slicing the
// inner dimension across GEMMs costs an f32 round trip of y per slice. Here each stage (64
// inner values of both planes) is summed by the tensor cores alone and then added, rounded to
// nearest, to the tile's f32 sum in registers (DeepSeek-V3's "promotion" for its FP8 GEMMs).
// On the 8B, against f32, per-token NLLs moved by at most 3.2e-4 promoting every 1,024 values,
// 1.41e-4 every 256 and 1.13e-4 every 64 (docs/decisions.md: f32-grade GEMMs promote every
// stage).
//
// Work: output tiles of 128 x 128, taken by persistent blocks in groups of SG_GROUP row tiles
// (a group's weight columns are read from DRAM once, from L2 by its other row tiles). Warpgroup
// 0's first thread loads each stage by TMA (128 rows x 64 inner values of hi and of lo, and
// 128 weight rows), warpgroups 1 and 2 multiply rows 0-63 and 64-127 with wgmma m64n128k16.
// Rows, columns and inner values past the ends arrive as zeros (TMA) and are not stored.
//
// ptxas serializes the wgmmas if the k loop is unrolled by the compiler or accumulators are
// read while a group is in flight across a loop's back edge (multiply_run, expert_gate_up.cu).

#define SG_BM 128                   // rows a tile
#define SG_BN 128                   // columns a tile
#define SG_BK 64                    // inner values a stage
#define SG_STAGES 4                 // 4 x 48 KB
#define SG_RUN 8                    // stages between two drains of a warpgroup's wgmmas (even)
#define SG_TILE (SG_BM * SG_BK * 2)  // 16 KB: a plane's box, or the weight's
#define SG_STAGE (3 * SG_TILE)
#define SG_NT (SG_BN / 8)           // 8-column accumulator tiles a thread
#define SG_GROUP 8
#define SG_LOAD_REGS 40
#define SG_MMA_REGS 232

// d (+)= A · B^T for one 16-deep slice k of a stage: A 64 rows at `a`, B 128 rows at `b`, both
// in the 128-byte swizzled layout; `fresh`: d is overwritten.
__device__ __forceinline__ void wgmma_m64n128_f16(float (&d)[SG_NT][4], u32 a, u32 b, int k,
                                                  bool fresh) {
    unsigned long long da = wgmma_desc(a + k * 32, 16, 1024), db = wgmma_desc(b + k * 32, 16, 1024);
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 " WG_REGS64
        ", %64, %65, p, 1, 1, 0, 0;\n}\n"
        : WG_TILES8(d, 0), WG_TILES8(d, 8)
        : "l"(da), "l"(db), "r"((int)!fresh));
}

// One stage's products into `d` (overwritten): hi·w then lo·w for each 16-deep slice, one
// wgmma group, left running.
__device__ __forceinline__ void multiply_stage(float (&d)[SG_NT][4], u32 base, u32 full, int half,
                                               int it) {
    int s = it % SG_STAGES;
    mbarrier_wait(full + 8 * s, (it / SG_STAGES) & 1);
    u32 a = base + s * SG_STAGE + half * (64 * 128);
    u32 b = base + s * SG_STAGE + 2 * SG_TILE;
    wgmma_fence();
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        wgmma_m64n128_f16(d, a, b, k, k == 0);
        wgmma_m64n128_f16(d, a + SG_TILE, b, k, false);
    }
    wgmma_commit();
}

// sum += d, rounded to nearest, once d's stage `it` is done (its slot then handed back).
__device__ __forceinline__ void promote(float (&sum)[SG_NT][4], float (&d)[SG_NT][4], u32 empty,
                                        int it) {
    hold(d);
    mbarrier_arrive(empty + 8 * (it % SG_STAGES));
#pragma unroll
    for (int j = 0; j < SG_NT; ++j)
#pragma unroll
        for (int i = 0; i < 4; ++i) sum[j][i] += d[j][i];
}

// RUN stages (even) from `it` on, each stage's products in a0 or a1 in turn: while one stage's
// run on the tensor cores, the other's finished accumulator is added to the sum. The warpgroup
// drains only at the end: ptxas serializes every wgmma if a group is left in flight across a
// loop's back edge and its accumulator read after it; on the 8B a drain every stage cost 13 %,
// every 4 stages 3.6 % against every 8 (docs/decisions.md: f32-grade GEMMs promote every stage).
template <int RUN>
__device__ __forceinline__ void multiply_run(float (&sum)[SG_NT][4], float (&a0)[SG_NT][4],
                                             float (&a1)[SG_NT][4], u32 base, u32 full,
                                             u32 empty, int half, int it) {
    multiply_stage(a0, base, full, half, it);
#pragma unroll
    for (int j = 1; j < RUN; ++j) {
        if (j % 2) {
            multiply_stage(a1, base, full, half, it + j);
            wgmma_wait<1>();
            promote(sum, a0, empty, it + j - 1);
        } else {
            multiply_stage(a0, base, full, half, it + j);
            wgmma_wait<1>();
            promote(sum, a1, empty, it + j - 1);
        }
    }
    wgmma_wait<0>();
    promote(sum, a1, empty, it + RUN - 1);
}

extern "C" __global__ void __launch_bounds__(384, 1)
split_gemm(float* y, const float* undo, const float* w_rows, float w_undo, int accumulate,
           int rows, int n_out, int n_in, long long ldy, const __grid_constant__ TensorMap hi,
           const __grid_constant__ TensorMap lo, const __grid_constant__ TensorMap w) {
    extern __shared__ unsigned char sg_smem[];
    // The swizzle pattern repeats every 1024 bytes: stages start aligned.
    u32 base = (smem_addr(sg_smem) + 1023) & ~1023u;
    u32 full = base + SG_STAGES * SG_STAGE, empty = full + 8 * SG_STAGES;
    int tid = threadIdx.x;
    int wg = __shfl_sync(0xffffffffu, tid / 128, 0);
    int mt = (rows + SG_BM - 1) / SG_BM, nt = (n_out + SG_BN - 1) / SG_BN;
    // An even number of stages (one past n_in, if needed, arrives as zeros).
    int stages = (n_in + 2 * SG_BK - 1) / (2 * SG_BK) * 2, total = mt * nt;
    // Tile L: row tiles in groups of SG_GROUP, a group's tiles down its rows first.
    auto tile_of = [&](int L, int& m, int& n) {
        int per = SG_GROUP * nt, m0 = L / per * SG_GROUP, in = L % per;
        int gm = min(SG_GROUP, mt - m0);
        m = m0 + in % gm;
        n = in / gm;
    };
    init_stage_barriers(full, empty, SG_STAGES, 1, 256);
    if (wg == 0) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(SG_LOAD_REGS));
        if (tid != 0) return;
        int it = 0;
        for (int L = blockIdx.x; L < total; L += gridDim.x) {
            int m, n;
            tile_of(L, m, n);
            for (int kt = 0; kt < stages; ++kt, ++it) {
                u32 a = base + (it % SG_STAGES) * SG_STAGE;
                u32 bar = tma_stage_begin<SG_STAGES>(full, empty, it, SG_STAGE);
                tma_box(a, hi, bar, kt * SG_BK, m * SG_BM);
                tma_box(a + SG_TILE, lo, bar, kt * SG_BK, m * SG_BM);
                tma_box(a + 2 * SG_TILE, w, bar, kt * SG_BK, n * SG_BN);
            }
        }
        return;
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(SG_MMA_REGS));
    int half = wg - 1, it = 0, t = tid % 128;
    for (int L = blockIdx.x; L < total; L += gridDim.x) {
        int m, n;
        tile_of(L, m, n);
        float a0[SG_NT][4], a1[SG_NT][4], sum[SG_NT][4];
        zero_tiles(sum);
#pragma unroll 1
        for (int r = 0; r < stages / SG_RUN; ++r, it += SG_RUN)
            multiply_run<SG_RUN>(sum, a0, a1, base, full, empty, half, it);
#pragma unroll 1
        for (int r = 0; r < stages % SG_RUN / 2; ++r, it += 2)
            multiply_run<2>(sum, a0, a1, base, full, empty, half, it);
        // Pair h of accumulator tile j: row 16 warp + lane / 4 + 8 h, columns 8 j + 2 (lane % 4)
        // and + 1.
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            int r = m * SG_BM + half * 64 + (t / 32) * 16 + (t % 32) / 4 + 8 * h;
            if (r >= rows) continue;
            float u = undo[r];
            float* out = y + (long long)r * ldy;
#pragma unroll
            for (int j = 0; j < SG_NT; ++j) {
                int c = n * SG_BN + 8 * j + 2 * (t % 4);
                if (c >= n_out) continue;
                bool pair = c + 1 < n_out;
                // Both scales are powers of two: the products are exact.
                float w0 = w_rows ? w_rows[c] : w_undo, w1 = w_rows && pair ? w_rows[c + 1] : w_undo;
                float2 v = make_float2(sum[j][2 * h] * u * w0, sum[j][2 * h + 1] * u * w1);
                if (pair && ldy % 2 == 0) {
                    float2* at = (float2*)(out + c);  // c is even: 8-byte aligned
                    if (accumulate) {
                        float2 was = *at;
                        v.x += was.x;
                        v.y += was.y;
                    }
                    *at = v;
                } else {
                    out[c] = accumulate ? out[c] + v.x : v.x;
                    if (pair) out[c + 1] = accumulate ? out[c + 1] + v.y : v.y;
                }
            }
        }
    }
}
