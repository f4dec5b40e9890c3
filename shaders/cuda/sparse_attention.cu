// DeepSeek sparse attention's selection as the attention kernels read it: row t of `keys`
// (`n` positions in its sequence, ascending, then -1s; `Backend::index_top_k`) set as bits of
// `mask` (`words` u32 a row, zeroed before: bit p of a row is position p). Over expanded heads
// the attention itself is dense attention with the unselected keys masked (attention.cu,
// flash_attention.cu, flash_attention_sm90.cu): a tile of queries reads each key once, which
// costs less than gathering each query's keys for each head; over latent attention's one key
// head (long windows) each query gathers its keys instead (listed_attention.cu).
extern "C" __global__ void select_mask(u32* mask, const float* keys, long long total, int n,
                                       int words) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total) return;
    float p = keys[i];
    if (p < 0.0f) return;
    int pos = (int)p;
    long long row = i / n;
    atomicOr(&mask[row * words + (pos >> 5)], 1u << (pos & 31));
}
