// nvrtc: sm_90a
// The lm_head with its log-sum-exp in the GEMM's epilogue (sm_90a): for every scored row r
// and slice of 256 vocabulary columns, the slice's largest logit m and sum of exp(logit - m)
// (f32) as partials[r * slices + slice], and the target's logit where the slice holds it, from
// bf16 hidden rows and a bf16 head with f32 accumulation. The [rows, vocab] f32 logits are
// never written nor read back: through cuBLAS and `lse_tile` (nll.cu) they were, 124 GB a batch
// of 204,800 rows of Qwen3's vocabulary. `nll_from_slices` (nll.cu) folds the partials.
//
// Work: tiles of 128 rows x 256 columns, in groups of LH_GROUP row tiles that go through every
// slice together (the column of tiles of one slice first), so that the blocks at work at once
// share a few row tiles and a few weight slices in L2 (row tiles first would stream the whole
// head from DRAM for every one; slices first, every row). Persistent blocks of 3 warpgroups:
// warpgroup 0's first thread loads each stage's 128 rows x 64 k-columns and 256 head rows by
// TMA (rows past the last, of either, read as zeros), warpgroups 1 and 2 multiply rows 0-63 and
// 64-127 with wgmma m64n256k16, as expert_down.cu does, and reduce their accumulators in
// registers (the 4 threads of a row by shuffles).

#define LH_BM 128                      // rows a tile
#define LH_BN 256                      // vocabulary columns a tile (a slice)
#define LH_BK 64                       // k-columns a stage
#define LH_STAGES 4                    // 4 x 48 KB
#define LH_TILE_A (LH_BM * LH_BK * 2)  // 16 KB
#define LH_TILE_B (LH_BN * LH_BK * 2)  // 32 KB
#define LH_NT (LH_BN / 8)              // 8-column accumulator tiles a thread
#define LH_GROUP 16                    // row tiles that go through the slices together
#define LH_LOAD_REGS 40
#define LH_MMA_REGS 232

// Tile L's row tile and slice (`row_tiles` x `slices` tiles, grouped as above).
__device__ __forceinline__ void lh_tile(int L, int row_tiles, int slices, int& rt, int& slice) {
    int per_group = LH_GROUP * slices, g = L / per_group, i = L % per_group;
    int in_group = min(LH_GROUP, row_tiles - g * LH_GROUP);
    slice = i / in_group;
    rt = g * LH_GROUP + i % in_group;
}

// Over the 4 threads that hold one row of the accumulators (adjacent lanes).
__device__ __forceinline__ float quad_max(float v) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
    return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}

__device__ __forceinline__ float quad_sum(float v) {
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

// The epilogue of one of a thread's two rows of a tile (`H`: accumulator values 2H and 2H + 1
// of each 8-column tile): the slice's max and sum of exponentials over the row's 4 threads,
// and the target's logit where this thread holds its column.
template <int H>
__device__ __forceinline__ void lh_row(float (&d)[LH_NT][4], int row, int col0, int lane, int rows,
                                       int vocab, int slices, int slice, float softcap,
                                       const int* targets, float2* partials,
                                       float* target_logits) {
    int col_in_8 = 2 * (lane % 4);
    float m = -__int_as_float(0x7f800000);
#pragma unroll
    for (int j = 0; j < LH_NT; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            float v = d[j][2 * H + e];
            if (softcap != 0.0f) v = tanhf(v / softcap) * softcap;
            // Columns past the vocabulary (the head's zero rows) take no part.
            if (col0 + 8 * j + col_in_8 + e >= vocab) v = -__int_as_float(0x7f800000);
            d[j][2 * H + e] = v;
            m = fmaxf(m, v);
        }
    m = quad_max(m);
    float s = 0.0f;
#pragma unroll
    for (int j = 0; j < LH_NT; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) s += expf(d[j][2 * H + e] - m);
    s = quad_sum(s);
    // The target's logit, selected in registers by `selp` (as C selects, the compiler turned
    // them into an indexed load of the accumulators, all of them then in local memory).
    int c = row < rows ? targets[row] - col0 : -1;
    float v = 0.0f;
#pragma unroll
    for (int j = 0; j < LH_NT; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e)
            asm("{\n.reg .pred p;\nsetp.ne.b32 p, %2, 0;\nselp.f32 %0, %1, %0, p;\n}\n"
                : "+f"(v)
                : "f"(d[j][2 * H + e]), "r"((int)(c == 8 * j + col_in_8 + e)));
    if (row < rows && lane % 4 == 0) partials[(long long)row * slices + slice] = make_float2(m, s);
    if (c >= 0 && c < LH_BN && (c % 8) / 2 == lane % 4) target_logits[row] = v;
}

// softcap: Gemma 2's cap * tanh(logit / cap), as softcap.cu; 0 for none.
extern "C" __global__ void __launch_bounds__(384, 1)
lm_head_lse(float2* partials, float* target_logits, const int* targets, int rows, int hidden,
            int vocab, float softcap, const __grid_constant__ TensorMap head,
            const __grid_constant__ TensorMap x) {
    extern __shared__ unsigned char lh_smem[];
    // The swizzle pattern repeats every 1024 bytes: stages start aligned.
    u32 base = (smem_addr(lh_smem) + 1023) & ~1023u;
    u32 full = base + LH_STAGES * (LH_TILE_A + LH_TILE_B), empty = full + 8 * LH_STAGES;
    int tid = threadIdx.x, t = tid % 128;
    int wg = __shfl_sync(0xffffffffu, tid / 128, 0);
    int ktiles = hidden / LH_BK, row_tiles = (rows + LH_BM - 1) / LH_BM;
    int slices = (vocab + LH_BN - 1) / LH_BN, total = row_tiles * slices;
    init_stage_barriers(full, empty, LH_STAGES, 1, 256);
    if (wg == 0) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(LH_LOAD_REGS));
        if (t != 0) return;
        int it = 0;
        for (int L = blockIdx.x; L < total; L += gridDim.x) {
            int rt, slice;
            lh_tile(L, row_tiles, slices, rt, slice);
            for (int kt = 0; kt < ktiles; ++kt, ++it)
                tma_load_stage<LH_STAGES, LH_TILE_A, LH_TILE_B>(
                    base, full, empty, it, x, kt * LH_BK, rt * LH_BM, head, kt * LH_BK,
                    slice * LH_BN);
        }
        return;
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(LH_MMA_REGS));
    int half = wg - 1, it = 0, lane = t % 32;
    // This thread's first row of a tile (the other is 8 below).
    int row_in_tile = half * 64 + (t / 32) * 16 + lane / 4;
    for (int L = blockIdx.x; L < total; L += gridDim.x) {
        int rt, slice;
        lh_tile(L, row_tiles, slices, rt, slice);
        float d[LH_NT][4];
        multiply_tile<LH_STAGES, LH_TILE_A, LH_TILE_B, false>(d, base, full, empty, half, ktiles,
                                                              it, [](int) {});
        int col0 = slice * LH_BN, row = rt * LH_BM + row_in_tile;
        lh_row<0>(d, row, col0, lane, rows, vocab, slices, slice, softcap, targets, partials,
                  target_logits);
        lh_row<1>(d, row + 8, col0, lane, rows, vocab, slices, slice, softcap, targets, partials,
                  target_logits);
    }
}
