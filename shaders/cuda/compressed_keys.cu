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

// GLM-5.3-Flash's pooled sparse attention (`EntryKeys::Pools`, the same reference): each
// query's key list, `width` f32 positions a row, then -1s: the tokens of the indexer's picked
// pools (`picks` `[tokens, top_k]`, pool positions ascending then -1s; pool e is tokens
// e * size ..), then where `tail` those after its last whole pool up to itself. A thread a
// place.
extern "C" __global__ void pooled_keys(float* lists, const u32* seq_start, const float* picks,
                                       long long tokens, int width, int size, int top_k,
                                       int tail) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= tokens * width) return;
    long long r = i / width;
    int slot = (int)(i % width);
    int p = (int)(r - seq_start[r]);
    // The picks are a prefix of the row: the first -1 by bisection.
    const float* row = picks + r * top_k;
    int lo = 0, hi = top_k;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (row[mid] >= 0.0f) lo = mid + 1;
        else hi = mid;
    }
    float key = -1.0f;
    if (slot < lo * size) {
        key = (float)((long long)row[slot / size] * size + slot % size);
    } else if (tail) {
        int j = slot - lo * size, whole = (p + 1) / size * size;
        if (whole + j <= p) key = (float)(whole + j);
    }
    lists[i] = key;
}
