// nvrtc: exact
// Dequantizes rows [row0, row0 + nrows) of one linear's packed weight into the scratch buffer
// (row-major, n_in wide) in the activation type, bit for bit the values of
// QLinear::dequantize_rows (rounded to bf16 for the bf16 path): w = round_model(round_scale(
// (q - z) * s)). Each thread decodes PER consecutive weights of a row and stores them with
// 16-byte writes where the row width allows it. Every kernel has a bf16 and an f32 entry, and
// an `_experts` pair that dequantizes many weights of one layout in one launch: blockIdx.y
// picks a row of `table` (`Expert`: where that weight's tensors and output lie), the layout
// arguments are shared. A layer's experts differ only in those addresses (and an FP4
// expert in its global scale). A bf16 one-weight entry given `f16_scale` (not 0) writes each
// bf16 value times that power of two as f16 instead, exact (`LoweredWeight::f16_exact_scale`):
// the operand `split_gemm.cu` reads, with no pass of its own.

// (row, first column) of this thread's chunk of `per` weights; false when past the end.
__device__ __forceinline__ bool chunk(int nrows, int n_in, int per, long long* r, int* c0) {
    long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    int chunks = (n_in + per - 1) / per;
    if (idx >= (long long)nrows * chunks) return false;
    *r = idx / chunks;
    *c0 = (int)(idx % chunks) * per;
    return true;
}

// Writes v[0..PER) to out row r (local index) from column c0: 16-byte stores (st8) when every
// row starts 16-byte aligned and the chunk is whole, element stores otherwise. PER is a
// multiple of 8. A 16-bit `out` with `f16_scale` takes f16 values times it.
template <int PER, typename T>
__device__ __forceinline__ void store(T* out, long long r, int c0, int n_in, float* v,
                                      float f16_scale) {
    long long i = r * n_in + c0;
    bool f16 = sizeof(T) == 2 && f16_scale != 0.0f;
    if (f16) {
#pragma unroll
        for (int j = 0; j < PER; ++j) v[j] *= f16_scale;
    }
    if (n_in % (16 / (int)sizeof(T)) == 0 && c0 + PER <= n_in) {
#pragma unroll
        for (int j = 0; j < PER; j += 8) {
            if (f16) {
                *(uint4*)(out + i + j) = pack8_f16(v + j);
            } else {
                st8(out, i + j, v + j);
            }
        }
    } else {
        for (int j = 0; j < PER && c0 + j < n_in; ++j) {
            if (f16) {
                ((unsigned short*)out)[i + j] = f16_bits(v[j]);
            } else {
                st(out, i + j, v[j]);
            }
        }
    }
}

// bf16 pairs as f16 pairs times `f16_scale` (exact, as in `store`), where it is not 0.
__device__ __forceinline__ void pairs_to_f16(u32 (&pk)[4], float f16_scale) {
    if (f16_scale == 0.0f) return;
#pragma unroll
    for (int j = 0; j < 4; ++j)
        pk[j] = pack2_f16(__uint_as_float(pk[j] << 16) * f16_scale,
                          __uint_as_float(pk[j] & 0xffff0000u) * f16_scale);
}

// The scale entry of weight (r, c), as backend::lowering::ScaleIndex defines it; zero points
// are indexed the same way.
__device__ __forceinline__ long long scale_at(int row_div, int row_stride, int col_div,
                                              const int* g_idx, long long r, int c) {
    return (r / row_div) * row_stride + (g_idx ? g_idx[c] : c / col_div);
}

// One row of an `_experts` launch's table: output, codes, scales, zero points (or 0),
// g_idx (or 0), and for FP4 the f32 bits of its scalar.
struct Expert {
    unsigned long long out, packed, scales, zeros, g_idx, scalar;
};

#define INT_PER 8

// compressed-tensors pack-quantized: unsigned codes q + 2^(bits-1), LSB first, either a dense
// bitstream (legacy_per == 0) or `legacy_per` codes per 32-bit word. `zeros` are signed zero
// points indexed like the scales, null when symmetric (code_kind 0); with code_kind 1 they are
// the f32 minimums of GGUF's types instead, subtracted from code * scale with the codes read
// unsigned (the product is exact, so a contraction into an fma rounds the same); with
// code_kind 2 they are the i32 value of each code (IQ4's levels), times the scale (exact).
template <typename To, int KIND>
__device__ void dequant_int_k(To* out, const u32* packed, const float* scales, const int* zeros,
                              const int* g_idx, int row0, int nrows, int n_in, int words_per_row,
                              int bits, int legacy_per, int row_div, int row_stride, int col_div,
                              int scale_dt, int model_dt, float f16_scale) {
    long long lr;
    int c0;
    if (!chunk(nrows, n_in, INT_PER, &lr, &c0)) return;
    long long r = row0 + lr;
    const u32* row = packed + r * words_per_row;
    u32 mask = (1u << bits) - 1u;
    float vals[INT_PER];
#pragma unroll
    for (int j = 0; j < INT_PER; ++j) {
        int c = c0 + j;
        vals[j] = 0.0f;
        if (c >= n_in) continue;
        u32 code;
        if (legacy_per > 0) {
            code = (row[c / legacy_per] >> (bits * (c % legacy_per))) & mask;
        } else {
            long long bit = (long long)c * bits;
            int w = (int)(bit >> 5), off = (int)(bit & 31);
            u32 v = row[w] >> off;
            if (off + bits > 32) v |= row[w + 1] << (32 - off);
            code = v & mask;
        }
        long long si = scale_at(row_div, row_stride, col_div, g_idx, r, c);
        float w;
        if constexpr (KIND == 1) {
            w = (float)code * scales[si] - ((const float*)zeros)[si];
        } else if constexpr (KIND == 2) {
            w = (float)zeros[code] * scales[si];
        } else {
            int q = (int)code - (1 << (bits - 1));
            int z = zeros ? zeros[si] : 0;
            w = round_to(scale_dt, (float)(q - z) * scales[si]);
        }
        vals[j] = round_to(model_dt, w);
    }
    store<INT_PER>(out, lr, c0, n_in, vals, f16_scale);
}

// code_kind as a template argument: one loop each, rather than the three kinds' branches
// inside every unrolled step (NVRTC took 3x as long to compile that).
template <typename To>
__device__ void dequant_int_t(To* out, const u32* packed, const float* scales, const int* zeros,
                              const int* g_idx, int row0, int nrows, int n_in, int words_per_row,
                              int bits, int legacy_per, int row_div, int row_stride, int col_div,
                              int scale_dt, int model_dt, int code_kind, float f16_scale) {
    switch (code_kind) {
    case 1:
        dequant_int_k<To, 1>(out, packed, scales, zeros, g_idx, row0, nrows, n_in, words_per_row,
                             bits, legacy_per, row_div, row_stride, col_div, scale_dt, model_dt,
                             f16_scale);
        break;
    case 2:
        dequant_int_k<To, 2>(out, packed, scales, zeros, g_idx, row0, nrows, n_in, words_per_row,
                             bits, legacy_per, row_div, row_stride, col_div, scale_dt, model_dt,
                             f16_scale);
        break;
    default:
        dequant_int_k<To, 0>(out, packed, scales, zeros, g_idx, row0, nrows, n_in, words_per_row,
                             bits, legacy_per, row_div, row_stride, col_div, scale_dt, model_dt,
                             f16_scale);
    }
}

#define DEQUANT_INT_ENTRY(NAME, TO)                                                             \
    extern "C" __global__ void NAME(TO* out, const u32* packed, const float* scales,            \
                                    const int* zeros, const int* g_idx, int row0, int nrows,    \
                                    int n_in, int words_per_row, int bits, int legacy_per,      \
                                    int row_div, int row_stride, int col_div, int scale_dt,     \
                                    int model_dt, int code_kind, float f16_scale) {             \
        dequant_int_t(out, packed, scales, zeros, g_idx, row0, nrows, n_in, words_per_row,      \
                      bits, legacy_per, row_div, row_stride, col_div, scale_dt, model_dt,       \
                      code_kind, f16_scale);                                                    \
    }
DEQUANT_INT_ENTRY(dequant_int_bf16, bf16_t)
DEQUANT_INT_ENTRY(dequant_int_f32, float)

#define DEQUANT_INT_EXPERTS(NAME, TO)                                                           \
    extern "C" __global__ void NAME(const Expert* table, int row0, int nrows, int n_in,         \
                                    int words_per_row, int bits, int legacy_per, int row_div,   \
                                    int row_stride, int col_div, int scale_dt, int model_dt,    \
                                    int code_kind) {                                            \
        Expert e = table[blockIdx.y];                                                           \
        dequant_int_t((TO*)e.out, (const u32*)e.packed, (const float*)e.scales,                 \
                      (const int*)e.zeros, (const int*)e.g_idx, row0, nrows, n_in,              \
                      words_per_row, bits, legacy_per, row_div, row_stride, col_div, scale_dt,  \
                      model_dt, code_kind, 0.0f);                                               \
    }
DEQUANT_INT_EXPERTS(dequant_int_experts_bf16, bf16_t)
DEQUANT_INT_EXPERTS(dequant_int_experts_f32, float)

// RN(a * b) of two bf16 pairs in one instruction (sm_80+): an fma with a -0 addend is exactly
// the rounded product.
__device__ __forceinline__ u32 mul_rn_bf16x2(u32 a, u32 b) {
    u32 d;
    asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(0x80008000u));
    return d;
}

// 8 bf16 values packed in pairs, stored as bf16 or widened to f32 (exact).
__device__ __forceinline__ void store_pairs(bf16_t* o, const u32* pk) {
    uint4 u;
    u.x = pk[0];
    u.y = pk[1];
    u.z = pk[2];
    u.w = pk[3];
    *(uint4*)o = u;
}

__device__ __forceinline__ void store_pairs(float* o, const u32* pk) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        float4 f;
        f.x = __uint_as_float(pk[2 * i] << 16);
        f.y = __uint_as_float(pk[2 * i] & 0xffff0000u);
        f.z = __uint_as_float(pk[2 * i + 1] << 16);
        f.w = __uint_as_float(pk[2 * i + 1] & 0xffff0000u);
        *(float4*)(o + 4 * i) = f;
    }
}

// The common INT4 case at memory speed: 8 codes per 32-bit word (the dense bitstream and the
// legacy layout coincide for 4 bits), no g_idx, one scale row per weight row (row_div 1) and
// col_div a multiple of 8, n_in a multiple of 8. One thread decodes the 8 weights of one word and
// writes them with one 16-byte store, so a warp reads 128 and writes 512 contiguous bytes
// (threads that each wrote 64 bytes left every store instruction's sectors half used). With
// bf16 scales in a bf16 model, W = RN_bf16((q - z) * s) is one bf16x2 multiply per pair
// ((q - z) is exact in bf16): a few instructions per weight instead of two f32 -> bf16
// roundings.
template <typename To>
__device__ void dequant_int4_t(To* out, const u32* packed, const float* scales,
                               const int* zeros, int row0, int nrows, int n_in, int row_stride,
                               int col_div, int scale_dt, int model_dt, float f16_scale) {
    long long lr;
    int c0;
    if (!chunk(nrows, n_in, 8, &lr, &c0)) return;
    long long r = row0 + lr;
    u32 w = packed[r * (n_in / 8) + c0 / 8];
    long long si = scale_at(1, row_stride, col_div, 0, r, c0);
    float s = scales[si];
    int z = zeros ? zeros[si] : 0;
#if __CUDA_ARCH__ >= 800
    if (scale_dt == 2 && model_dt == 2) {
        u32 s2 = (u32)f32_to_bf16(s) * 0x10001u;  // s is a bf16 value widened: exact
        int off = 8 + z;
        u32 pk[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            int q0 = (int)((w >> (8 * j)) & 15u) - off;
            int q1 = (int)((w >> (8 * j + 4)) & 15u) - off;
            pk[j] = mul_rn_bf16x2(pack2_bf16((float)q0, (float)q1), s2);
        }
        pairs_to_f16(pk, f16_scale);
        store_pairs(out + lr * n_in + c0, pk);
        return;
    }
#endif
    float vals[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
        int q = (int)((w >> (4 * j)) & 15u) - 8;
        vals[j] = round_to(model_dt, round_to(scale_dt, (float)(q - z) * s));
    }
    store<8>(out, lr, c0, n_in, vals, f16_scale);
}

#define DEQUANT_INT4_ENTRY(NAME, TO)                                                            \
    extern "C" __global__ void NAME(TO* out, const u32* packed, const float* scales,          \
                                    const int* zeros, int row0, int nrows, int n_in,           \
                                    int row_stride, int col_div, int scale_dt, int model_dt,   \
                                    float f16_scale) {                                         \
        dequant_int4_t(out, packed, scales, zeros, row0, nrows, n_in, row_stride, col_div,     \
                       scale_dt, model_dt, f16_scale);                                         \
    }
DEQUANT_INT4_ENTRY(dequant_int4_bf16, bf16_t)
DEQUANT_INT4_ENTRY(dequant_int4_f32, float)

#define DEQUANT_INT4_EXPERTS(NAME, TO)                                                          \
    extern "C" __global__ void NAME(const Expert* table, int row0, int nrows, int n_in,         \
                                    int row_stride, int col_div, int scale_dt, int model_dt) {  \
        Expert e = table[blockIdx.y];                                                           \
        dequant_int4_t((TO*)e.out, (const u32*)e.packed, (const float*)e.scales,                \
                       (const int*)e.zeros, row0, nrows, n_in, row_stride, col_div, scale_dt,   \
                       model_dt, 0.0f);                                                         \
    }
DEQUANT_INT4_EXPERTS(dequant_int4_experts_bf16, bf16_t)
DEQUANT_INT4_EXPERTS(dequant_int4_experts_f32, float)

// FP4: two E2M1 codes per byte (low nibble first), one scale byte per `group` (16 or 32)
// weights; n_in is a multiple of the group, so 8 or 16 weights never straddle a scale (a
// bf16 model's path takes 8 a time, the general one 16 from one 8-byte load). The scale
// byte's meaning and the arithmetic follow each format's reference decode (`Fp4Scale::weight`):
//   kind 0, compressed-tensors NVFP4: RN_bf16(e2m1 * (fp8 / scalar)), an IEEE f32 division;
//   kind 1, ModelOpt NVFP4:          e2m1 * (fp8 * scalar) in f32;
//   kind 2, MX E8M0:                 RN_bf16(e2m1 * 2^(byte - 127));
//   kind 3, GGUF MXFP4:              (2 e2m1) * 2^(byte - 128) in f32 (ggml's levels and
//                                    halved scale: byte 255 is finite).
__device__ __forceinline__ float e8m0_to_f32(u32 e) {
    if (e == 0u) return __uint_as_float(0x00400000u);
    if (e == 255u) return __uint_as_float(0x7f800000u);
    return __uint_as_float(e << 23);
}

__device__ __forceinline__ float e8m0_half(u32 e) {
    return e < 2u ? __uint_as_float(0x00200000u << e) : __uint_as_float((e - 1u) << 23);
}

__device__ __forceinline__ float fp4_scale(u32 sb, int kind, float scalar) {
    return kind == 0 ? __fdiv_rn(fp8_e4m3_to_f32(sb), scalar)
         : kind == 1 ? __fmul_rn(fp8_e4m3_to_f32(sb), scalar)
         : kind == 2 ? e8m0_to_f32(sb)
                     : e8m0_half(sb);
}

// The E2M1 value of a code's low 4 bits: the magnitude bits placed as an f32's exponent and
// mantissa (E2M1's exponent bias is 1, not 127, and 0.5 is a subnormal in both) and the sign
// bit, then 2^126 restores the bias exactly (kernels keep subnormals: no flush to zero). No
// table: an indexed array lives in local memory.
__device__ __forceinline__ float e2m1_value(u32 code) {
    return __fmul_rn(__uint_as_float(((code & 7u) << 22) | ((code & 8u) << 28)), 0x1p126f);
}

// A code's value times its scale `s` (fp4_scale); kind 3 doubles the value first (exact).
__device__ __forceinline__ float fp4_product(u32 code, float s, int kind) {
    float e = e2m1_value(code);
    return __fmul_rn(kind == 3 ? 2.0f * e : e, s);
}

template <typename To>
__device__ void dequant_fp4_t(To* out, const uint2* packed, const u8* scales, int kind,
                              float scalar, int group, int row0, int nrows, int n_in,
                              int model_dt, float f16_scale) {
    // Into a bf16 model every kind's weight is RN_bf16 of its f32 product: one conversion per
    // pair. A block's threads take 8 weights each, twice, so each warp store writes 512
    // contiguous bytes (16 weights a thread left its stores' sectors half used); groups of 16 or
    // 32 never straddle those 8, nor do rows (n_in is a multiple of 16).
    if constexpr (sizeof(To) == 2) {
        if (model_dt == 2 && (group == 16 || group == 32)) {
            long long eights = (long long)nrows * (n_in / 8);
            long long first = (long long)blockIdx.x * blockDim.x * 2 + threadIdx.x;
#pragma unroll
            for (int half = 0; half < 2; ++half) {
                long long i = first + half * blockDim.x;
                if (i >= eights) return;
                long long flat = (long long)row0 * n_in + i * 8;
                float s = fp4_scale(scales[flat >> (group == 16 ? 4 : 5)], kind, scalar);
                u32 w = ((const u32*)packed)[flat / 8];
                u32 pk[4];
#pragma unroll
                for (int j = 0; j < 4; ++j)
                    pk[j] = pack2_bf16(fp4_product(w >> (8 * j), s, kind),
                                       fp4_product(w >> (8 * j + 4), s, kind));
                pairs_to_f16(pk, f16_scale);
                store_pairs(out + i * 8, pk);
            }
            return;
        }
    }
    long long lr;
    int c0;
    if (!chunk(nrows, n_in, 16, &lr, &c0)) return;
    long long r = row0 + lr;
    float s_eff = fp4_scale(scales[r * (n_in / group) + c0 / group], kind, scalar);
    uint2 pk = packed[(r * n_in + c0) / 16];
    u32 words[2] = {pk.x, pk.y};
    float vals[16];
#pragma unroll
    for (int j = 0; j < 16; ++j) {
        u32 code = (words[j / 8] >> (4 * (j % 8))) & 15u;
        float w = fp4_product(code, s_eff, kind);
        vals[j] = round_to(model_dt, kind == 1 || kind == 3 ? w : round_bf16(w));
    }
    store<16>(out, lr, c0, n_in, vals, f16_scale);
}

#define DEQUANT_FP4_ENTRY(NAME, TO)                                                            \
    extern "C" __global__ void NAME(TO* out, const uint2* packed, const u8* scales, int kind,  \
                                    float scalar, int group, int row0, int nrows, int n_in,    \
                                    int model_dt, float f16_scale) {                           \
        dequant_fp4_t(out, packed, scales, kind, scalar, group, row0, nrows, n_in, model_dt,  \
                      f16_scale);                                                              \
    }
DEQUANT_FP4_ENTRY(dequant_fp4_bf16, bf16_t)
DEQUANT_FP4_ENTRY(dequant_fp4_f32, float)

#define DEQUANT_FP4_EXPERTS(NAME, TO)                                                           \
    extern "C" __global__ void NAME(const Expert* table, int kind, int group, int row0,         \
                                    int nrows, int n_in, int model_dt) {                        \
        Expert e = table[blockIdx.y];                                                           \
        dequant_fp4_t((TO*)e.out, (const uint2*)e.packed, (const u8*)e.scales, kind,            \
                      __uint_as_float((u32)e.scalar), group, row0, nrows, n_in, model_dt, 0.0f); \
    }
DEQUANT_FP4_EXPERTS(dequant_fp4_experts_bf16, bf16_t)
DEQUANT_FP4_EXPERTS(dequant_fp4_experts_f32, float)

#define UNPACKED_PER 8

// One FP8 E4M3 (is_int8 == 0) or INT8 code per weight; signed zero points indexed like the
// scales, or null.
template <typename To>
__device__ void dequant_unpacked_t(To* out, const u8* weight, int is_int8, const float* scales,
                                   const int* zeros, int row0, int nrows, int n_in, int row_div,
                                   int row_stride, int col_div, int scale_dt, int model_dt,
                                   float f16_scale) {
    long long lr;
    int c0;
    if (!chunk(nrows, n_in, UNPACKED_PER, &lr, &c0)) return;
    long long r = row0 + lr;
    float vals[UNPACKED_PER];
#pragma unroll
    for (int j = 0; j < UNPACKED_PER; ++j) {
        int c = c0 + j;
        vals[j] = 0.0f;
        if (c >= n_in) continue;
        u8 raw = weight[r * n_in + c];
        float v = is_int8 ? (float)(signed char)raw : fp8_e4m3_to_f32(raw);
        long long si = scale_at(row_div, row_stride, col_div, 0, r, c);
        float z = zeros ? (float)zeros[si] : 0.0f;
        vals[j] = round_to(model_dt, round_to(scale_dt, (v - z) * scales[si]));
    }
    store<UNPACKED_PER>(out, lr, c0, n_in, vals, f16_scale);
}

#define DEQUANT_UNPACKED_ENTRY(NAME, TO)                                                        \
    extern "C" __global__ void NAME(TO* out, const u8* weight, int is_int8, const float* scales, \
                                    const int* zeros, int row0, int nrows, int n_in,            \
                                    int row_div, int row_stride, int col_div, int scale_dt,     \
                                    int model_dt, float f16_scale) {                            \
        dequant_unpacked_t(out, weight, is_int8, scales, zeros, row0, nrows, n_in, row_div,     \
                           row_stride, col_div, scale_dt, model_dt, f16_scale);                 \
    }
DEQUANT_UNPACKED_ENTRY(dequant_unpacked_bf16, bf16_t)
DEQUANT_UNPACKED_ENTRY(dequant_unpacked_f32, float)

#define DEQUANT_UNPACKED_EXPERTS(NAME, TO)                                                      \
    extern "C" __global__ void NAME(const Expert* table, int is_int8, int row0, int nrows,      \
                                    int n_in, int row_div, int row_stride, int col_div,         \
                                    int scale_dt, int model_dt) {                               \
        Expert e = table[blockIdx.y];                                                           \
        dequant_unpacked_t((TO*)e.out, (const u8*)e.packed, is_int8, (const float*)e.scales,    \
                           (const int*)e.zeros, row0, nrows, n_in, row_div, row_stride,         \
                           col_div, scale_dt, model_dt, 0.0f);                                  \
    }
DEQUANT_UNPACKED_EXPERTS(dequant_unpacked_experts_bf16, bf16_t)
DEQUANT_UNPACKED_EXPERTS(dequant_unpacked_experts_f32, float)
