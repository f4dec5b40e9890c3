// out[i, :] = table[ids[i], :] for bf16 rows: the token embedding, and the scored rows of the
// final hidden states before the lm_head. Ids are checked on the host.
extern "C" __global__ void gather_rows(bf16_t* out, const bf16_t* table, const u32* ids,
                                       int n_ids, int cols) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long long)n_ids * cols) return;
    long long r = i / cols;
    out[i] = table[(long long)ids[r] * cols + i % cols];
}
