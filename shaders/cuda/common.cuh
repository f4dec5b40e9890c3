// Prepended to every kernel source by src/backend/cuda/nvrtc.rs. NVRTC compiles without the
// toolkit's headers, so bf16/f16 conversions are written out here (round to nearest even,
// the same results as the `half` crate the CPU reference uses).
typedef unsigned short bf16_t;
typedef unsigned int u32;
typedef unsigned char u8;

__device__ __forceinline__ float bf16_to_f32(bf16_t h) { return __uint_as_float(((u32)h) << 16); }

__device__ __forceinline__ bf16_t f32_to_bf16(float f) {
    u32 u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (bf16_t)((u >> 16) | 0x40u);  // quiet NaN
    u += 0x7fffu + ((u >> 16) & 1u);
    return (bf16_t)(u >> 16);
}

__device__ __forceinline__ float round_bf16(float f) { return bf16_to_f32(f32_to_bf16(f)); }

// Two values rounded to bf16 (nearest even) and packed, `lo` in the low half: one instruction
// on sm_80 and later, the same bits as f32_to_bf16 for every non-NaN input.
__device__ __forceinline__ u32 pack2_bf16(float lo, float hi) {
#if __CUDA_ARCH__ >= 800
    u32 r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
#else
    return (u32)f32_to_bf16(lo) | ((u32)f32_to_bf16(hi) << 16);
#endif
}

// v as hi = bf16(v), mid = bf16(v - hi) and lo = v - hi - mid, each a bf16 value: both
// differences are exact in f32, and lo holds what is left exactly (hi + mid + lo == v), so
// products of the parts with bf16 weights are exact in f32 (split_bf16.cu; rms_norm.cu's
// planes). The subtractions are never contracted with a product that made v into an FMA
// (which would split the unrounded product).
__device__ __forceinline__ void split3(float v, float& hi, float& mid, float& lo) {
    hi = round_bf16(v);
    float r = __fsub_rn(v, hi);
    mid = round_bf16(r);
    lo = __fsub_rn(r, mid);
}

// IEEE half precision, held as its bits.
__device__ __forceinline__ unsigned short f16_bits(float f) {
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}

__device__ __forceinline__ float f16_value(unsigned short h) {
    float r;
    asm("cvt.f32.f16 %0, %1;" : "=f"(r) : "h"(h));
    return r;
}

__device__ __forceinline__ float round_f16(float f) { return f16_value(f16_bits(f)); }

// Two f32 values as one f16 pair, `a` in the low half (the first in memory).
__device__ __forceinline__ u32 pack2_f16(float a, float b) {
    u32 d;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(b), "f"(a));
    return d;
}

// Eight f32 values as f16 in 16 bytes, the first in the lowest half.
__device__ __forceinline__ uint4 pack8_f16(const float* v) {
    return make_uint4(pack2_f16(v[0], v[1]), pack2_f16(v[2], v[3]), pack2_f16(v[4], v[5]),
                      pack2_f16(v[6], v[7]));
}

// Two f32 values as the two f16 planes of a split, packed as pack2_f16 packs: hi = f16(v) and
// lo = f16(v - hi) (v - hi is exact in f32).
__device__ __forceinline__ void split2_f16(float a, float b, u32& hi, u32& lo) {
    hi = pack2_f16(a, b);
    lo = pack2_f16(a - f16_value(hi & 0xffffu), b - f16_value(hi >> 16));
}

// The power of two 2^e that puts a largest magnitude `m` in [2^14, 2^15), for values split
// into two f16 planes (split_rows_f16.cu, split_columns_f16.cu; flash_attention.cu undoes it):
// e, or 0 where m is zero, infinite or NaN (such values keep their scale and propagate).
__device__ __forceinline__ int f16_plane_exponent(float m) {
    return (m > 0.0f && isfinite(m)) ? min(max(14 - ilogbf(m), -126), 127) : 0;
}

// act(g) * u (elementwise.cu, split_rows_f16.cu); act 0 is SiLU, 1 GELU with the tanh approximation (gelu_pytorch_tanh), 2
// gpt-oss's clamped SwiGLU (gate clamped above at `limit`, up to [-limit, limit],
// (up + 1) * gate * sigmoid(alpha * gate)), 3 sigmoid(gate) * up (an attention output gate),
// 4 gate * up (LFM2's short convolution's gates), 5 relu(gate)^2 (Nemotron-H's ungated MLP;
// up not read), 6 DeepSeek-V4's SiLU of the gate clamped above at `limit` times up clamped
// to [-limit, limit].
__device__ __forceinline__ float gated_times(float g, float u, int act, float alpha,
                                             float limit) {
    if (act == 0) return g / (1.0f + expf(-g)) * u;
    if (act == 3) return 1.0f / (1.0f + expf(-g)) * u;
    if (act == 4) return g * u;
    if (act == 5) {
        g = fmaxf(g, 0.0f);
        return g * g;
    }
    if (act == 2) {
        g = fminf(g, limit);
        u = fminf(fmaxf(u, -limit), limit);
        return (u + 1.0f) * (g * (1.0f / (1.0f + expf(-(g * alpha)))));
    }
    if (act == 6) {
        g = fminf(g, limit);
        return g / (1.0f + expf(-g)) * fminf(fmaxf(u, -limit), limit);
    }
    float z = 0.7978845608028654f * (g + 0.044715f * g * g * g);
    return 0.5f * g * (1.0f + tanhf(z)) * u;
}

// Typed loads and stores: every kernel that runs in both activation precisions (bf16, f32) is
// a template over its element types, instantiated by `extern "C"` entry points per type.
__device__ __forceinline__ float ld(const float* p, long long i) { return p[i]; }
__device__ __forceinline__ float ld(const bf16_t* p, long long i) { return bf16_to_f32(p[i]); }
__device__ __forceinline__ void st(float* p, long long i, float v) { p[i] = v; }
__device__ __forceinline__ void st(bf16_t* p, long long i, float v) { p[i] = f32_to_bf16(v); }

// Eight consecutive values at p + i as f32, and back: one 16-byte access for bf16, two for
// f32. `i` is a multiple of 8 and the buffer 16-byte aligned (device allocations are).
__device__ __forceinline__ void ld8(const bf16_t* p, long long i, float* v) {
    uint4 u = *(const uint4*)(p + i);
    u32 w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        v[2 * j] = __uint_as_float(w[j] << 16);
        v[2 * j + 1] = __uint_as_float(w[j] & 0xffff0000u);
    }
}

__device__ __forceinline__ void ld8(const float* p, long long i, float* v) {
    float4 a = *(const float4*)(p + i), b = *(const float4*)(p + i + 4);
    v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w;
    v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
}

__device__ __forceinline__ void st8(bf16_t* p, long long i, const float* v) {
    uint4 u;
    u.x = pack2_bf16(v[0], v[1]);
    u.y = pack2_bf16(v[2], v[3]);
    u.z = pack2_bf16(v[4], v[5]);
    u.w = pack2_bf16(v[6], v[7]);
    *(uint4*)(p + i) = u;
}

__device__ __forceinline__ void st8(float* p, long long i, const float* v) {
    float4 a, b;
    a.x = v[0]; a.y = v[1]; a.z = v[2]; a.w = v[3];
    b.x = v[4]; b.y = v[5]; b.z = v[6]; b.w = v[7];
    *(float4*)(p + i) = a;
    *(float4*)(p + i + 4) = b;
}

// Float type codes shared with the Rust side: 0 = f32, 1 = f16, 2 = bf16.
__device__ __forceinline__ float round_to(int dt, float v) {
    return dt == 2 ? round_bf16(v) : (dt == 1 ? round_f16(v) : v);
}

// FP8 E4M3FN: no infinities, 0x7f/0xff are NaN, max 448.
__device__ __forceinline__ float fp8_e4m3_to_f32(u8 b) {
    int e = (b >> 3) & 0xf;
    int m = b & 7;
    float mag;
    if (e == 15 && m == 7) return __int_as_float(0x7fc00000);
    if (e == 0) mag = (float)m * 0.001953125f;  // 2^-9
    else mag = ldexpf(1.0f + (float)m * 0.125f, e - 7);
    return (b & 0x80) ? -mag : mag;
}

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Sum over a block of at most 1024 threads; every thread gets the result.
__device__ float block_sum(float v) {
    __shared__ float part[32];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) part[warp] = v;
    __syncthreads();
    float t = lane < nw ? part[lane] : 0.0f;
    return warp_sum(t);
}

__device__ double warp_sum_f64(double v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ double block_sum_f64(double v) {
    __shared__ double part_d[32];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    v = warp_sum_f64(v);
    __syncthreads();
    if (lane == 0) part_d[warp] = v;
    __syncthreads();
    return warp_sum_f64(lane < nw ? part_d[lane] : 0.0);
}

// A score as a u32 whose order is the scores' (-0 as +0): DeepSeek's indexer's selection.
__device__ __forceinline__ u32 order_key(float s) {
    u32 b = __float_as_uint(s + 0.0f);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

__device__ float block_max(float v) {
    __shared__ float part[32];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) part[warp] = v;
    __syncthreads();
    float t = lane < nw ? part[lane] : -__int_as_float(0x7f800000);
    return warp_max(t);
}

// ---- Shared by the tensor-core kernels (flash_attention*.cu, expert_gate_up.cu; sm_80 and later) ----

__device__ __forceinline__ u32 smem_addr(const void* p) {
    u32 a;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
    return a;
}

// 16 bytes global -> shared (at a shared-window address, or a generic pointer into shared
// memory), asynchronously; zero-filled when !valid (src is not read). sm_80 and later.
__device__ __forceinline__ void cp_async16(u32 dst, const void* src, bool valid = true) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
                 "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
    cp_async16(smem_addr(dst), src, valid);
}

__device__ __forceinline__ void cp_async_commit() {
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}

// Wait until at most one committed group (the latest prefetch) is still in flight.
__device__ __forceinline__ void cp_async_wait_prev() {
    asm volatile("cp.async.wait_group 1;\n" ::: "memory");
}

// The double-buffered key/value loop: prefetches tile n + 1 (if any) into the other stage,
// then waits until this thread's copies of tile n have landed. The group is committed even
// when empty so that "all but the latest" is always tile n.
template <typename Load>
__device__ __forceinline__ void next_tile(int n, int n_tiles, Load load_tile) {
    if (n + 1 < n_tiles) load_tile(n + 1);
    cp_async_commit();
    cp_async_wait_prev();
}

__device__ __forceinline__ void ldsm_x4(u32* r, const bf16_t* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p)));
}

__device__ __forceinline__ void ldsm_x4_trans(u32* r, const bf16_t* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p)));
}

// c += a b for one 16 x 8 tile.
__device__ __forceinline__ void mma_bf16(float* c, const u32* a, u32 b0, u32 b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ float fast_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

// Two adjacent output values: one 4-byte store as bf16, one 8-byte store as f32.
__device__ __forceinline__ void st2(bf16_t* p, float a, float b) { *(u32*)p = pack2_bf16(a, b); }
__device__ __forceinline__ void st2(float* p, float a, float b) { *(float2*)p = make_float2(a, b); }

// Scores S and outputs O are held as 16 x 8 f32 accumulator tiles in the layout of
// mma.m16n8k16, which wgmma's accumulators share per warp (lane = 4 g + t): rows g and g + 8 of
// the warp's 16, columns 2t and 2t + 1, in c[0..1] and c[2..3]. Two consecutive 8-key tiles of
// S rounded to bf16 are exactly the A operand of P V, as in FlashAttention-2.

// The online-softmax state of a lane's two query rows.
struct SoftmaxRows {
    int row[2];    // positions in the batch
    int start[2];  // first key of each row's sequence (INT_MAX past the last token)
    float m[2];    // running max of the unscaled scores
    float l[2];    // this lane's columns of the running sum
};

// The first key batch row `row` sees: its sequence's start `start`, or the first key of its
// sliding window of `window` keys (0: none).
__device__ __forceinline__ int first_key(int row, int start, int window) {
    return window > 0 ? max(start, row + 1 - window) : start;
}

// Rows g and g + 8 of the warp whose first row is `first`, nothing seen yet.
__device__ __forceinline__ SoftmaxRows softmax_rows(int first, int g, int tokens,
                                                    const u32* seq_start, int window) {
    SoftmaxRows r;
    r.row[0] = first + g;
    r.row[1] = first + g + 8;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        r.start[i] =
            r.row[i] < tokens ? first_key(r.row[i], (int)seq_start[r.row[i]], window) : 0x7fffffff;
        r.m[i] = -__int_as_float(0x7f800000);
        r.l[i] = 0.0f;
    }
    return r;
}

// Starts both rows' softmax with head h's sink logit (gpt-oss; `sinks` null: none): a logit
// already seen, of weight exp(0) counted once (by lane t == 0 of the row's four), no value.
// Kept in the unscaled units of `m` (the sink is a scaled logit).
__device__ __forceinline__ void add_sink(SoftmaxRows& r, const float* sinks, int h,
                                         float scale_log2, int t) {
    if (!sinks) return;
    float m0 = sinks[h] / (scale_log2 * 0.6931471805599453f);
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        r.m[i] = m0;
        r.l[i] = t == 0 ? 1.0f : 0.0f;
    }
}

template <int N>
__device__ __forceinline__ void zero_tiles(float (&c)[N][4]) {
#pragma unroll
    for (int j = 0; j < N; ++j) c[j][0] = c[j][1] = c[j][2] = c[j][3] = 0.0f;
}

// Whether sparse attention's selection (`key_mask`: `words` u32 a query row, bit p of a row
// set where it keeps the key at position p of its sequence) keeps position `pos` for `row`.
__device__ __forceinline__ bool key_selected(const u32* key_mask, int words, int row, int pos) {
    return (key_mask[(long long)row * words + (pos >> 5)] >> (pos & 31)) & 1u;
}

// Turns one tile of scores (NT 8-key tiles from key k0) into unnormalized probabilities:
// soft-capped where `softcap` > 0, masked where `mask` asks (keys before a row's first key or
// after its position) and wherever `key_mask` (sparse attention's selection; null: none) drops
// a key, exponentiated against the new running max, their sums added to l. Sets
// alpha to the factor by which the rows' earlier output must be scaled. The scale is positive,
// so it commutes with the max and folds into the exp2; a capped score is kept in the same
// unscaled units (cap * tanh(s * scale / cap) / scale).
template <int NT>
__device__ __forceinline__ void softmax_tile(float (&s)[NT][4], SoftmaxRows& r, bool mask, int k0,
                                             int t, float scale_log2, float softcap,
                                             float (&alpha)[2], const u32* key_mask,
                                             int mask_words) {
    const float NEG_INF = -__int_as_float(0x7f800000);
    if (softcap > 0.0f) {
        float scale = scale_log2 * 0.6931471805599453f;
        float in = scale / softcap, out = softcap / scale;
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) s[j][e] = out * tanhf(s[j][e] * in);
    }
    if (mask || key_mask) {
#pragma unroll
        for (int j = 0; j < NT; ++j) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                int i = e >> 1, key = k0 + j * 8 + 2 * t + (e & 1);
                bool hidden = key < r.start[i] || key > r.row[i];
                if (!hidden && key_mask) hidden = !key_selected(key_mask, mask_words, r.row[i],
                                                               key - r.start[i]);
                if (hidden) s[j][e] = NEG_INF;
            }
        }
    }
    float mx[2] = {r.m[0], r.m[1]};
#pragma unroll
    for (int j = 0; j < NT; ++j) {
        mx[0] = fmaxf(mx[0], fmaxf(s[j][0], s[j][1]));
        mx[1] = fmaxf(mx[1], fmaxf(s[j][2], s[j][3]));
    }
    float base[2], rs[2] = {0.0f, 0.0f};
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
        mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
        // A row with nothing visible yet keeps base 0: exp2(-inf) = 0 everywhere.
        base[i] = mx[i] == NEG_INF ? 0.0f : mx[i] * scale_log2;
        alpha[i] = fast_exp2(r.m[i] * scale_log2 - base[i]);
        r.m[i] = mx[i];
    }
#pragma unroll
    for (int j = 0; j < NT; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            s[j][e] = fast_exp2(fmaf(s[j][e], scale_log2, -base[e >> 1]));
            rs[e >> 1] += s[j][e];
        }
    }
#pragma unroll
    for (int i = 0; i < 2; ++i) r.l[i] = r.l[i] * alpha[i] + rs[i];
}

template <int DT>
__device__ __forceinline__ void scale_rows(float (&o)[DT][4], const float (&alpha)[2]) {
#pragma unroll
    for (int j = 0; j < DT; ++j) {
        o[j][0] *= alpha[0];
        o[j][1] *= alpha[0];
        o[j][2] *= alpha[1];
        o[j][3] *= alpha[1];
    }
}

// S = Q K^T for one warp on mma.sync, f32 accumulation (`s` zeroed here): its 16 query rows
// (`qa`: this lane's ldmatrix address of their first 16 values) against NT 8-row tiles of keys
// (`ks`: rows of `ld` bf16 values) over KSTEPS steps of 16 values, UNROLL of them unrolled
// (lm, lr: which 8x8 matrix of an ldmatrix this lane addresses, which of its rows).
template <int NT, int KSTEPS, int UNROLL>
__device__ __forceinline__ void qk_tiles(float (&s)[NT][4], const bf16_t* qa, const bf16_t* ks,
                                         int ld, int lm, int lr) {
    zero_tiles(s);
#pragma unroll UNROLL
    for (int kk = 0; kk < KSTEPS; ++kk) {
        u32 a[4];
        ldsm_x4(a, qa + kk * 16);
#pragma unroll
        for (int jp = 0; jp < NT / 2; ++jp) {
            u32 b[4];
            ldsm_x4(b, ks + (jp * 16 + lr + 8 * (lm >> 1)) * ld + kk * 16 + 8 * (lm & 1));
            mma_bf16(s[2 * jp], a, b[0], b[1]);
            mma_bf16(s[2 * jp + 1], a, b[2], b[3]);
        }
    }
}

// Keys 16 ks .. 16 ks + 15 of P, rounded to bf16, as the A operand of one k16 step of P V.
template <int NT>
__device__ __forceinline__ void p_operand(const float (&s)[NT][4], int ks, u32 (&a)[4]) {
    a[0] = pack2_bf16(s[2 * ks][0], s[2 * ks][1]);
    a[1] = pack2_bf16(s[2 * ks][2], s[2 * ks][3]);
    a[2] = pack2_bf16(s[2 * ks + 1][0], s[2 * ks + 1][1]);
    a[3] = pack2_bf16(s[2 * ks + 1][2], s[2 * ks + 1][3]);
}

// O += P V for one warp: P its NT 8-key tiles of probabilities `s` (p_operand), V their
// NT * 8 rows from `vs` (rows of `ld` bf16 values), DT 8-wide tiles of output columns.
template <int NT, int DT>
__device__ __forceinline__ void pv_tiles(float (&o)[DT][4], const float (&s)[NT][4],
                                         const bf16_t* vs, int ld, int lm, int lr) {
#pragma unroll
    for (int ks16 = 0; ks16 < NT / 2; ++ks16) {
        u32 a[4];
        p_operand(s, ks16, a);
#pragma unroll
        for (int jp = 0; jp < DT / 2; ++jp) {
            u32 b[4];
            ldsm_x4_trans(b, vs + (ks16 * 16 + lr + 8 * (lm & 1)) * ld + jp * 16 + 8 * (lm >> 1));
            mma_bf16(o[2 * jp], a, b[0], b[1]);
            mma_bf16(o[2 * jp + 1], a, b[2], b[3]);
        }
    }
}

// The four lanes of a row hold disjoint columns: sum their l, then write O / l to the head's
// columns of the output rows.
template <int DT, typename To>
__device__ __forceinline__ void store_rows(To* out, const float (&o)[DT][4], SoftmaxRows& r,
                                           int tokens, long long row_width, int t) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        float l = r.l[i];
        l += __shfl_xor_sync(0xffffffffu, l, 1);
        l += __shfl_xor_sync(0xffffffffu, l, 2);
        float inv = l > 0.0f ? 1.0f / l : 0.0f;
        if (r.row[i] >= tokens) continue;
        To* orow = out + (long long)r.row[i] * row_width;
#pragma unroll
        for (int j = 0; j < DT; ++j)
            st2(orow + j * 8 + 2 * t, o[j][2 * i] * inv, o[j][2 * i + 1] * inv);
    }
}

// The entry points FN_d<D>_<out> of a flash-attention kernel template FN for head_dim 64 and
// 128, bf16 inputs, the output f32 where a linear quantizes it next; BOUNDS its launch bounds,
// QKV the type in which q, k and v are passed (device pointers, or TMA tensor maps).
#define FLASH_ENTRY(FN, BOUNDS, QKV, D, OUT, TOUT)                                             \
    extern "C" __global__ void BOUNDS FN##_d##D##_##OUT(                                        \
        TOUT* out, QKV q, QKV k, QKV v, const u32* seq_start, int tokens, int heads,             \
        int kv_heads, float scale_log2, float softcap, int window, const float* sinks,           \
        const u32* key_mask, int mask_words) {                                                 \
        FN<D>(out, q, k, v, seq_start, tokens, heads, kv_heads, scale_log2, softcap, window,    \
              sinks, key_mask, mask_words);                                                    \
    }
#define FLASH_ENTRIES(FN, BOUNDS, QKV)              \
    FLASH_ENTRY(FN, BOUNDS, QKV, 64, bf16, bf16_t)  \
    FLASH_ENTRY(FN, BOUNDS, QKV, 64, f32, float)    \
    FLASH_ENTRY(FN, BOUNDS, QKV, 128, bf16, bf16_t) \
    FLASH_ENTRY(FN, BOUNDS, QKV, 128, f32, float)
