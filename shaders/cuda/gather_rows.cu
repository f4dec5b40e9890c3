// out[i, :] = table[ids[i], :]: the token embedding that starts the f32 residual stream, and
// the scored rows of the final hidden states before the lm_head (activation type). Ids are
// checked on the host.
template <typename Ti, typename To>
__device__ void gather(To* out, const Ti* table, const u32* ids, int n_ids, int cols) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long long)n_ids * cols) return;
    long long r = i / cols;
    st(out, i, ld(table, (long long)ids[r] * cols + i % cols));
}

extern "C" __global__ void gather_rows_bf16(bf16_t* out, const bf16_t* table, const u32* ids,
                                            int n_ids, int cols) {
    gather(out, table, ids, n_ids, cols);
}

extern "C" __global__ void gather_rows_bf16_f32(float* out, const bf16_t* table, const u32* ids,
                                                int n_ids, int cols) {
    gather(out, table, ids, n_ids, cols);
}

extern "C" __global__ void gather_rows_f32(float* out, const float* table, const u32* ids,
                                           int n_ids, int cols) {
    gather(out, table, ids, n_ids, cols);
}
