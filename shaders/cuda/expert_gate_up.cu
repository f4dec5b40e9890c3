// nvrtc: sm_90a
// A mixture's experts' gate and up products and their SiLU-gated activation in one kernel
// (sm_90a): act[r] = silu(gate_e(x[rows[r]])) * up_e(x[rows[r]]) for every routed row r of
// expert e, bf16 in and out, f32 accumulation, gate and up rounded to bf16 before the
// activation as the separate GEMM + gated_act passes round them. It replaces the row copy
// into expert order, the grouped GEMM and the activation pass (docs/decisions.md: The experts'
// gate/up and down in Hopper kernels).
//
// Work: output tiles of 128 routed rows (one expert's) x 128 activation columns (`ExpertTile`:
// its `wrow` the expert's first gate row, its up rows `inter` rows later), the column
// slices of a row tile adjacent in the tile order so that its gathered rows are read from DRAM
// once and from L2 by the others. Persistent blocks of 3 warpgroups take tiles L = blockIdx.x,
// + gridDim.x, ...; warpgroup 0 loads, 1 and 2 multiply rows 0-63 and 64-127 of a tile with
// wgmma m64n256k16 (n = 128 gate columns, then the same 128 up columns, so gate and up of an
// output sit in the same thread's accumulators). Stages of 64 k-columns: the rows of x by
// cp.async (gathered by index, 8 threads a 128-byte row, written in the 128-byte swizzled
// layout wgmma reads), the expert's gate and up weight rows by TMA (two boxes of 64 x 128 of
// the dequantized weights' tensor map). A stage's full barrier completes with the 128 loader
// threads' copies and the TMA's bytes; its empty barrier with the 256 multiplying threads.
//
// ptxas serializes the wgmmas (C7514/C7511/C7520) if the k loop is unrolled (two register
// sets of the accumulators with moves between them), if the warpgroup index is not provably
// warp-uniform, or if accumulators are read while a wgmma group is in flight: hence `unroll 1`
// and the shuffled warpgroup index. The outputs go out as expert_down.cu's do, through shared
// memory and TMA stores (`RowsOut`): at gate/up's K (2048) the straight stores were already
// hidden, and the change measured within noise on an H100 (the same decision).
//
// A tile's epilogue (the SiLU's expf and division, 64 outputs a thread) runs while the tensor
// cores multiply the next tile: its gate and up are kept as bf16 pairs (64 registers beside the
// 128 accumulators) and activated and stored in EG_PARTS parts, one after each of the next
// tile's first stages is issued. Done after the tile, it left the tensor cores idle: the kernel
// took 7 % longer on an H100 (the same decision). Parts chosen at run time through a
// switch made ptxas spill the pairs; the `if constexpr` chain does not.

#define EG_BM 128                  // routed rows a tile
#define EG_HALF 128                // activation columns a tile (gate and up: 256 GEMM columns)
#define EG_BK 64                   // k-columns a stage
#define EG_STAGES 4
#define EG_TILE_A (EG_BM * EG_BK * 2)            // 16 KB
#define EG_TILE_B (2 * EG_HALF * EG_BK * 2)      // 32 KB
#define EG_OUT (64 * EG_HALF * 2)                // a warpgroup's staged outputs: 2 boxes of 64 x 64
#define EG_NT (2 * EG_HALF / 8)                  // 8-column accumulator tiles a thread
#define EG_LOAD_REGS 40                          // 128 * 40 + 256 * 232 <= 65,536
#define EG_MMA_REGS 232

// This thread's cp.asyncs so far arrive on bar when complete (counted in its init count).
__device__ __forceinline__ void cp_async_arrive(u32 bar) {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}

// Parts of a tile's epilogue, one after each of the next tile's first EG_PARTS stages (so K
// must be at least EG_PARTS * EG_BK), each the activation of EG_NT / 2 / EG_PARTS accumulator
// tiles.
#define EG_PARTS 8

// silu(gate) * up of accumulator tiles j0 and j0 + 1, from their bf16 gate and up (`gu`, gate
// low), to their places in `o`.
__device__ __forceinline__ void activation_pairs(const u32 (&gu)[EG_NT / 2][2][2], const RowsOut& o,
                                                 int j0) {
    u32 v[2][2];
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            float r[2];
#pragma unroll
            for (int q = 0; q < 2; ++q) {
                u32 p = gu[j0 + i][h][q];
                float g = __uint_as_float(p << 16), u = __uint_as_float(p & 0xffff0000u);
                r[q] = g / (1.0f + expf(-g)) * u;
            }
            v[i][h] = pack2_bf16(r[0], r[1]);
        }
    rows_out_pairs(v, o, j0);
}

// Part P of a finished tile's epilogue; the last hands the staged rows to a TMA store.
template <int P>
__device__ __forceinline__ void activation_part(const u32 (&gu)[EG_NT / 2][2][2], const RowsOut& o) {
    constexpr int per = EG_NT / 2 / EG_PARTS;
    if (P == 0) rows_out_begin(o);
#pragma unroll
    for (int j0 = P * per; j0 < (P + 1) * per; j0 += 2) activation_pairs(gu, o, j0);
    if (P == EG_PARTS - 1) rows_out_end<EG_NT / 2>(o);
}

// Parts P and after of a finished tile's epilogue.
template <int P>
__device__ __forceinline__ void activation_parts_from(const u32 (&gu)[EG_NT / 2][2][2], const RowsOut& o) {
    activation_part<P>(gu, o);
    if constexpr (P + 1 < EG_PARTS) activation_parts_from<P + 1>(gu, o);
}

// Part `part` (from P on) of a finished tile's epilogue, none where part >= EG_PARTS.
template <int P = 0>
__device__ __forceinline__ void activation_part_at(const u32 (&gu)[EG_NT / 2][2][2], const RowsOut& o,
                                                   int part) {
    if (part == P) {
        activation_part<P>(gu, o);
    } else if constexpr (P + 1 < EG_PARTS) {
        activation_part_at<P + 1>(gu, o, part);
    }
}

extern "C" __global__ void __launch_bounds__(384, 1)
expert_gate_up(bf16_t* act, const bf16_t* x, const u32* rows, const ExpertTile* tiles,
               int n_tiles, int hidden, int inter, const __grid_constant__ TensorMap weights,
               const __grid_constant__ TensorMap act_map) {
    extern __shared__ unsigned char eg_smem[];
    // The swizzle pattern repeats every 1024 bytes: stages and staged boxes start aligned.
    u32 base = (smem_addr(eg_smem) + 1023) & ~1023u;
    u32 outs = base + EG_STAGES * (EG_TILE_A + EG_TILE_B);
    u32 full = outs + 2 * EG_OUT, empty = full + 8 * EG_STAGES;
    int tid = threadIdx.x, t = tid % 128;
    int wg = __shfl_sync(0xffffffffu, tid / 128, 0);
    int ktiles = hidden / EG_BK, slices = inter / EG_HALF, total = n_tiles * slices;
    // A stage is full with its TMA bytes and the 128 loader threads' copies, empty once both
    // multiplying warpgroups are done with it.
    init_stage_barriers(full, empty, EG_STAGES, 128 + 1, 256);
    // The stage counter `it` runs on across tiles: the loader fills the next tile's stages
    // while the multiplying warpgroups finish this one's epilogue.
    if (wg == 0) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(EG_LOAD_REGS));
        // Thread t copies 16-byte chunk t % 8 of rows t / 8 + 16 i of each stage's A.
        int c = t % 8, it = 0;
        for (int L = blockIdx.x; L < total; L += gridDim.x) {
            ExpertTile tile = tiles[L / slices];
            int n0 = (L % slices) * EG_HALF;
            u32 src[8];  // token rows, not pointers: the loader keeps to few registers
#pragma unroll
            for (int i = 0; i < 8; ++i) src[i] = rows[min(tile.row0 + t / 8 + 16 * i, tile.end - 1)];
            const bf16_t* xc = x + c * 8;
            for (int kt = 0; kt < ktiles; ++kt, ++it) {
                int s = it % EG_STAGES;
                u32 bar = full + 8 * s;
                if (it >= EG_STAGES) mbarrier_wait(empty + 8 * s, ((it / EG_STAGES) - 1) & 1);
                u32 a = base + s * (EG_TILE_A + EG_TILE_B), b = a + EG_TILE_A;
                if (t == 0) {
                    mbarrier_expect(bar, EG_TILE_B);
                    tma_box(b, weights, bar, kt * EG_BK, tile.wrow + n0);
                    tma_box(b + EG_TILE_B / 2, weights, bar, kt * EG_BK, tile.wrow + inter + n0);
                }
#pragma unroll
                for (int i = 0; i < 8; ++i) {
                    int r = t / 8 + 16 * i;
                    u32 at = r * 128 + ((c ^ (r % 8)) * 16);
                    cp_async16(a + at, xc + (size_t)src[i] * hidden + kt * EG_BK);
                }
                cp_async_arrive(bar);
            }
        }
        return;
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(EG_MMA_REGS));
    int half = wg - 1, it = 0;
    // The last tile's gate and up values, rounded to bf16 and paired (gate low), and where
    // its outputs go: activated and written during the next tile's first stages.
    u32 gu[EG_NT / 2][2][2];
    RowsOut prev{outs + half * EG_OUT, &act_map, act, inter, 0, 0, 0, 1 + half};
    bool pending = false;
    for (int L = blockIdx.x; L < total; L += gridDim.x) {
        ExpertTile tile = tiles[L / slices];
        float d[EG_NT][4];
        // The rows were cp.async's writes (the generic proxy): fenced for wgmma.
        multiply_tile<EG_STAGES, EG_TILE_A, EG_TILE_B, true>(
            d, base, full, empty, half, ktiles, it, [&](int kt) {
                if (pending) activation_part_at(gu, prev, kt);
            });
        // Accumulator tile j < EG_NT / 2 holds the tile's gate columns 8j.., tile j + EG_NT / 2
        // the same up columns.
#pragma unroll
        for (int j = 0; j < EG_NT / 2; ++j)
#pragma unroll
            for (int h = 0; h < 2; ++h)
#pragma unroll
                for (int q = 0; q < 2; ++q) gu[j][h][q] = pack2_bf16(d[j][2 * h + q], d[j + EG_NT / 2][2 * h + q]);
        prev.r0 = tile.row0 + half * 64;
        prev.end = tile.end;
        prev.col0 = (L % slices) * EG_HALF;
        pending = true;
    }
    if (pending) activation_parts_from<0>(gu, prev);
    if (t == 0) tma_stores_done();
}
