// DeepSeek sparse attention's lightning indexer, after its products, in two kernels.
// index_scores: for query row t (rows row0 .. row0 + gridDim.y; a thread a key) and its
// sequence's keys up to itself (with `rate` > 1 the keys j < (position + 1) / rate:
// DeepSeek-V4's compressed entries, key j at row start + j),
//   s_j = sum_h w[t, h] * weight_scale * max(scale * p[t, h, j], 0)
// where p holds q[t, h] . k[j] (f32 from cuBLAS, rows (row, h) `stride` apart), written to the
// row's scratch row (`max_len` u32 a row) as an order-preserving u32 key (common.cuh's
// order_key; index_scores_mma.cu computes the same on the tensor cores without the products). index_select (a block
// of IX_THREADS a row): the positions of the row's top_k best keys, ascending, a higher score
// first and at equal scores the earlier key (every key where it has no more than top_k: its
// scratch row is then not read), the row's rest -1; the top_k-th best found by a radix select
// (four 8-bit digits, most significant first), the selected keys written in order by a block
// prefix sum per chunk of IX_THREADS.
#define IX_THREADS 256

// Exclusive prefix sum of v over the block, and the block's total in *total.
__device__ u32 block_exclusive_sum(u32 v, u32* total) {
    __shared__ u32 warp_tot[IX_THREADS / 32];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    u32 inc = v;
    for (int o = 1; o < 32; o <<= 1) {
        u32 n = __shfl_up_sync(0xffffffffu, inc, o);
        if (lane >= o) inc += n;
    }
    if (lane == 31) warp_tot[warp] = inc;
    __syncthreads();
    u32 before = 0, all = 0;
    for (int w = 0; w < IX_THREADS / 32; ++w) {
        if (w < warp) before += warp_tot[w];
        all += warp_tot[w];
    }
    __syncthreads();
    *total = all;
    return before + inc - v;
}

template <typename T>
__device__ void index_scores_t(u32* scratch, const float* p, const T* w, const u32* seq_start,
                               int heads, float scale, float weight_scale, int row0,
                               long long stride, int max_len, int rate) {
    long long t = row0 + blockIdx.y;
    int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= (int)((t - seq_start[t] + 1) / rate)) return;
    const float* rows = p + (long long)blockIdx.y * heads * stride;
    float s = 0.0f;
    for (int h = 0; h < heads; ++h)
        s += ld(w, t * heads + h) * weight_scale * fmaxf(rows[h * stride + j] * scale, 0.0f);
    scratch[(long long)blockIdx.y * max_len + j] = order_key(s);
}

extern "C" __global__ void index_select(float* out, const u32* scratch, const u32* seq_start,
                                        int top_k, int row0, int max_len, int rate) {
    __shared__ u32 hist[256];
    __shared__ u32 pick[2];
    long long t = row0 + blockIdx.x;
    int count = (int)((t - seq_start[t] + 1) / rate);
    long long o = t * top_k;
    if (count <= top_k) {
        for (int j = threadIdx.x; j < top_k; j += blockDim.x) out[o + j] = j < count ? j : -1.0f;
        return;
    }
    const u32* keys = scratch + (long long)blockIdx.x * max_len;
    // The top_k-th largest key, digit by digit: `prefix` its digits so far, `need` how many
    // keys still to take among those matching them.
    u32 prefix = 0, need = top_k;
    for (int shift = 24; shift >= 0; shift -= 8) {
        hist[threadIdx.x] = 0;
        __syncthreads();
        u32 high = shift == 24 ? 0u : (0xFFFFFFFFu << (shift + 8));
        for (int j = threadIdx.x; j < count; j += blockDim.x) {
            u32 key = keys[j];
            if ((key & high) == prefix) atomicAdd(&hist[(key >> shift) & 255u], 1u);
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            u32 above = 0, digit = 255;
            while (digit > 0 && above + hist[digit] < need) above += hist[digit--];
            pick[0] = prefix | (digit << shift);
            pick[1] = need - above;
        }
        __syncthreads();
        prefix = pick[0];
        need = pick[1];
        __syncthreads();
    }
    // Keys above the threshold, and the first `need` equal to it, in order.
    u32 taken = 0, ties = 0;
    for (int c = 0; c < count; c += blockDim.x) {
        int j = c + threadIdx.x;
        u32 key = j < count ? keys[j] : 0u;
        u32 equal = j < count && key == prefix, n_equal, n_keep;
        u32 tie_rank = ties + block_exclusive_sum(equal, &n_equal);
        u32 keep = j < count && (key > prefix || (equal && tie_rank < need));
        u32 at = taken + block_exclusive_sum(keep, &n_keep);
        if (keep) out[o + at] = (float)j;
        taken += n_keep;
        ties += n_equal;
    }
}

#define INDEX_SCORES_ENTRY(IN, TIN)                                                            \
    extern "C" __global__ void index_scores_##IN(                                              \
        u32* scratch, const float* p, const TIN* w, const u32* seq_start, int heads,           \
        float scale, float weight_scale, int row0, long long stride, int max_len, int rate) {  \
        index_scores_t(scratch, p, w, seq_start, heads, scale, weight_scale, row0, stride,     \
                       max_len, rate);                                                         \
    }

INDEX_SCORES_ENTRY(bf16, bf16_t)
INDEX_SCORES_ENTRY(f32, float)
