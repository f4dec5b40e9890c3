// Prepended after common.cuh to the sources that target exactly Hopper (sm_90a: wgmma, TMA,
// mbarriers) by src/backend/cuda/nvrtc.rs.

// A wgmma matrix descriptor for a tile in the 128-byte swizzled layout (mode 1 in bits 62-63);
// boxes are 1024-byte aligned, so the base offset field stays 0.
__device__ __forceinline__ unsigned long long wgmma_desc(u32 addr, u32 lbo, u32 sbo) {
    return (unsigned long long)((addr & 0x3ffff) >> 4) | ((unsigned long long)(lbo >> 4) << 16) |
           ((unsigned long long)(sbo >> 4) << 32) | (1ull << 62);
}

// A 2-D TMA tensor map (CUtensorMap), built on the host, passed by value as a
// __grid_constant__ parameter so that its address is one the copy engine can read.
struct __align__(64) TensorMap {
    unsigned long long opaque[16];
};

// A barrier whose phase completes after `count` arrivals (and the bytes announced to it).
__device__ __forceinline__ void mbarrier_init(u32 bar, u32 count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}

// The one arrival a barrier waits for, announcing the bytes the copies will deliver to it.
__device__ __forceinline__ void mbarrier_expect(u32 bar, u32 bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar),
                 "r"(bytes)
                 : "memory");
}

// One arrival of this thread.
__device__ __forceinline__ void mbarrier_arrive(u32 bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}

// Waits until the barrier's phase of the given parity has completed.
__device__ __forceinline__ void mbarrier_wait(u32 bar, u32 parity) {
    asm volatile(
        "{\n.reg .pred p;\nWAIT:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
        "@!p bra WAIT;\n}\n" ::"r"(bar),
        "r"(parity)
        : "memory");
}

// The box of `map` at column x, row y into shared memory at dst, completing on bar.
__device__ __forceinline__ void tma_box(u32 dst, const TensorMap& map, u32 bar, int x, int y) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
        " [%0], [%1, {%2, %3}], [%4];\n" ::"r"(dst),
        "l"((unsigned long long)&map), "r"(x), "r"(y), "r"(bar)
        : "memory");
}

// Each of `stages` pipeline stages' full barrier (completing on `full_count` arrivals and the
// bytes announced to it) and empty barrier (`empty_count` arrivals), 8 bytes each from `full`
// and `empty`, initialised by thread 0 before any thread of the block goes on.
__device__ __forceinline__ void init_stage_barriers(u32 full, u32 empty, int stages, u32 full_count,
                                                    u32 empty_count) {
    if (threadIdx.x == 0) {
        for (int s = 0; s < stages; ++s) {
            mbarrier_init(full + 8 * s, full_count);
            mbarrier_init(empty + 8 * s, empty_count);
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();
}

// Orders the 128 threads of one warpgroup (named barrier `id`, 1-15: 0 is __syncthreads).
__device__ __forceinline__ void warpgroup_sync(int id) {
    asm volatile("bar.sync %0, 128;\n" ::"r"(id) : "memory");
}

// A routed row tile of the experts' kernels: rows [row0, row0 + 128) of the grouped layout,
// those >= end not written (the next group's); `wrow` the expert's first weight row in the
// weights' tensor map.
struct ExpertTile {
    int row0, end, wrow, pad;
};

// Where a warpgroup's output value pair (row r < 64, columns col and col + 1, col even) lies in
// its staging buffer for TMA stores: boxes of 64 rows x 64 bf16 columns, 8 KB each, in the
// 128-byte swizzled layout (16-byte chunk c of row r at chunk c ^ (r % 8)), which also keeps a
// warp's stores of 8 rows on 32 distinct banks.
__device__ __forceinline__ u32 staged_pair(u32 stage, int r, int col) {
    return stage + (col / 64) * 8192 + r * 128 + ((((col % 64) / 8) ^ (r % 8)) * 16) + (col % 8) * 2;
}

// Stores the staged box at `src` to `map` at column x, row y, in this thread's bulk group.
__device__ __forceinline__ void tma_store_box(const TensorMap& map, u32 src, int x, int y) {
    asm volatile(
        "cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%1, %2}], [%3];\n" ::"l"(
            (unsigned long long)&map),
        "r"(x), "r"(y), "r"(src)
        : "memory");
}

// Where a warpgroup's output rows r0 .. r0 + 63 of 8 NT columns from col0 go (those from `end`
// on not written): to `out` (rows of `ld` bf16, also `map`'s tensor with boxes of 64 x 64), given
// as the bf16 pairs wgmma's accumulator layout leaves in each thread: pair h of accumulator tile
// j at row 16 warp + lane / 4 + 8 h, columns 8 j + 2 (lane % 4) and + 1. When all 64 rows are
// wanted they go through shared memory (`stage`: 8 NT x 128 bytes, 1024-aligned) and a TMA
// store the warpgroup does not wait for (before the buffer is written again, the previous store
// must have read it); a group's last, partial rows straight, predicated. With K short the
// epilogue is what sets the pace: stored straight, 8 rows x 16 bytes a warp store, the down
// products ran at 426 TFLOP/s on an H100, through TMA at 721 (docs/decisions.md: The experts'
// gate/up and down in Hopper kernels).
// `barrier`: a named barrier of this warpgroup's own; the warpgroup's thread 0 ends with
// `tma_stores_done`. Written in parts (`rows_out_begin`, `rows_out_pairs`, `rows_out_end`)
// where a kernel spreads them over the next tile's stages, else by `store_warpgroup_rows`.
struct RowsOut {
    u32 stage;
    const TensorMap* map;
    bf16_t* out;
    int ld, r0, end, col0, barrier;
    __device__ __forceinline__ bool staged() const { return r0 + 64 <= end; }
};

// Before the first pairs: the staging buffer free of the previous TMA store.
__device__ __forceinline__ void rows_out_begin(const RowsOut& o) {
    if (!o.staged()) return;
    if (threadIdx.x % 128 == 0) asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
    warpgroup_sync(o.barrier);
}

// The pairs v[i][h] of accumulator tiles j0 + i (j0 known at compile time where inlined).
template <int NJ>
__device__ __forceinline__ void rows_out_pairs(const u32 (&v)[NJ][2], const RowsOut& o, int j0) {
    int t = threadIdx.x % 128, rl = (t / 32) * 16 + (t % 32) / 4, c = 2 * (t % 4);
    if (o.staged()) {
#pragma unroll
        for (int i = 0; i < NJ; ++i)
#pragma unroll
            for (int h = 0; h < 2; ++h)
                asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(staged_pair(o.stage, rl + 8 * h, 8 * (j0 + i) + c)),
                             "r"(v[i][h])
                             : "memory");
        return;
    }
#pragma unroll
    for (int i = 0; i < NJ; ++i)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            int r = o.r0 + rl + 8 * h;
            asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %2, 0;\n@p st.global.b32 [%0], %1;\n}\n" ::"l"(
                             o.out + (size_t)r * o.ld + o.col0 + 8 * (j0 + i) + c),
                         "r"(v[i][h]), "r"((int)(r < o.end))
                         : "memory");
        }
}

// After the last pairs: the staged rows of NT accumulator tiles handed to a TMA store.
template <int NT>
__device__ __forceinline__ void rows_out_end(const RowsOut& o) {
    if (!o.staged()) return;
    // The copy engine reads through the async proxy.
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    warpgroup_sync(o.barrier);
    if (threadIdx.x % 128 == 0) {
#pragma unroll
        for (int b = 0; b < NT / 8; ++b) tma_store_box(*o.map, o.stage + b * 8192, o.col0 + 64 * b, o.r0);
        asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
    }
}

// All of a tile's output rows at once.
template <int NT>
__device__ __forceinline__ void store_warpgroup_rows(const u32 (&v)[NT][2], const RowsOut& o) {
    rows_out_begin(o);
    rows_out_pairs(v, o, 0);
    rows_out_end<NT>(o);
}

// The staged outputs must stay until the copy engine has read them (the issuing thread).
__device__ __forceinline__ void tma_stores_done() {
    asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
}

// Register accesses before this are ordered before the warpgroup's next wgmma.
__device__ __forceinline__ void wgmma_fence() {
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}

// Closes the wgmmas issued since the last commit into a group.
__device__ __forceinline__ void wgmma_commit() {
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}

// Waits until at most N committed groups are still running (groups finish in order).
template <int N>
__device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

// Commits the issued wgmmas and waits until they are done.
__device__ __forceinline__ void wgmma_commit_wait() {
    wgmma_commit();
    wgmma_wait<0>();
}

// The accumulator operands of a wgmma asm statement: tile j of d (4 registers), 8 tiles from
// tile j, and the placeholders that name the first 32, 64 or 128 operands.
#define WG_TILE(d, j) "+f"(d[j][0]), "+f"(d[j][1]), "+f"(d[j][2]), "+f"(d[j][3])
#define WG_TILES8(d, j)                                                                     \
    WG_TILE(d, j), WG_TILE(d, j + 1), WG_TILE(d, j + 2), WG_TILE(d, j + 3), WG_TILE(d, j + 4), \
        WG_TILE(d, j + 5), WG_TILE(d, j + 6), WG_TILE(d, j + 7)
#define WG_REGS32 \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, " \
    "%14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, " \
    "%26, %27, %28, %29, %30, %31}"
#define WG_REGS64 \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, " \
    "%14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, " \
    "%26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, " \
    "%38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, " \
    "%50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, " \
    "%62, %63}"

#define WG_REGS128 \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, " \
    "%14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, " \
    "%28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, " \
    "%42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, " \
    "%56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, " \
    "%70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, " \
    "%84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, " \
    "%98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, " \
    "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, " \
    "%126, %127}"

// The compiler sees an accumulator as written by the wgmma asm statement, though the hardware
// writes it only by the wait: this keeps its uses from moving above the wait.
template <int N>
__device__ __forceinline__ void hold(float (&r)[N][4]) {
#pragma unroll
    for (int j = 0; j < N; ++j)
        asm volatile("" : WG_TILE(r, j)::"memory");
}

// An A operand in registers is read by its wgmma until the wait: this keeps its registers
// from being reused before then.
template <int N>
__device__ __forceinline__ void hold(u32 (&r)[N][4]) {
#pragma unroll
    for (int j = 0; j < N; ++j)
        asm volatile("" : "+r"(r[j][0]), "+r"(r[j][1]), "+r"(r[j][2]), "+r"(r[j][3])::"memory");
}

// The loader's stage `it` of a ring of STAGES stages: once the multiplying warpgroups have
// released it (from its second use on), `bytes` announced to its full barrier, which is
// returned for the copies that will deliver them.
template <int STAGES>
__device__ __forceinline__ u32 tma_stage_begin(u32 full, u32 empty, int it, u32 bytes) {
    int s = it % STAGES;
    u32 bar = full + 8 * s;
    if (it >= STAGES) mbarrier_wait(empty + 8 * s, ((it / STAGES) - 1) & 1);
    mbarrier_expect(bar, bytes);
    return bar;
}

// The loader's stage `it` of a ring of STAGES stages of A (A_BYTES) then B (B_BYTES) from
// `base` (the experts' and the lm_head's kernels): once the multiplying warpgroups have released
// it (from its second use on), its bytes announced to its full barrier and A's box at (ax, ay)
// of `amap` and B's at (bx, by) of `bmap` brought by TMA.
template <int STAGES, int A_BYTES, int B_BYTES>
__device__ __forceinline__ void tma_load_stage(u32 base, u32 full, u32 empty, int it,
                                               const TensorMap& amap, int ax, int ay,
                                               const TensorMap& bmap, int bx, int by) {
    u32 a = base + (it % STAGES) * (A_BYTES + B_BYTES);
    u32 bar = tma_stage_begin<STAGES>(full, empty, it, A_BYTES + B_BYTES);
    tma_box(a, amap, bar, ax, ay);
    tma_box(a + A_BYTES, bmap, bar, bx, by);
}

// d (+)= A · B^T over one stage of 64 k-columns (the experts' kernels): A the warpgroup's 64
// rows at `a`, B 256 rows at `b`, both in the 128-byte swizzled layout (rows of 64 bf16, 8-row
// groups 1024 bytes apart), with wgmma m64n256k16; `first`: the stage starts the sum. The
// stage's products are committed and left in flight; the previous stage's are waited for
// (its buffers are then free). ptxas serializes the wgmmas if the caller's k loop is unrolled.
__device__ __forceinline__ void wgmma_stage_m64n256(float (&d)[32][4], u32 a, u32 b, bool first) {
    wgmma_fence();
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        unsigned long long da = wgmma_desc(a + k * 32, 16, 1024), db = wgmma_desc(b + k * 32, 16, 1024);
        asm volatile(
            "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 " WG_REGS128
            ", %128, %129, p, 1, 1, 0, 0;\n}\n"
            : WG_TILES8(d, 0), WG_TILES8(d, 8), WG_TILES8(d, 16), WG_TILES8(d, 24)
            : "l"(da), "l"(db), "r"((int)(!first || k > 0)));
    }
    wgmma_commit();
    wgmma_wait<1>();
}

// A multiplying warpgroup's tile: d = A · B^T over `ktiles` stages of the ring that
// `tma_load_stage` fills, from stage `it` on (`it` advanced past them), this warpgroup's 64 of
// A's 128 rows (`half`), each stage released to the loader once its products are done; with
// FENCE, A's rows were written by ordinary stores (the generic proxy) and are fenced for wgmma,
// which reads through the async proxy. `between(kt)` runs while stage kt's products are in
// flight (the previous tile's epilogue, in parts). d is readable on return.
template <int STAGES, int A_BYTES, int B_BYTES, bool FENCE, typename Between>
__device__ __forceinline__ void multiply_tile(float (&d)[32][4], u32 base, u32 full, u32 empty,
                                              int half, int ktiles, int& it, Between between) {
#pragma unroll 1
    for (int kt = 0; kt < ktiles; ++kt, ++it) {
        int s = it % STAGES;
        mbarrier_wait(full + 8 * s, (it / STAGES) & 1);
        if (FENCE) asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        u32 a = base + s * (A_BYTES + B_BYTES) + half * (64 * 128);
        u32 b = base + s * (A_BYTES + B_BYTES) + A_BYTES;
        wgmma_stage_m64n256(d, a, b, kt == 0);
        if (kt > 0) mbarrier_arrive(empty + 8 * ((it - 1) % STAGES));
        between(kt);
    }
    wgmma_wait<0>();
    hold(d);
    mbarrier_arrive(empty + 8 * ((it - 1) % STAGES));
}
