// The residual add, the gated MLP's activation (SiLU or GELU-tanh) and column scales: f32 math,
// one rounding per bf16 output. One thread per
// 8 consecutive values (16-byte accesses), the tail of a length that is no multiple of 8
// value by value.

// x += y. The residual stream x is f32 in both activation precisions: it accumulates every
// layer's output, and rounding it to bf16 after each add would be the largest error of a
// bf16 forward against the f32 reference.
template <typename T>
__device__ void add_to(float* x, const T* y, long long n) {
    long long i = 8 * ((long long)blockIdx.x * blockDim.x + threadIdx.x);
    if (i + 8 <= n) {
        float a[8], b[8];
        ld8(x, i, a);
        ld8(y, i, b);
#pragma unroll
        for (int j = 0; j < 8; ++j) a[j] += b[j];
        st8(x, i, a);
    } else {
        for (; i < n; ++i) x[i] += ld(y, i);
    }
}

extern "C" __global__ void add_assign_bf16(float* x, const bf16_t* y, long long n) {
    add_to(x, y, n);
}

extern "C" __global__ void add_assign_f32(float* x, const float* y, long long n) {
    add_to(x, y, n);
}

// Output i, in row i / cols and column i % cols of the output, reads gate and up at
// step * (row * in_stride + column): step 2 with up = gate + 1 reads gpt-oss's interleaved
// gate/up pairs; in_stride 2 * cols with up = gate + cols reads a grouped GEMM's gate and up
// side by side in one row (experts' gate and up as one product); cols = in_stride = n reads
// two tensors of the output's shape.
template <typename Tin, typename Tout>
__device__ void gated_act_t(Tout* out, const Tin* gate, const Tin* up, long long n, int act,
                            int step, float alpha, float limit, long long cols,
                            long long in_stride) {
    long long i = 8 * ((long long)blockIdx.x * blockDim.x + threadIdx.x);
    if (step == 1 && i + 8 <= n && (cols % 8 == 0 || cols == n)) {
        long long at = i / cols * in_stride + i % cols;
        float g[8], u[8];
        ld8(gate, at, g);
        ld8(up, at, u);
#pragma unroll
        for (int j = 0; j < 8; ++j) g[j] = gated_times(g[j], u[j], act, alpha, limit);
        st8(out, i, g);
    } else {
        for (long long end = min(i + 8, n); i < end; ++i) {
            long long at = step * (i / cols * in_stride + i % cols);
            st(out, i, gated_times(ld(gate, at), ld(up, at), act, alpha, limit));
        }
    }
}

// gated_act_<in>_<out>: the output f32 where a linear quantizes it next.
#define GATED_ACT_ENTRY(IN, TIN, OUT, TOUT)                                                    \
    extern "C" __global__ void gated_act_##IN##_##OUT(                                         \
        TOUT* out, const TIN* gate, const TIN* up, long long n, int act, int step, float alpha,  \
        float limit, long long cols, long long in_stride) {                                      \
        gated_act_t(out, gate, up, n, act, step, alpha, limit, cols, in_stride);               \
    }

GATED_ACT_ENTRY(bf16, bf16_t, bf16, bf16_t)
GATED_ACT_ENTRY(bf16, bf16_t, f32, float)
GATED_ACT_ENTRY(f32, float, bf16, bf16_t)
GATED_ACT_ENTRY(f32, float, f32, float)

// x[i] *= s[i % cols] in place: a projection's output scaled column by column (Falcon-H1's muP
// multipliers), rounded once to x's type as the reference's product in the model dtype.
template <typename T>
__device__ void scale_columns_t(T* x, const float* s, long long n, long long cols) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) st(x, i, ld(x, i) * s[i % cols]);
}

extern "C" __global__ void scale_columns_bf16(bf16_t* x, const float* s, long long n,
                                              long long cols) {
    scale_columns_t(x, s, n, cols);
}

extern "C" __global__ void scale_columns_f32(float* x, const float* s, long long n,
                                             long long cols) {
    scale_columns_t(x, s, n, cols);
}

// f32 -> bf16 (round to nearest even): activations handed in as f32 vectors (the generic op
// checks upload them with upload_vector) enter the bf16 ops through this.
extern "C" __global__ void to_bf16(bf16_t* out, const float* x, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = f32_to_bf16(x[i]);
}
