// Vocab-tiled log-softmax statistics and rankings (and the NLL from lm_head_lse.cu's
// partials). The lm_head GEMM writes one f32 logits tile [rows, cols] (vocab columns v0 ..
// v0 + cols); these kernels fold it into running per-row state, so the full [rows, vocab]
// logits never exist. One block per row.
//   m: running max (f32, exact), s: sum exp(logit - m) (f64), tgt: the target's logit,
//   arg: first index of the maximum (ties keep the lower index, as the CPU reference).

__device__ void block_argmax(float* v, int* idx) {
    __shared__ float sv[32];
    __shared__ int si[32];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    float bv = *v;
    int bi = *idx;
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (ov > bv || (ov == bv && oi < bi)) { bv = ov; bi = oi; }
    }
    __syncthreads();
    if (lane == 0) { sv[warp] = bv; si[warp] = bi; }
    __syncthreads();
    bv = lane < nw ? sv[lane] : -__int_as_float(0x7f800000);
    bi = lane < nw ? si[lane] : 0x7fffffff;
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (ov > bv || (ov == bv && oi < bi)) { bv = ov; bi = oi; }
    }
    *v = bv;
    *idx = bi;
}

// Each thread folds its values into a running maximum (the first index of it) and a sum of
// exp(v - max) rescaled when the maximum grows, reading the tile once, 16 bytes at a time where
// rows are 16-byte aligned; the block then takes the tile's maximum and adds every thread's
// sum scaled to it, in f64.
__device__ __forceinline__ void lse_fold(float v, int c, float* m, float* s, int* i) {
    if (v > *m) {
        *s = *s * expf(*m - v) + 1.0f;
        *m = v;
        *i = c;
    } else {
        *s += expf(v - *m);
    }
}

extern "C" __global__ void lse_tile(const float* logits, int cols, const int* targets, int v0,
                                    int first, float* m_state, double* s_state,
                                    float* tgt_state, int* arg_state) {
    int row = blockIdx.x;
    const float* x = logits + (long long)row * cols;
    float m = -__int_as_float(0x7f800000), part = 0.0f;
    int mi = 0x7fffffff;
    if ((cols & 3) == 0) {
        const float4* x4 = (const float4*)x;
        for (int c = threadIdx.x; c < cols / 4; c += blockDim.x) {
            float4 v = x4[c];
            lse_fold(v.x, 4 * c, &m, &part, &mi);
            lse_fold(v.y, 4 * c + 1, &m, &part, &mi);
            lse_fold(v.z, 4 * c + 2, &m, &part, &mi);
            lse_fold(v.w, 4 * c + 3, &m, &part, &mi);
        }
    } else {
        for (int c = threadIdx.x; c < cols; c += blockDim.x) lse_fold(x[c], c, &m, &part, &mi);
    }
    float tm = m;
    int ti = mi;
    block_argmax(&tm, &ti);
    // A thread's sum is at least 1 (its maximum's term) unless it had no values (a NaN stays).
    double ts = block_sum_f64(part == 0.0f ? 0.0 : (double)part * exp((double)m - (double)tm));
    if (threadIdx.x != 0) return;
    int t = targets[row] - v0;
    if (t >= 0 && t < cols) tgt_state[row] = x[t];
    if (first) {
        m_state[row] = tm;
        s_state[row] = ts;
        arg_state[row] = v0 + ti;
    } else {
        float m0 = m_state[row];
        if (tm > m0) {
            s_state[row] = s_state[row] * exp((double)m0 - (double)tm) + ts;
            m_state[row] = tm;
            arg_state[row] = v0 + ti;
        } else {
            s_state[row] += ts * exp((double)tm - (double)m0);
        }
    }
}

// NLL = logsumexp - target logit, in f64, returned as f32 (the only thing copied back).
extern "C" __global__ void nll_finish(float* out, const float* m_state, const double* s_state,
                                      const float* tgt_state, int rows) {
    int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r < rows) out[r] = (float)((double)m_state[r] + log(s_state[r]) - (double)tgt_state[r]);
}

// NLL from the lm_head_lse kernel's partials (`slices` (max, sum of exp(logit - max)) pairs a
// row) and the target's logit: the row's largest max M, then log-sum-exp = M + log(sum of
// s * exp(m - M)) in f64, minus the target's logit. A warp a row, 8 rows a block.
extern "C" __global__ void nll_from_slices(float* out, const float2* partials,
                                           const float* target_logits, int rows, int slices) {
    int row = blockIdx.x * 8 + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= rows) return;  // a whole warp
    const float2* p = partials + (long long)row * slices;
    float m = -__int_as_float(0x7f800000);
    for (int i = lane; i < slices; i += 32) m = fmaxf(m, p[i].x);
    m = warp_max(m);
    double s = 0.0;
    for (int i = lane; i < slices; i += 32) {
        float2 v = p[i];
        // A slice's sum is at least 1 (its maximum's term): no empty slices to skip.
        s += (double)v.y * exp((double)v.x - (double)m);
    }
    s = warp_sum_f64(s);
    if (lane == 0) out[row] = (float)((double)m + log(s) - (double)target_logits[row]);
}

// Second pass of the KL divergence: over a tile, sum p (log p - log q) into acc[2 row] and
// q (log q - log p) into acc[2 row + 1], in f64, both log-sum-exps known from the first pass.
extern "C" __global__ void kld_tile(const float* p_logits, const float* q_logits, int cols,
                                    const float* pm, const double* ps, const float* qm,
                                    const double* qs, double* acc) {
    int row = blockIdx.x;
    const float* xp = p_logits + (long long)row * cols;
    const float* xq = q_logits + (long long)row * cols;
    double lse_p = (double)pm[row] + log(ps[row]);
    double lse_q = (double)qm[row] + log(qs[row]);
    double fwd = 0.0, rev = 0.0;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        double lpp = (double)xp[c] - lse_p, lqq = (double)xq[c] - lse_q;
        double p = exp(lpp), q = exp(lqq);
        if (p > 0.0) fwd += p * (lpp - lqq);
        if (q > 0.0) rev += q * (lqq - lpp);
    }
    fwd = block_sum_f64(fwd);
    rev = block_sum_f64(rev);
    if (threadIdx.x == 0) {
        acc[2 * row] += fwd;
        acc[2 * row + 1] += rev;
    }
}

// The k largest logits of each row over the vocab tiles, as a ranking: k (logit, id) pairs a
// row, the larger logit first and the lower id first among equal ones (-inf and id 0x7fffffff
// where fewer were seen; NaNs never ranked). Only a logit that ranks before the row's k-th so
// far can enter: each thread ranks its own such columns (ascending ids: a later equal logit
// never enters), and a tile with none for the whole block (most tiles after the first few)
// leaves the ranking as it was. Otherwise thread 0 adds the ranking so far, then k rounds of
// the block's best head, each round's winner moving to its next.
#define TOP_K_MAX 20

__device__ __forceinline__ bool ranks_before(float v, int i, float w, int j) {
    return v > w || (v == w && i < j);
}

__device__ __forceinline__ void rank_insert(float* tv, int* ti, int k, float v, int i) {
    if (!ranks_before(v, i, tv[k - 1], ti[k - 1])) return;
    int p = k - 1;
    for (; p > 0 && ranks_before(v, i, tv[p - 1], ti[p - 1]); --p) {
        tv[p] = tv[p - 1];
        ti[p] = ti[p - 1];
    }
    tv[p] = v;
    ti[p] = i;
}

extern "C" __global__ void top_tile(const float* logits, int cols, int v0, int k, int first,
                                    float* top_v, int* top_i) {
    const float NEG_INF = -__int_as_float(0x7f800000);
    int row = blockIdx.x;
    const float* x = logits + (long long)row * cols;
    float* rv = top_v + (long long)row * k;
    int* ri = top_i + (long long)row * k;
    float bar_v = first ? NEG_INF : rv[k - 1];
    int bar_i = first ? 0x7fffffff : ri[k - 1];
    float tv[TOP_K_MAX];
    int ti[TOP_K_MAX];
    for (int j = 0; j < k; ++j) {
        tv[j] = NEG_INF;
        ti[j] = 0x7fffffff;
    }
    int entered = 0;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        float v = x[c];
        if (ranks_before(v, v0 + c, bar_v, bar_i)) {
            rank_insert(tv, ti, k, v, v0 + c);
            entered = 1;
        }
    }
    if (!__syncthreads_or(entered)) return;
    if (threadIdx.x == 0 && !first)
        for (int j = 0; j < k; ++j) rank_insert(tv, ti, k, rv[j], ri[j]);
    int h = 0;
    for (int j = 0; j < k; ++j) {
        float bv = h < k ? tv[h] : NEG_INF;
        int bi = h < k ? ti[h] : 0x7fffffff;
        int mine = bi;
        block_argmax(&bv, &bi);
        if (h < k && mine == bi) ++h;
        if (threadIdx.x == 0) {
            rv[j] = bv;
            ri[j] = bi;
        }
    }
}
