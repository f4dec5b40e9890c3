// nvrtc: exact
// DeepSeek-V4's compressed attention (`Backend::compressed_keys`, the host reference
// src/backend/compressed.rs `key_lists`): each query's key list, `width` f32 positions a row,
// then -1s: its window of `window` tokens (itself last), then the entries it sees as positions
// `tokens + e`, the indexer's picks (`picks` `[tokens, top_k]`, entry positions then -1s) or,
// where `picks` is null, every entry whose `rate` tokens it has seen. A thread a place.
extern "C" __global__ void compressed_keys(float* lists, const u32* seq_start, const float* picks,
                                           long long tokens, int width, int window, int rate,
                                           int top_k) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= tokens * width) return;
    long long r = i / width;
    int slot = (int)(i % width);
    int p = (int)(r - seq_start[r]);
    int first = max(p + 1 - window, 0), own = p + 1 - first;
    float key = -1.0f;
    if (slot < own) {
        key = (float)(first + slot);
    } else {
        int j = slot - own;
        if (picks) {
            float e = j < top_k ? picks[r * top_k + j] : -1.0f;
            if (e >= 0.0f) key = (float)(tokens + (long long)e);
        } else if (j < (p + 1) / rate) {
            key = (float)(tokens + j);
        }
    }
    lists[i] = key;
}
