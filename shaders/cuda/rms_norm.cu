// y = weight * (x * rsqrt(mean(x^2) + eps)), one block per row, the sum of squares in f64 (as
// the CPU reference). Input: the f32 residual stream or a q/k activation; output: the
// activation type, or f32 where a linear quantizes it next (Backend::input_type). The `add_`
// entry points first apply the residual update x += y (f32 math, x written back) and normalize
// the sum in the same pass: the residual add and the next layer norm read the residual row
// once instead of three times.
//
// Rows whose length is a multiple of 8 and at most 8 * RN_CHUNKS values a thread (the launcher
// picks blockDim.x from the row length) stay in registers between the sum of squares and the
// scaling, with every access 16 bytes wide; other rows are walked value by value. Rows of at
// most 8 * RN_CHUNKS * 32 values (the q/k norms' heads) take a warp each, blockDim.x / 32 of
// them a block: a block a row left most of its one warp idle on rows of 128.
//
// The `planes` entries write an f32 output as three bf16 planes that sum to it exactly
// (`Planes`): what a mixture's router multiplies on the bf16 tensor cores f32-exactly, and whose
// first plane (the output rounded to bf16) its experts read. Written here, the f32 output is
// neither stored nor read back to be split (8 bytes a value fewer).
#define RN_CHUNKS 4
#define RN_WARP_COLS (8 * RN_CHUNKS * 32)

// An output row as three planes: `hi` = bf16(v) at its index, then in `rest` (two planes of
// `plane` values, in order) mid and lo (`split3`).
struct Planes {
    bf16_t* hi;
    bf16_t* rest;
    long long plane;
    __device__ Planes operator+(long long i) const { return {hi + i, rest + i, plane}; }
};

__device__ __forceinline__ void st(Planes p, long long i, float v) {
    float hi, mid, lo;
    split3(v, hi, mid, lo);
    st(p.hi, i, hi);
    st(p.rest, i, mid);
    st(p.rest + p.plane, i, lo);
}

__device__ __forceinline__ void st8(Planes p, long long i, const float* v) {
    float hi[8], mid[8], lo[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) split3(v[j], hi[j], mid[j], lo[j]);
    st8(p.hi, i, hi);
    st8(p.rest, i, mid);
    st8(p.rest + p.plane, i, lo);
}

template <bool ADD, typename Tx, typename Ty, typename To>
__device__ void rms_norm_row(To out, Tx* x, const Ty* y, const float* weight, int rows,
                             int cols, float eps) {
    bool by_warp = cols <= RN_WARP_COLS;
    int lane = by_warp ? (threadIdx.x & 31) : threadIdx.x;
    int lanes = by_warp ? 32 : blockDim.x;
    long long r = by_warp ? (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5)
                          : (long long)blockIdx.x;
    if (r >= rows) return;  // a whole warp, and only in by_warp blocks (no block barrier there)
    long long base = r * cols;
    Tx* row = x + base;
    To orow = out + base;
    bool vec = (cols & 7) == 0 && cols <= 8 * RN_CHUNKS * lanes;
    double ss = 0.0;
    float v[RN_CHUNKS][8];
    if (vec) {
#pragma unroll
        for (int ch = 0; ch < RN_CHUNKS; ++ch) {
            int c = 8 * (lane + ch * lanes);
            if (c >= cols) continue;
            ld8(row, c, v[ch]);
            if constexpr (ADD) {
                float a[8];
                ld8(y + base, c, a);
#pragma unroll
                for (int j = 0; j < 8; ++j) v[ch][j] += a[j];
                st8(row, c, v[ch]);
            }
#pragma unroll
            for (int j = 0; j < 8; ++j) ss += (double)v[ch][j] * v[ch][j];
        }
    } else {
        for (int c = lane; c < cols; c += lanes) {
            float s = ld(row, c);
            if constexpr (ADD) {
                s += ld(y + base, c);
                st(row, c, s);
            }
            ss += (double)s * s;
        }
    }
    ss = by_warp ? warp_sum_f64(ss) : block_sum_f64(ss);
    float inv = 1.0f / sqrtf((float)(ss / (double)cols) + eps);
    if (vec) {
#pragma unroll
        for (int ch = 0; ch < RN_CHUNKS; ++ch) {
            int c = 8 * (lane + ch * lanes);
            if (c >= cols) continue;
            float w[8];
            ld8(weight, c, w);
#pragma unroll
            for (int j = 0; j < 8; ++j) v[ch][j] = w[j] * (v[ch][j] * inv);
            st8(orow, c, v[ch]);
        }
    } else {
        // Each thread reads back only the values it wrote itself.
        for (int c = lane; c < cols; c += lanes)
            st(orow, c, weight[c] * (ld(row, c) * inv));
    }
}

// Entry points `rms_norm_<in>_<out>` and `add_rms_norm_<in>_<out>`: <in> is the type of x
// (plain) or of the update y (add; x is then the f32 residual stream), <out> the output's.
#define RMS_NORM_ENTRIES(IN, TIN, OUT, TOUT)                                                 \
    extern "C" __global__ void rms_norm_##IN##_##OUT(TOUT* out, const TIN* x,                \
                                                     const float* weight, int rows, int cols, \
                                                     float eps) {                            \
        rms_norm_row<false>(out, x, (const float*)0, weight, rows, cols, eps);               \
    }                                                                                        \
    extern "C" __global__ void add_rms_norm_##IN##_##OUT(TOUT* out, float* x, const TIN* y,  \
                                                         const float* weight, int rows,      \
                                                         int cols, float eps) {              \
        rms_norm_row<true>(out, x, y, weight, rows, cols, eps);                              \
    }

RMS_NORM_ENTRIES(bf16, bf16_t, bf16, bf16_t)
RMS_NORM_ENTRIES(bf16, bf16_t, f32, float)
RMS_NORM_ENTRIES(f32, float, bf16, bf16_t)
RMS_NORM_ENTRIES(f32, float, f32, float)

// Entry points `rms_norm_planes_<in>` and `add_rms_norm_planes_<in>`: the output as `Planes`,
// its first plane at `hi`, the other two at `rest`.
#define RMS_NORM_PLANES_ENTRIES(IN, TIN)                                                     \
    extern "C" __global__ void rms_norm_planes_##IN(bf16_t* hi, bf16_t* rest,             \
                                                      const TIN* x, const float* weight,    \
                                                      int rows, int cols, float eps) {      \
        Planes out = {hi, rest, (long long)rows * cols};                                     \
        rms_norm_row<false>(out, x, (const float*)0, weight, rows, cols, eps);               \
    }                                                                                        \
    extern "C" __global__ void add_rms_norm_planes_##IN(bf16_t* hi, bf16_t* rest, float* x, \
                                                          const TIN* y, const float* weight, \
                                                          int rows, int cols, float eps) {   \
        Planes out = {hi, rest, (long long)rows * cols};                                     \
        rms_norm_row<true>(out, x, y, weight, rows, cols, eps);                              \
    }

RMS_NORM_PLANES_ENTRIES(bf16, bf16_t)
RMS_NORM_PLANES_ENTRIES(f32, float)
