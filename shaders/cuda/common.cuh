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

__device__ __forceinline__ float round_f16(float f) {
    unsigned short h;
    float r;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    asm("cvt.f32.f16 %0, %1;" : "=f"(r) : "h"(h));
    return r;
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

__device__ double block_sum_f64(double v) {
    __shared__ double part_d[32];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    __syncthreads();
    if (lane == 0) part_d[warp] = v;
    __syncthreads();
    double t = lane < nw ? part_d[lane] : 0.0;
    for (int o = 16; o > 0; o >>= 1) t += __shfl_xor_sync(0xffffffffu, t, o);
    return t;
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
