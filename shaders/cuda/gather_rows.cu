// out[i, :] = table[ids[i], :] for bf16 rows: the scored rows of the final hidden states
// before the lm_head (bf16 out), and the token embedding that starts the f32 residual stream
// (f32 out). Ids are checked on the host.
extern "C" __global__ void gather_rows(bf16_t* out, const bf16_t* table, const u32* ids,
                                       int n_ids, int cols) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long long)n_ids * cols) return;
    long long r = i / cols;
    out[i] = table[(long long)ids[r] * cols + i % cols];
}

extern "C" __global__ void gather_rows_f32(float* out, const bf16_t* table, const u32* ids,
                                           int n_ids, int cols) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long long)n_ids * cols) return;
    long long r = i / cols;
    out[i] = bf16_to_f32(table[(long long)ids[r] * cols + i % cols]);
}
