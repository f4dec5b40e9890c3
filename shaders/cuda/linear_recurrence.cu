// The recurrent layers' gated linear recurrence (src/backend/recurrent.rs says what it
// computes): gated DeltaNet's delta rule, or with SSD Mamba-2's scan (the same update without
// the delta correction, no normalization, dt as the update strength, D's skip), in two forms.
//
// The chunked form (key heads up to RK wide; `delta_rule_chunked`): the tokens of each
// sequence in chunks of RC. `recurrence_chunk_prepare` works on every (chunk, value head) at
// once: the decays summed within the chunk, the within-chunk products P = (Q K^T) * decay and,
// for the delta rule, the unit lower-triangular system (I + A) [U | W] = beta [V | exp(c) K]
// solved by forward substitution (one column a thread); Mamba-2's U is dt V. Then
// `recurrence_chunk_scan` walks each sequence's chunks in order, a block per (sequence, value
// head, RV columns) holding those columns of the f32 state: new values V' = U - W S, outputs
// O = exp(c) Q S + P V' (+ D x), state S = exp(c_last) S + (exp(c_last - c) K)^T V'. Every
// product is an f32 FMA over register tiles (4 x 4 outputs a thread, float4 reads of shared
// tiles), the same arithmetic in every precision mode.
//
// The step-by-step form (any key width up to DR_MAX_DK): a block of DR_COLS threads per
// (sequence, value head, DR_COLS columns of the value head), each thread one column S[:, j]
// of the f32 state. Blocks are launched for every token and return unless theirs starts a
// sequence. Each step stages the token's query and key in shared memory (L2-normed there by a
// block reduction for the delta rule) while the next token's inputs are already being loaded
// into registers; with the key width known at compile time (DK, 128 in Qwen3.5 and the
// Mamba-2 hybrids) the state column lives in registers.

// Where a token's query, key and value heads sit in its qkv row: the delta rule's [q | k | v],
// Mamba-2's [x (v) | B (k) | C (q)].
struct QkvRow {
    long long width, q_at, k_at, v_at;
    __device__ QkvRow(bool ssd, int k_heads, int v_heads, int dk, int dv, int kh, int h) {
        long long kw = (long long)k_heads * dk, vw = (long long)v_heads * dv;
        width = 2 * kw + vw;
        q_at = (ssd ? vw + kw : 0) + (long long)kh * dk;
        k_at = (ssd ? vw : kw) + (long long)kh * dk;
        v_at = (ssd ? 0 : 2 * kw) + (long long)h * dv;
    }
};

// A token's log decay g and update strength beta (recurrent.rs `gates`, `ssd_gates`) from its
// inputs a (and the delta rule's b), the head's rate -exp(A_log) and dt_bias.
template <bool SSD>
__device__ __forceinline__ void token_gates(float a, float b, float rate, float bias, float dt_min,
                                            float dt_max, float& g, float& beta) {
    float x = a + bias;
    float sp = x > 20.0f ? x : log1pf(expf(x));
    if (SSD) {
        sp = fminf(fmaxf(sp, dt_min), dt_max);
        beta = sp;
    } else {
        beta = 1.0f / (1.0f + expf(-b));
    }
    g = rate * sp;
}

#define DR_COLS 64
#define DR_MAX_DK 256
// Query/key values a thread stages: DR_MAX_DK / DR_COLS.
#define DR_PER (DR_MAX_DK / DR_COLS)

// `b` is the delta rule's beta input per token, `d` Mamba-2's skip per head; the other is null.
template <typename Tin, typename Tout, int DK, bool SSD>
__device__ void linear_recurrence_t(Tout* out, const Tin* qkv, const Tin* a, const Tin* b,
                                    const float* d, const float* a_log, const float* dt_bias,
                                    const u32* seq_start, int tokens, int k_heads, int v_heads,
                                    int dk_arg, int dv, float dt_min, float dt_max) {
    __shared__ float sq[DR_MAX_DK], sk[DR_MAX_DK], red[2][DR_COLS / 32];
    const int dk = DK > 0 ? DK : dk_arg;
    int t0 = blockIdx.x, h = blockIdx.y, lid = threadIdx.x, j = blockIdx.z * DR_COLS + lid;
    if ((int)seq_start[t0] != t0) return;
    const QkvRow row(SSD, k_heads, v_heads, dk, dv, h / (v_heads / k_heads), h);
    const long long width = row.width, vw = (long long)v_heads * dv;
    float s[DK > 0 ? DK : DR_MAX_DK];
#pragma unroll
    for (int i = 0; i < (DK > 0 ? DK : DR_MAX_DK); ++i) s[i] = 0.0f;
    const float scale = rsqrtf((float)dk), rate = -expf(a_log[h]), bias = dt_bias[h];
    const float skip = SSD ? d[h] : 0.0f;
    // The next token's inputs, in registers.
    float nq[DR_PER], nk[DR_PER], nv = 0.0f, na = 0.0f, nb = 0.0f;
    auto load = [&](int t) {
#pragma unroll
        for (int e = 0; e < DR_PER; ++e) {
            int i = lid + e * DR_COLS;
            nq[e] = i < dk ? ld(qkv, t * width + row.q_at + i) : 0.0f;
            nk[e] = i < dk ? ld(qkv, t * width + row.k_at + i) : 0.0f;
        }
        nv = j < dv ? ld(qkv, t * width + row.v_at + j) : 0.0f;
        na = ld(a, (long long)t * v_heads + h);
        if (!SSD) nb = ld(b, (long long)t * v_heads + h);
    };
    if (t0 < tokens) load(t0);
    for (int t = t0; t < tokens && (int)seq_start[t] == t0; ++t) {
        float qs = 0.0f, ks = 0.0f;
        __syncthreads();
#pragma unroll
        for (int e = 0; e < DR_PER; ++e) {
            int i = lid + e * DR_COLS;
            if (i < dk) {
                sq[i] = nq[e];
                sk[i] = nk[e];
            }
            qs += nq[e] * nq[e];
            ks += nk[e] * nk[e];
        }
        if (!SSD) {
            for (int o = 16; o > 0; o >>= 1) {
                qs += __shfl_xor_sync(0xffffffffu, qs, o);
                ks += __shfl_xor_sync(0xffffffffu, ks, o);
            }
            if (lid % 32 == 0) {
                red[0][lid / 32] = qs;
                red[1][lid / 32] = ks;
            }
        }
        float v = nv, g, beta;
        token_gates<SSD>(na, nb, rate, bias, dt_min, dt_max, g, beta);
        __syncthreads();
        // The step below hides these loads' latency.
        if (t + 1 < tokens && (int)seq_start[t + 1] == t0) load(t + 1);
        float qinv = 1.0f, kinv = 1.0f;
        if (!SSD) {
            qs = red[0][0] + red[0][1];
            ks = red[1][0] + red[1][1];
            qinv = rsqrtf(qs + 1e-6f) * scale;
            kinv = rsqrtf(ks + 1e-6f);
        }
        float decay = expf(g);
        if (j < dv) {
            float remembered = 0.0f;
#pragma unroll
            for (int i = 0; i < (DK > 0 ? DK : DR_MAX_DK); ++i) {
                if (DK == 0 && i >= dk) break;
                s[i] *= decay;
                if (!SSD) remembered += s[i] * sk[i];
            }
            float delta = (v - remembered * kinv) * beta;
            float o = 0.0f, kd = kinv * delta;
#pragma unroll
            for (int i = 0; i < (DK > 0 ? DK : DR_MAX_DK); ++i) {
                if (DK == 0 && i >= dk) break;
                s[i] += sk[i] * kd;
                o += s[i] * sq[i];
            }
            st(out, t * vw + (long long)h * dv + j, o * qinv + skip * v);
        }
    }
}


#define RC 64          // tokens a chunk (recurrent.rs CHUNK)
#define RK 128         // the widest key head the chunked kernels hold, zero padded
#define RS (RK + 4)    // row stride of [RC][RK] tiles: float4 reads of 8 rows in distinct banks
#define RCS (RC + 4)   // row stride of [RC][RC] tiles
#define RV 32          // value columns a scan block
#define PREP_THREADS 256
#define SCAN_THREADS 128

__device__ __forceinline__ float4 ld4(const float* p) { return *(const float4*)p; }
__device__ __forceinline__ float dot4(float4 a, float4 b) {
    return a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w;
}

// acc[m][n] += sum_p A[r_m][p] B[p][c + n] over p < n_p (a multiple of 4): rows r_m = r0 + 16 m
// of a row-major tile A (stride sa), four columns from c of a row-major tile B (stride sb).
template <int M>
__device__ __forceinline__ void tile_product(float (&acc)[M][4], const float* A, int sa, int r0,
                                             const float* B, int sb, int c, int n_p) {
    for (int p = 0; p < n_p; p += 4) {
        float4 b0 = ld4(B + (p + 0) * sb + c), b1 = ld4(B + (p + 1) * sb + c);
        float4 b2 = ld4(B + (p + 2) * sb + c), b3 = ld4(B + (p + 3) * sb + c);
#pragma unroll
        for (int m = 0; m < M; ++m) {
            float4 a = ld4(A + (r0 + 16 * m) * sa + p);
            acc[m][0] += a.x * b0.x + a.y * b1.x + a.z * b2.x + a.w * b3.x;
            acc[m][1] += a.x * b0.y + a.y * b1.y + a.z * b2.y + a.w * b3.y;
            acc[m][2] += a.x * b0.z + a.y * b1.z + a.z * b2.z + a.w * b3.z;
            acc[m][3] += a.x * b0.w + a.y * b1.w + a.z * b2.w + a.w * b3.w;
        }
    }
}

// One chunk's query or key rows (of the key head at `at` in each qkv row) into tile[RC][RS],
// zeros past its `len` tokens and the head's `dk`; for the delta rule each row L2-normed
// (rsqrt(sum x^2 + 1e-6), as the step kernel), times `scale`, and times factor[i] where given.
// Each warp reads whole rows (four values a lane), all of a thread's loads issued before any
// is used. The caller synchronizes before and after.
template <int THREADS, typename Tin>
__device__ void load_rows(float* tile, const Tin* qkv, long long width, long long at, int t0,
                          int len, int dk, bool norm, float scale, const float* factor) {
    constexpr int WARPS = THREADS / 32, R = RC / WARPS;
    const int warp = threadIdx.x / 32, p = (threadIdx.x % 32) * 4;
    float v[R][4];
#pragma unroll
    for (int r = 0; r < R; ++r) {
        const int i = warp + WARPS * r;
#pragma unroll
        for (int e = 0; e < 4; ++e)
            v[r][e] = i < len && p + e < dk ? ld(qkv, (long long)(t0 + i) * width + at + p + e)
                                            : 0.0f;
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {
        const int i = warp + WARPS * r;
        float f = scale;
        if (norm) {
            float ss = v[r][0] * v[r][0] + v[r][1] * v[r][1] + v[r][2] * v[r][2] + v[r][3] * v[r][3];
            for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
            f *= rsqrtf(ss + 1e-6f);
        }
        if (factor) f *= factor[i];
        *(float4*)(tile + i * RS + p) = make_float4(v[r][0] * f, v[r][1] * f, v[r][2] * f, v[r][3] * f);
    }
}

// ROWS rows of COLS floats from `src` (row r at src + r * stride; 16-byte aligned, columns
// past `cols` padding that holds zeros) into dst (row stride ds), zeros from row `len` on; all
// of a thread's float4 loads issued before any is stored.
template <int ROWS, int COLS, int THREADS>
__device__ void load_tile(float* dst, int ds, const float* src, long long stride, int len,
                          int cols) {
    constexpr int C4 = COLS / 4, N = ROWS * C4 / THREADS;
    float4 v[N];
#pragma unroll
    for (int n = 0; n < N; ++n) {
        const int e = threadIdx.x + n * THREADS, r = e / C4, c = (e % C4) * 4;
        v[n] = r < len && c < cols ? ld4(src + r * stride + c) : make_float4(0.f, 0.f, 0.f, 0.f);
    }
#pragma unroll
    for (int n = 0; n < N; ++n) {
        const int e = threadIdx.x + n * THREADS;
        *(float4*)(dst + (e / C4) * ds + (e % C4) * 4) = v[n];
    }
}

// The chunk's gates into beta[] and its decays summed from the chunk's start into cum[]
// (zeros past `len`).
template <typename Tin, bool SSD>
__device__ void chunk_gates(float* cum, float* beta, const Tin* a, const Tin* b, int t0, int len,
                            int h, int v_heads, float rate, float bias, float dt_min,
                            float dt_max) {
    int i = threadIdx.x;
    if (i < RC) {
        float g = 0.0f, bt = 0.0f;
        if (i < len) {
            long long at = (long long)(t0 + i) * v_heads + h;
            token_gates<SSD>(ld(a, at), SSD ? 0.0f : ld(b, at), rate, bias, dt_min, dt_max, g, bt);
        }
        cum[i] = g;
        beta[i] = bt;
    }
    __syncthreads();
    if (i == 0)
        for (int r = 1; r < RC; ++r) cum[r] += cum[r - 1];
}

// Per (chunk, value head): P [t, v_heads, RC] (row i's products with the chunk's tokens),
// U [t, v_heads, dv4], for the delta rule W [t, v_heads, dk4] (each row padded with zeros to a
// multiple of 4), and cum [t, v_heads]. Chunk c is tokens chunks[c]..chunks[c + 1].
template <typename Tin, bool SSD>
__device__ void chunk_prepare_t(float* P, float* U, float* W, float* cum_out, const Tin* qkv,
                                const Tin* a, const Tin* b, const float* a_log,
                                const float* dt_bias, const u32* chunks, int k_heads, int v_heads,
                                int dk, int dv, float dt_min, float dt_max) {
    extern __shared__ float4 smem4[];
    float* sq = (float*)smem4;  // [RC][RS] queries
    float* sk = sq + RC * RS;   // [RC][RS] keys
    float* sa = sk + RC * RS;   // [RC][RCS] the delta rule's A
    __shared__ float cum[RC], beta[RC];
    const int h = blockIdx.y, tid = threadIdx.x, t0 = chunks[blockIdx.x];
    const int len = chunks[blockIdx.x + 1] - t0;
    const int dk4 = (dk + 3) & ~3, dv4 = (dv + 3) & ~3;
    const QkvRow row(SSD, k_heads, v_heads, dk, dv, h / (v_heads / k_heads), h);
    load_rows<PREP_THREADS>(sq, qkv, row.width, row.q_at, t0, len, dk, !SSD,
                            SSD ? 1.0f : rsqrtf((float)dk), nullptr);
    load_rows<PREP_THREADS>(sk, qkv, row.width, row.k_at, t0, len, dk, !SSD, 1.0f, nullptr);
    chunk_gates<Tin, SSD>(cum, beta, a, b, t0, len, h, v_heads, -expf(a_log[h]), dt_bias[h],
                          dt_min, dt_max);
    __syncthreads();
    // Q K^T and (delta rule) K K^T: rows ti + 16 m, columns tj + 16 n.
    const int ti = tid / 16, tj = tid % 16;
    float qk[4][4] = {}, kk[4][4] = {};
    for (int p = 0; p < dk4; p += 4) {
        float4 kj[4];
#pragma unroll
        for (int n = 0; n < 4; ++n) kj[n] = ld4(sk + (tj + 16 * n) * RS + p);
#pragma unroll
        for (int m = 0; m < 4; ++m) {
            float4 qi = ld4(sq + (ti + 16 * m) * RS + p);
#pragma unroll
            for (int n = 0; n < 4; ++n) qk[m][n] += dot4(qi, kj[n]);
            if (!SSD) {
                float4 ki = ld4(sk + (ti + 16 * m) * RS + p);
#pragma unroll
                for (int n = 0; n < 4; ++n) kk[m][n] += dot4(ki, kj[n]);
            }
        }
    }
    const long long row0 = (long long)t0 * v_heads + h;  // (token t0, head h)'s record
#pragma unroll
    for (int m = 0; m < 4; ++m) {
#pragma unroll
        for (int n = 0; n < 4; ++n) {
            int i = ti + 16 * m, j = tj + 16 * n;
            float decay = j <= i ? expf(cum[i] - cum[j]) : 0.0f;
            if (i < len) P[(row0 + (long long)i * v_heads) * RC + j] = qk[m][n] * decay;
            if (!SSD) sa[i * RCS + j] = j < i ? beta[i] * kk[m][n] * decay : 0.0f;
        }
    }
    if (tid < len) cum_out[row0 + (long long)tid * v_heads] = cum[tid];
    __syncthreads();
    // One column a thread: U's (beta v) and the delta rule's W's (beta exp(c) k), each solved
    // through (I + A) by forward substitution in registers; padding columns zero.
    for (int col = tid; col < (SSD ? dv4 : dv4 + dk4); col += PREP_THREADS) {
        const bool is_u = col < dv4;
        const int c = is_u ? col : col - dv4;
        float x[RC];
#pragma unroll
        for (int i = 0; i < RC; ++i) {
            x[i] = 0.0f;
            if (i < len && c < (is_u ? dv : dk))
                x[i] = beta[i] * (is_u ? ld(qkv, (long long)(t0 + i) * row.width + row.v_at + c)
                                       : expf(cum[i]) * sk[i * RS + c]);
        }
        if (!SSD) {
#pragma unroll
            for (int i = 1; i < RC; ++i) {
                float r = x[i];
#pragma unroll
                for (int p = 0; p < i; ++p) r -= sa[i * RCS + p] * x[p];
                x[i] = r;
            }
        }
        float* dst = is_u ? U + row0 * dv4 + c : W + row0 * dk4 + c;
        const long long stride = (long long)v_heads * (is_u ? dv4 : dk4);
#pragma unroll
        for (int i = 0; i < RC; ++i)
            if (i < len) dst[i * stride] = x[i];
    }
}

// Per (sequence, value head, RV value columns from blockIdx.z * RV): the sequence's chunks
// (seq_chunks[s]..seq_chunks[s + 1]) in order from a zero state, writing out [t, v_heads * dv].
template <typename Tin, typename Tout, bool SSD>
__device__ void chunk_scan_t(Tout* out, const float* P, const float* U, const float* W,
                             const float* cum_in, const Tin* qkv, const float* d,
                             const u32* chunks, const u32* seq_chunks, int k_heads, int v_heads,
                             int dk, int dv) {
    extern __shared__ float4 smem4[];
    float* sx = (float*)smem4;  // [RC][RS]: W, then the decayed queries, then the decayed keys
    float* ss = sx + RC * RS;   // [RK][RV]: the state's columns
    float* sp = ss + RK * RV;   // [RC][RCS]: P
    float* sv = sp + RC * RCS;  // [RC][RV]: U, then the new values
    __shared__ float cum[RC], qf[RC], kf[RC];
    const int h = blockIdx.y, j0 = blockIdx.z * RV, tid = threadIdx.x;
    const int tr = tid / 8, tc = tid % 8;  // rows tr + 16 m, columns tc * 4 .. + 4
    const QkvRow row(SSD, k_heads, v_heads, dk, dv, h / (v_heads / k_heads), h);
    const float skip = SSD ? d[h] : 0.0f;
    const int dk4 = (dk + 3) & ~3, dv4 = (dv + 3) & ~3;
    const long long hv = v_heads;
    float s[8][4] = {};
    for (int e = tid; e < RK * RV; e += SCAN_THREADS) ss[e] = 0.0f;
    for (u32 c = seq_chunks[blockIdx.x]; c < seq_chunks[blockIdx.x + 1]; ++c) {
        const int t0 = chunks[c], len = chunks[c + 1] - t0;
        const long long row0 = (long long)t0 * hv + h;
        __syncthreads();
        if (tid < RC) cum[tid] = tid < len ? cum_in[row0 + tid * hv] : 0.0f;
        load_tile<RC, RC, SCAN_THREADS>(sp, RCS, P + row0 * RC, hv * RC, len, RC);
        load_tile<RC, RV, SCAN_THREADS>(sv, RV, U + row0 * dv4 + j0, hv * dv4, len, dv4 - j0);
        if (!SSD) load_tile<RC, RK, SCAN_THREADS>(sx, RS, W + row0 * dk4, hv * dk4, len, dk4);
        __syncthreads();
        const float last = cum[len - 1];
        if (tid < RC) {
            qf[tid] = expf(cum[tid]);
            kf[tid] = tid < len ? expf(last - cum[tid]) : 0.0f;
        }
        if (!SSD) {
            // V' = U - W S (each thread its own elements of sv).
            float ws[4][4] = {};
            tile_product<4>(ws, sx, RS, tr, ss, RV, tc * 4, dk4);
#pragma unroll
            for (int m = 0; m < 4; ++m)
#pragma unroll
                for (int n = 0; n < 4; ++n) sv[(tr + 16 * m) * RV + tc * 4 + n] -= ws[m][n];
        }
        __syncthreads();
        // O = exp(c) Q S + P V' (+ D x).
        load_rows<SCAN_THREADS>(sx, qkv, row.width, row.q_at, t0, len, dk, !SSD,
                                SSD ? 1.0f : rsqrtf((float)dk), qf);
        __syncthreads();
        float o[4][4] = {};
        tile_product<4>(o, sx, RS, tr, ss, RV, tc * 4, dk4);
        tile_product<4>(o, sp, RCS, tr, sv, RV, tc * 4, (len + 3) & ~3);
#pragma unroll
        for (int m = 0; m < 4; ++m) {
            int i = tr + 16 * m;
#pragma unroll
            for (int n = 0; n < 4; ++n) {
                int j = j0 + tc * 4 + n;
                if (i < len && j < dv) {
                    long long t = t0 + i;
                    float y = o[m][n];
                    if (SSD) y += skip * ld(qkv, t * row.width + row.v_at + j);
                    st(out, t * hv * dv + (long long)h * dv + j, y);
                }
            }
        }
        __syncthreads();
        // S = exp(c_last) S + (exp(c_last - c) K)^T V'.
        load_rows<SCAN_THREADS>(sx, qkv, row.width, row.k_at, t0, len, dk, !SSD, 1.0f, kf);
        __syncthreads();
        const float decay = expf(last);
#pragma unroll
        for (int m = 0; m < 8; ++m)
#pragma unroll
            for (int n = 0; n < 4; ++n) s[m][n] *= decay;
        for (int p = 0; p < len; ++p) {
            float4 v = ld4(sv + p * RV + tc * 4);
#pragma unroll
            for (int m = 0; m < 8; ++m) {
                float k = sx[p * RS + tr + 16 * m];
                s[m][0] += k * v.x;
                s[m][1] += k * v.y;
                s[m][2] += k * v.z;
                s[m][3] += k * v.w;
            }
        }
#pragma unroll
        for (int m = 0; m < 8; ++m)
            *(float4*)(ss + (tr + 16 * m) * RV + tc * 4) =
                make_float4(s[m][0], s[m][1], s[m][2], s[m][3]);
    }
}

// <rule>_<in>_<out>: any key width up to DR_MAX_DK; _k128 the key width of 128. The rules:
// gated_delta_rule, ssd_scan.
#define LINEAR_RECURRENCE_ENTRY(NAME, SSD, IN, TIN, OUT, TOUT)                                 \
    extern "C" __global__ void NAME##_##IN##_##OUT(                                            \
        TOUT* out, const TIN* qkv, const TIN* a, const TIN* b, const float* d,                 \
        const float* a_log, const float* dt_bias, const u32* seq_start, int tokens,            \
        int k_heads, int v_heads, int dk, int dv, float dt_min, float dt_max) {                \
        linear_recurrence_t<TIN, TOUT, 0, SSD>(out, qkv, a, b, d, a_log, dt_bias, seq_start,   \
                                               tokens, k_heads, v_heads, dk, dv, dt_min,       \
                                               dt_max);                                        \
    }                                                                                          \
    extern "C" __global__ void NAME##_k128_##IN##_##OUT(                                       \
        TOUT* out, const TIN* qkv, const TIN* a, const TIN* b, const float* d,                 \
        const float* a_log, const float* dt_bias, const u32* seq_start, int tokens,            \
        int k_heads, int v_heads, int dk, int dv, float dt_min, float dt_max) {                \
        linear_recurrence_t<TIN, TOUT, 128, SSD>(out, qkv, a, b, d, a_log, dt_bias, seq_start, \
                                                 tokens, k_heads, v_heads, dk, dv, dt_min,     \
                                                 dt_max);                                      \
    }

#define LINEAR_RECURRENCE_TYPES(NAME, SSD)                                                     \
    LINEAR_RECURRENCE_ENTRY(NAME, SSD, bf16, bf16_t, bf16, bf16_t)                             \
    LINEAR_RECURRENCE_ENTRY(NAME, SSD, bf16, bf16_t, f32, float)                               \
    LINEAR_RECURRENCE_ENTRY(NAME, SSD, f32, float, bf16, bf16_t)                               \
    LINEAR_RECURRENCE_ENTRY(NAME, SSD, f32, float, f32, float)

LINEAR_RECURRENCE_TYPES(gated_delta_rule, false)
LINEAR_RECURRENCE_TYPES(ssd_scan, true)

// recurrence_chunk_prepare_<rule>_<in> and recurrence_chunk_scan_<rule>_<in>_<out>, the rules
// delta and ssd.
#define CHUNK_PREPARE_ENTRY(RULE, SSD, IN, TIN)                                                  \
    extern "C" __global__ void __launch_bounds__(PREP_THREADS)                                   \
        recurrence_chunk_prepare_##RULE##_##IN(                                                  \
            float* P, float* U, float* W, float* cum, const TIN* qkv, const TIN* a,              \
            const TIN* b, const float* a_log, const float* dt_bias, const u32* chunks,           \
            int k_heads, int v_heads, int dk, int dv, float dt_min, float dt_max) {              \
        chunk_prepare_t<TIN, SSD>(P, U, W, cum, qkv, a, b, a_log, dt_bias, chunks, k_heads,      \
                                  v_heads, dk, dv, dt_min, dt_max);                              \
    }
#define CHUNK_SCAN_ENTRY(RULE, SSD, IN, TIN, OUT, TOUT)                                          \
    extern "C" __global__ void __launch_bounds__(SCAN_THREADS)                                   \
        recurrence_chunk_scan_##RULE##_##IN##_##OUT(                                             \
            TOUT* out, const float* P, const float* U, const float* W, const float* cum,         \
            const TIN* qkv, const float* d, const u32* chunks, const u32* seq_chunks,            \
            int k_heads, int v_heads, int dk, int dv) {                                          \
        chunk_scan_t<TIN, TOUT, SSD>(out, P, U, W, cum, qkv, d, chunks, seq_chunks, k_heads,     \
                                     v_heads, dk, dv);                                           \
    }
#define CHUNK_TYPES(RULE, SSD)                                                                   \
    CHUNK_PREPARE_ENTRY(RULE, SSD, bf16, bf16_t)                                                 \
    CHUNK_PREPARE_ENTRY(RULE, SSD, f32, float)                                                   \
    CHUNK_SCAN_ENTRY(RULE, SSD, bf16, bf16_t, bf16, bf16_t)                                      \
    CHUNK_SCAN_ENTRY(RULE, SSD, bf16, bf16_t, f32, float)                                        \
    CHUNK_SCAN_ENTRY(RULE, SSD, f32, float, bf16, bf16_t)                                        \
    CHUNK_SCAN_ENTRY(RULE, SSD, f32, float, f32, float)

CHUNK_TYPES(delta, false)
CHUNK_TYPES(ssd, true)
