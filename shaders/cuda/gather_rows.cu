// out[i, :] = table[ids[i], :] * scale: the token embedding that starts the f32 residual stream
// (Gemma scales it), and rows picked for experts or for the lm_head (scale 1, exact); times
// row_scales[i] where given (an expert's rows scaled by their routing weights: Llama 4). Ids
// are checked on the host.
// One thread per 8 consecutive values (16-byte accesses) when cols is a multiple of 8 (the
// launcher sizes the grid by `cols % 8`), else one per value.
template <typename Ti, typename To>
__device__ void gather(To* out, const Ti* table, const u32* ids, int n_ids, int cols,
                       float scale, const float* row_scales) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if ((cols & 7) == 0) {
        int chunks = cols >> 3;
        if (i >= (long long)n_ids * chunks) return;
        long long r = i / chunks, c = (i % chunks) << 3;
        float v[8];
        ld8(table, (long long)ids[r] * cols + c, v);
#pragma unroll
        for (int j = 0; j < 8; ++j) v[j] *= scale;
        if (row_scales) {
#pragma unroll
            for (int j = 0; j < 8; ++j) v[j] *= row_scales[r];
        }
        st8(out, r * cols + c, v);
        return;
    }
    if (i >= (long long)n_ids * cols) return;
    long long r = i / cols;
    float v = ld(table, (long long)ids[r] * cols + i % cols) * scale;
    if (row_scales) v *= row_scales[r];
    st(out, i, v);
}

// gather_rows_<table>_<out>.
#define GATHER_ENTRY(IN, TIN, OUT, TOUT)                                                       \
    extern "C" __global__ void gather_rows_##IN##_##OUT(TOUT* out, const TIN* table,           \
                                                        const u32* ids, int n_ids, int cols,   \
                                                        float scale,                           \
                                                        const float* row_scales) {             \
        gather(out, table, ids, n_ids, cols, scale, row_scales);                               \
    }

GATHER_ENTRY(bf16, bf16_t, bf16, bf16_t)
GATHER_ENTRY(bf16, bf16_t, f32, float)
GATHER_ENTRY(f32, float, bf16, bf16_t)
GATHER_ENTRY(f32, float, f32, float)
