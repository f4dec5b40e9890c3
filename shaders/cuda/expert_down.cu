// nvrtc: sm_90a
// A mixture's experts' down products in one kernel (sm_90a): y[r] = act[r] · down_e^T for
// every routed row r of expert e, the rows where the gate/up pass left them (grouped), bf16 in
// and out, f32 accumulation: one launch instead of a cuBLAS GEMM an expert.
//
// Work: output tiles of 128 routed rows (one expert's, `ExpertTile`: its `wrow` the expert's
// first down row) x 256 columns, the column slices of a row tile adjacent in the tile order
// (its rows read from DRAM once, from L2 by the others). Persistent blocks of 3 warpgroups
// take tiles L = blockIdx.x, + gridDim.x, ...; warpgroup 0's first thread loads each stage's
// 128 rows x 64 k-columns and the expert's 256 x 64 weights by TMA, warpgroups 1 and 2
// multiply rows 0-63 and 64-127 with wgmma m64n256k16.
//
// Each warpgroup's outputs go out through shared memory and a TMA store it does not wait for
// (`store_warpgroup_rows`): down's K is short (768 for Qwen3-30B-A3B, 12 stages a tile), and
// stored straight from the accumulators this kernel ran at 426 TFLOP/s on an H100, through
// TMA at 721-735, against 612-638 for cuBLAS's GEMM an expert (docs/decisions.md: The experts'
// gate/up and down in Hopper kernels).
//
// ptxas serializes the wgmmas if the k loop is unrolled, the warpgroup index is not provably
// warp-uniform or accumulators are read while a group is in flight (expert_gate_up.cu).

#define ED_BM 128                      // routed rows a tile
#define ED_BN 256                      // output columns a tile
#define ED_BK 64                       // k-columns a stage
#define ED_STAGES 3                    // 3 x 48 KB of stages and 2 x 32 KB of staged outputs
#define ED_TILE_A (ED_BM * ED_BK * 2)  // 16 KB
#define ED_TILE_B (ED_BN * ED_BK * 2)  // 32 KB
#define ED_NT (ED_BN / 8)              // 8-column accumulator tiles a thread
#define ED_OUT (64 * ED_BN * 2)        // a warpgroup's staged outputs: 4 boxes of 64 x 64
#define ED_LOAD_REGS 40                // 128 * 40 + 256 * 232 <= 65,536
#define ED_MMA_REGS 232

extern "C" __global__ void __launch_bounds__(384, 1)
expert_down(bf16_t* y, const ExpertTile* tiles, int n_tiles, int inter, int hidden,
            const __grid_constant__ TensorMap weights, const __grid_constant__ TensorMap act,
            const __grid_constant__ TensorMap ymap) {
    extern __shared__ unsigned char ed_smem[];
    // The swizzle pattern repeats every 1024 bytes: stages and staged boxes start aligned.
    u32 base = (smem_addr(ed_smem) + 1023) & ~1023u;
    u32 outs = base + ED_STAGES * (ED_TILE_A + ED_TILE_B);
    u32 full = outs + 2 * ED_OUT, empty = full + 8 * ED_STAGES;
    int tid = threadIdx.x, t = tid % 128;
    int wg = __shfl_sync(0xffffffffu, tid / 128, 0);
    int ktiles = inter / ED_BK, slices = hidden / ED_BN, total = n_tiles * slices;
    // A stage is full with its TMA bytes, empty once both multiplying warpgroups are done
    // with it.
    init_stage_barriers(full, empty, ED_STAGES, 1, 256);
    // The stage counter `it` runs on across tiles: the loader fills the next tile's stages
    // while the multiplying warpgroups finish this one's epilogue.
    if (wg == 0) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(ED_LOAD_REGS));
        if (t != 0) return;
        int it = 0;
        for (int L = blockIdx.x; L < total; L += gridDim.x) {
            ExpertTile tile = tiles[L / slices];
            int n0 = (L % slices) * ED_BN;
            for (int kt = 0; kt < ktiles; ++kt, ++it)
                tma_load_stage<ED_STAGES, ED_TILE_A, ED_TILE_B>(
                    base, full, empty, it, act, kt * ED_BK, tile.row0, weights, kt * ED_BK,
                    tile.wrow + n0);
        }
        return;
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(ED_MMA_REGS));
    int half = wg - 1, it = 0;
    u32 out = outs + half * ED_OUT;
    for (int L = blockIdx.x; L < total; L += gridDim.x) {
        ExpertTile tile = tiles[L / slices];
        int n0 = (L % slices) * ED_BN;
        float d[ED_NT][4];
        multiply_tile<ED_STAGES, ED_TILE_A, ED_TILE_B, false>(d, base, full, empty, half, ktiles,
                                                              it, [](int) {});
        u32 v[ED_NT][2];
#pragma unroll
        for (int j = 0; j < ED_NT; ++j)
#pragma unroll
            for (int h = 0; h < 2; ++h) v[j][h] = pack2_bf16(d[j][2 * h], d[j][2 * h + 1]);
        store_warpgroup_rows(v, RowsOut{out, &ymap, y, hidden, tile.row0 + half * 64, tile.end, n0, 1 + half});
    }
    if (t == 0) tma_stores_done();
}
