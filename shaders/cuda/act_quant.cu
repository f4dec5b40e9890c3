// nvrtc: exact
// Input-activation fake quantization of compressed-tensors (numerics::ActQuant::apply_row), one
// block per row, out-of-place (x stays the unquantized input). Every scale, quotient and value
// is computed in f32 as in the f32 reference; only the result is stored in the output's type.
// (compressed-tensors in a bf16 model also rounds scales and quotients to bf16: emulating that
// moved quantized values by whole steps against the f32 reference, 4.6e-3 in PPL on an FP8
// W8A8 8B instead of 1.2e-3; docs/decisions.md: Activation quantizers in f32 in every precision.) An f32 input is quantized unrounded.
// Mode codes (Rust: ActQuant::kernel_code): 0 fp8 per token, 1 fp8 static, 2 int per token
// (`param` bits), 3 nvfp4 with a static global scale, 4 fp8 per token and group of `param`
// inputs (native FP8 checkpoints: a zero group left as it is), 5 the same as
// compressed-tensors computes it (a zero scale replaced by its epsilon), 6 MX with `param`
// bits (E2M1 or E4M3 values, power-of-two scales per 32), 7 fp8 per token and group of `param`
// inputs under a power-of-two scale (DeepSeek-V4's FP4 experts: DeepGEMM's per_token_cast_to_fp8
// with use_ue8m0, amax clamped below at 1e-4).

// Nearest FP8 E4M3FN value, ties to even, of a value already clamped to +-448.
__device__ float round_fp8_e4m3(float x) {
    if (x != x) return x;
    float a = fminf(fabsf(x), 448.0f);
    float q;
    if (a < 0.015625f) {  // 2^-6: subnormal step 2^-9
        q = rintf(a * 512.0f) * 0.001953125f;
    } else {
        int e;
        frexpf(a, &e);  // a = m * 2^e, m in [0.5, 1): floor(log2 a) = e - 1
        float step = ldexpf(1.0f, e - 1 - 3);
        q = rintf(__fdiv_rn(a, step)) * step;
    }
    return copysignf(fminf(q, 448.0f), x);
}

// compressed-tensors' round to the E2M1 grid (half to even), input already clamped.
__device__ float round_e2m1(float y) {
    float a = fabsf(y), q;
    if (a <= 0.25f) q = 0.0f;
    else if (a < 0.75f) q = 0.5f;
    else if (a <= 1.25f) q = 1.0f;
    else if (a < 1.75f) q = 1.5f;
    else if (a <= 2.5f) q = 2.0f;
    else if (a < 3.5f) q = 3.0f;
    else if (a <= 5.0f) q = 4.0f;
    else q = 6.0f;
    return copysignf(q, y);
}

// torch.finfo(torch.float32).eps: what compressed-tensors substitutes for a zero scale.
#define FLT_EPSILON_F 1.1920929e-7f

// compressed-tensors' MX scale exponent of a group (numerics::mx_scale_exponent): amax rounded
// to a power of two by its bits, less floor(log2(max)) of the element type, clamped to E8M0.
__device__ __forceinline__ int mx_scale_exponent(float amax, int bits) {
    unsigned r = (__float_as_uint(amax) + (1u << 21)) & 0x7f800000u;
    int code = r == 0 ? 0 : min(max((int)(r >> 23) - (bits == 4 ? 2 : 8), 0), 255);
    return code - 127;
}

// The row's scale in the per-tensor-scaled modes 0-2 (one scale a token): the static scale,
// or amax over the divisor (448 for FP8, half the integer range), a zero scale replaced by
// compressed-tensors' epsilon. Every thread of the block gets it.
template <typename Tin>
__device__ float row_scale(const Tin* row, int cols, int mode, float param) {
    if (mode == 1) return param == 0.0f ? FLT_EPSILON_F : param;
    float amax = 0.0f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) amax = fmaxf(amax, fabsf(ld(row, c)));
    amax = block_max(amax);
    // INT of `param` bits: the range [-2^(b-1), 2^(b-1) - 1], the divisor half of it.
    float divisor = mode == 2 ? ldexpf(1.0f, (int)param) * 0.5f - 0.5f : 448.0f;
    float s = __fdiv_rn(amax, divisor);
    return s == 0.0f ? FLT_EPSILON_F : s;
}

// The smallest power of two at least x, a positive normal float (numerics::pow2_at_least).
__device__ __forceinline__ float pow2_at_least(float x) {
    unsigned b = __float_as_uint(x), power = b & 0x7f800000u;
    return __uint_as_float((b & 0x007fffffu) == 0 ? power : power + (1u << 23));
}

// The scale of a group whose largest magnitude is `amax` in modes 4, 5 and 7: amax / 448, a
// zero scale replaced by compressed-tensors' epsilon in mode 5 (mode 4 leaves a zero group as it
// is); in mode 7 the next power of two of max(amax, 1e-4) / 448.
__device__ __forceinline__ float group_scale(float amax, int mode) {
    if (mode == 7) return pow2_at_least(__fdiv_rn(fmaxf(amax, 1e-4f), 448.0f));
    float s = __fdiv_rn(amax, 448.0f);
    return mode == 5 && s == 0.0f ? FLT_EPSILON_F : s;
}

// The code value of v under scale s in modes 0-2: an integer of `param` bits, or an FP8 E4M3
// value; the fake-quantized activation is this times s.
__device__ __forceinline__ float quantized(float v, float s, int mode, float param) {
    float y = __fdiv_rn(v, s);
    if (mode != 2) return round_fp8_e4m3(fminf(fmaxf(y, -448.0f), 448.0f));
    float hi = ldexpf(1.0f, (int)param - 1) - 1.0f;
    return rintf(fminf(fmaxf(y, -hi - 1.0f), hi));
}

// The E4M3FN bits of an E4M3 value (exact: `quantized` rounded it to the grid).
__device__ __forceinline__ unsigned char fp8_e4m3_bits(float q) {
    unsigned char sign = signbit(q) ? 0x80 : 0;
    float a = fabsf(q);
    if (a < 0.015625f) return sign | (unsigned char)(a * 512.0f);  // subnormal: m * 2^-9
    int e;
    float m = frexpf(a, &e);  // a = m * 2^e, m in [0.5, 1)
    return sign | (unsigned char)(((e - 1 + 7) << 3) | ((int)(m * 16.0f) - 8));
}

template <typename Tin, typename Tout>
__device__ void act_quant_row(Tout* out, const Tin* x, int cols, int mode, float param) {
    const Tin* row = x + (long long)blockIdx.x * cols;
    Tout* orow = out + (long long)blockIdx.x * cols;
    if (mode == 3) {
        float gs = param;
        int n_groups = (cols + 15) / 16;
        for (int g = threadIdx.x; g < n_groups; g += blockDim.x) {
            int c0 = g * 16, c1 = min(c0 + 16, cols);
            float amax = 0.0f;
            for (int c = c0; c < c1; ++c) amax = fmaxf(amax, fabsf(ld(row, c)));
            float s = gs * __fdiv_rn(amax, 6.0f);
            s = round_fp8_e4m3(fminf(fmaxf(s, -448.0f), 448.0f));
            if (s == 0.0f) s = 0.125f;
            float s_eff = __fdiv_rn(s, gs);
            for (int c = c0; c < c1; ++c) {
                float y = fminf(fmaxf(__fdiv_rn(ld(row, c), s_eff), -6.0f), 6.0f);
                st(orow, c, round_e2m1(y) * s_eff);
            }
        }
        return;
    }
    if (mode == 6) {
        // One warp per group of 32, a lane per input.
        int bits = (int)param;
        float top = bits == 4 ? 6.0f : 448.0f;
        int lane = threadIdx.x % 32, warps = blockDim.x / 32;
        for (int g = threadIdx.x / 32; g * 32 < cols; g += warps) {
            int c = g * 32 + lane;
            float v = c < cols ? ld(row, c) : 0.0f;
            int e = mx_scale_exponent(warp_max(fabsf(v)), bits);
            float y = fminf(fmaxf(ldexpf(v, -e), -top), top);
            float q = bits == 4 ? round_e2m1(y) : round_fp8_e4m3(y);
            if (c < cols) st(orow, c, ldexpf(q, e));
        }
        return;
    }
    if (mode == 4 || mode == 5 || mode == 7) {
        // One warp per group (a group is typically 128 wide): the lanes share its amax.
        int group = (int)param;
        int n_groups = (cols + group - 1) / group;
        int lane = threadIdx.x % 32, warps = blockDim.x / 32;
        for (int g = threadIdx.x / 32; g < n_groups; g += warps) {
            int c0 = g * group, c1 = min(c0 + group, cols);
            float amax = 0.0f;
            for (int c = c0 + lane; c < c1; c += 32) amax = fmaxf(amax, fabsf(ld(row, c)));
            float s = group_scale(warp_max(amax), mode);
            for (int c = c0 + lane; c < c1; c += 32) {
                float v = ld(row, c);
                if (mode != 4 || amax > 0.0f) {
                    float y = fminf(fmaxf(__fdiv_rn(v, s), -448.0f), 448.0f);
                    v = round_fp8_e4m3(y) * s;
                }
                st(orow, c, v);
            }
        }
        return;
    }
    float s = row_scale(row, cols, mode, param);
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        st(orow, c, quantized(ld(row, c), s, mode, param) * s);
    }
}

// Modes 0-2, 4 and 5 as 8-bit GEMM operands: each row's codes (FP8 E4M3FN bits, or two's-
// complement integers) and its scale, or in modes 4 and 5 a scale per group at
// `scales[group * rows + row]` (the groups' vectors one after another, as cuBLASLt reads 1x128
// scales), for the 8-bit tensor cores (code times scale is the activation act_quant_row writes).
// Blocks past the input's `rows` (the grid padded for cuBLASLt) write zero codes and scales.
template <typename Tin>
__device__ void act_codes_row(unsigned char* codes, float* scales, const Tin* x, int rows,
                              int cols, int mode, float param) {
    const Tin* row = x + (long long)blockIdx.x * cols;
    unsigned char* crow = codes + (long long)blockIdx.x * cols;
    if (blockIdx.x >= rows) {
        for (int c = threadIdx.x; c < cols; c += blockDim.x) crow[c] = 0;
        int n_scales = mode == 4 || mode == 5 ? (cols + (int)param - 1) / (int)param : 1;
        for (int g = threadIdx.x; g < n_scales; g += blockDim.x)
            scales[(long long)g * gridDim.x + blockIdx.x] = 0.0f;
        return;
    }
    if (mode == 4 || mode == 5) {
        int group = (int)param;
        int lane = threadIdx.x % 32, warps = blockDim.x / 32;
        for (int g = threadIdx.x / 32; g * group < cols; g += warps) {
            int c0 = g * group, c1 = min(c0 + group, cols);
            float amax = 0.0f;
            for (int c = c0 + lane; c < c1; c += 32) amax = fmaxf(amax, fabsf(ld(row, c)));
            float s = group_scale(warp_max(amax), mode);
            for (int c = c0 + lane; c < c1; c += 32) {
                // A zero scale (mode 4's zero group, or an amax that underflows) codes zeros,
                // as the fake quantizer's values are then.
                float y = s == 0.0f ? 0.0f : fminf(fmaxf(__fdiv_rn(ld(row, c), s), -448.0f), 448.0f);
                crow[c] = fp8_e4m3_bits(round_fp8_e4m3(y));
            }
            if (lane == 0) scales[(long long)g * gridDim.x + blockIdx.x] = s;
        }
        return;
    }
    float s = row_scale(row, cols, mode, param);
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        float q = quantized(ld(row, c), s, mode, param);
        crow[c] = mode == 2 ? (unsigned char)(signed char)(int)q : fp8_e4m3_bits(q);
    }
    if (threadIdx.x == 0) scales[blockIdx.x] = s;
}

// act_quant_<in>_<out>.
#define ACT_QUANT_ENTRY(IN, TIN, OUT, TOUT)                                                    \
    extern "C" __global__ void act_quant_##IN##_##OUT(TOUT* out, const TIN* x, int cols,       \
                                                      int mode, float param) {                 \
        act_quant_row(out, x, cols, mode, param);                                              \
    }

ACT_QUANT_ENTRY(bf16, bf16_t, bf16, bf16_t)
ACT_QUANT_ENTRY(bf16, bf16_t, f32, float)
ACT_QUANT_ENTRY(f32, float, bf16, bf16_t)
ACT_QUANT_ENTRY(f32, float, f32, float)

// act_codes_<in>.
#define ACT_CODES_ENTRY(IN, TIN)                                                               \
    extern "C" __global__ void act_codes_##IN(unsigned char* codes, float* scales, const TIN* x, \
                                             int rows, int cols, int mode, float param) {      \
        act_codes_row(codes, scales, x, rows, cols, mode, param);                              \
    }

ACT_CODES_ENTRY(bf16, bf16_t)
ACT_CODES_ENTRY(f32, float)
