// out[r, to + b * to_stride + j] = src[r, from + b * from_stride + j] for every row r, block
// b < blocks and j < width, converted to the output type: latent attention's cuts of its
// latent, its keys assembled from per-head and shared parts, its values padded to the key
// width and cut back. The output is zeroed before (copy_columns.rs); one thread per value.
template <typename Ti, typename To>
__device__ void copy_columns(To* out, const Ti* src, int rows, int src_cols, int out_cols,
                             int blocks, int width, int from, int from_stride, int to,
                             int to_stride) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    long long per_row = (long long)blocks * width;
    if (i >= (long long)rows * per_row) return;
    long long r = i / per_row;
    int k = (int)(i % per_row), b = k / width, j = k % width;
    st(out, r * out_cols + to + (long long)b * to_stride + j,
       ld(src, r * src_cols + from + (long long)b * from_stride + j));
}

// copy_columns_<in>_<out>.
#define COPY_ENTRY(IN, TIN, OUT, TOUT)                                                         \
    extern "C" __global__ void copy_columns_##IN##_##OUT(                                      \
        TOUT* out, const TIN* src, int rows, int src_cols, int out_cols, int blocks,           \
        int width, int from, int from_stride, int to, int to_stride) {                         \
        copy_columns(out, src, rows, src_cols, out_cols, blocks, width, from, from_stride, to, \
                     to_stride);                                                               \
    }

COPY_ENTRY(bf16, bf16_t, bf16, bf16_t)
COPY_ENTRY(bf16, bf16_t, f32, float)
COPY_ENTRY(f32, float, bf16, bf16_t)
COPY_ENTRY(f32, float, f32, float)
