// The recurrent layers' gated linear recurrence (src/backend/recurrent.rs says what it
// computes): gated DeltaNet's delta rule, or with SSD Mamba-2's scan (the same update without
// the delta correction, no normalization, dt as the update strength, D's skip), in two forms.
//
// The chunked form (sm_80 and later, key and value heads up to RK wide;
// `delta_rule_chunked`): the tokens of each sequence in chunks of RC.
// `recurrence_chunk_prepare` works on every (chunk, value head) at once: the decays summed
// within the chunk, the within-chunk products P = (Q K^T) * decay and, for the delta rule, the
// unit lower-triangular system (I + A) [U | W] = beta [V | exp(c) K]; Mamba-2's U is dt V.
// Then `recurrence_chunk_scan` walks each sequence's chunks in order, a block per (sequence,
// value head, RV columns) holding those columns of the f32 state: new values V' = U - W S,
// outputs O = exp(c) Q S + P V' (+ D x), state S = exp(c_last) S + (exp(c_last - c) K)^T V'.
// Every product runs on the tensor cores in 3xTF32 (each f32 operand split into two tf32
// parts, three products accumulated in f32): f32's precision at tensor-core speed, the same
// arithmetic in every precision mode.
//
// Kimi Delta Attention (the delta rule with a decay per key channel: KEYED) takes the same two
// chunked passes with the decays summed per channel (a [RC][RK] tile): its within-chunk
// products P and A, whose decay differs inside every dot product, on the tensor cores between
// sub-chunks of SUB tokens (the decay split at the later sub-chunk's start, both factors never
// above 1) and a pair a thread on the CUDA cores within them (keyed_pairs); every other product
// as above, the decays applied per element.
//
// The step-by-step form (any key width up to DR_MAX_DK): a block of DR_COLS threads per
// (sequence, value head, DR_COLS columns of the value head), each thread one column S[:, j]
// of the f32 state. Blocks are launched for every token and return unless theirs starts a
// sequence. Each step stages the token's query and key in shared memory (L2-normed there by a
// block reduction for the delta rule) while the next token's inputs are already being loaded
// into registers; with the key width known at compile time (DK, 128 in Qwen3.5 and the
// Mamba-2 hybrids) the state column lives in registers.

// Where a token's query, key and value heads sit in its qkv row: the delta rule's [q | k | v],
// Mamba-2's [x (v) | B (k) | C (q)]. Value head h reads key head (h / kh_span) % k_heads:
// kh_span is v_heads / k_heads in transformers' grouped order, 1 in llama.cpp's tiled one.
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

// A token's log decay g and update strength beta (recurrent.rs `gates`, `safe_gates`,
// `ssd_gates`) from its inputs a (and the delta rule's b), the head's rate -exp(A_log), dt_bias
// and the gate's bounds: Mamba-2's limits on dt; for the delta rules in lo GLM-5.3-Flash's safe
// gate's lower bound (below 0: g = lo * sigmoid(exp(A_log) (a + dt_bias))), or 0 for softplus.
template <bool SSD>
__device__ __forceinline__ void token_gates(float a, float b, float rate, float bias, float lo,
                                            float hi, float& g, float& beta) {
    float x = a + bias;
    if (!SSD && lo < 0.0f) {
        beta = 1.0f / (1.0f + expf(-b));
        g = lo * (1.0f / (1.0f + expf(rate * x)));
        return;
    }
    float sp = x > 20.0f ? x : log1pf(expf(x));
    if (SSD) {
        sp = fminf(fmaxf(sp, lo), hi);
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
// With KEYED, `a` and `dt_bias` hold a value per value head and key channel, and the state's
// row i decays by its own exp(g_i), staged in shared memory with the query and key.
template <typename Tin, typename Tout, int DK, bool SSD, bool KEYED>
__device__ void linear_recurrence_t(Tout* out, const Tin* qkv, const Tin* a, const Tin* b,
                                    const float* d, const float* a_log, const float* dt_bias,
                                    const u32* seq_start, int tokens, int k_heads, int v_heads,
                                    int dk_arg, int dv, int kh_span, float gate_lo,
                                    float gate_hi) {
    __shared__ float sq[DR_MAX_DK], sk[DR_MAX_DK], sg[KEYED ? DR_MAX_DK : 1],
        red[2][DR_COLS / 32];
    const int dk = DK > 0 ? DK : dk_arg;
    int t0 = blockIdx.x, h = blockIdx.y, lid = threadIdx.x, j = blockIdx.z * DR_COLS + lid;
    if ((int)seq_start[t0] != t0) return;
    const QkvRow row(SSD, k_heads, v_heads, dk, dv, (h / kh_span) % k_heads, h);
    const long long width = row.width, vw = (long long)v_heads * dv;
    float s[DK > 0 ? DK : DR_MAX_DK];
#pragma unroll
    for (int i = 0; i < (DK > 0 ? DK : DR_MAX_DK); ++i) s[i] = 0.0f;
    const float scale = rsqrtf((float)dk), rate = -expf(a_log[h]), bias = dt_bias[h];
    const float skip = SSD ? d[h] : 0.0f;
    // The next token's inputs, in registers (KEYED: a decay input a key channel, in nka).
    float nq[DR_PER], nk[DR_PER], nka[KEYED ? DR_PER : 1], nv = 0.0f, na = 0.0f, nb = 0.0f;
    const long long keyed_width = (long long)v_heads * dk;
    auto load = [&](int t) {
#pragma unroll
        for (int e = 0; e < DR_PER; ++e) {
            int i = lid + e * DR_COLS;
            nq[e] = i < dk ? ld(qkv, t * width + row.q_at + i) : 0.0f;
            nk[e] = i < dk ? ld(qkv, t * width + row.k_at + i) : 0.0f;
            if (KEYED) nka[e] = i < dk ? ld(a, t * keyed_width + (long long)h * dk + i) : 0.0f;
        }
        nv = j < dv ? ld(qkv, t * width + row.v_at + j) : 0.0f;
        if (!KEYED) na = ld(a, (long long)t * v_heads + h);
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
                if (KEYED) {
                    float gi, unused;
                    token_gates<false>(nka[e], 0.0f, rate, dt_bias[(long long)h * dk + i],
                                       gate_lo, 0.0f, gi, unused);
                    sg[i] = expf(gi);
                }
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
        // KEYED: beta alone (its decays are staged above).
        token_gates<SSD>(na, nb, rate, bias, gate_lo, gate_hi, g, beta);
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
                s[i] *= KEYED ? sg[i] : decay;
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
#define RK 128         // the widest key (and value) head the chunked kernels hold, zero padded
#define RS (RK + 4)    // row stride of [RC][RK] tiles: fragment reads of 8 rows in distinct banks
#define RCS (RC + 4)   // row stride of [RC][RC] tiles
#define SUB 16         // tokens a sub-chunk of Kimi's within-chunk products (keyed_pairs)
#define RV 32          // value columns a scan block
#define SV (RV + 8)    // row stride of [..][RV] tiles read as mma B operands
#define PREP_THREADS 256
#define SCAN_THREADS 128

__device__ __forceinline__ float4 ld4(const float* p) { return *(const float4*)p; }

// A value as the sum of two tf32 values (the larger rounded to nearest), for products exact to
// about f32's precision from three tf32 tensor-core products ("3xTF32").
// Before sm_80 (no tf32) the chunked kernels are not launched (linear_recurrence.rs).
__device__ __forceinline__ void split_tf32(float x, u32& big, u32& small) {
#if __CUDA_ARCH__ >= 800
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(big) : "f"(x));
    float rest = x - __uint_as_float(big);
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(small) : "f"(rest));
#else
    __trap();
#endif
}

__device__ __forceinline__ void mma_tf32(float (&d)[4], const u32 (&a)[4], u32 b0, u32 b1) {
#if __CUDA_ARCH__ >= 800
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
    __trap();
#endif
}

// One warp's acc[n][..] += A[m0 .. m0 + 16][0 .. K) B[0 .. K)[n0 + 8 n .. + 8] for n < N, K a
// multiple of 8, in 3xTF32 on the tensor cores (m16n8k8: lane 4 g + t holds A's rows g and
// g + 8 at columns t and t + 4, B's rows t and t + 4 at column g, and the outputs (g, 2 t),
// (g, 2 t + 1), (g + 8, 2 t), (g + 8, 2 t + 1)). A[m][k] is a[m * sa + k], or with AT
// a[k * sa + m]; B[k][n] is b[k * sb + n], or with BT b[n * sb + k].
template <int N, bool AT, bool BT>
__device__ __forceinline__ void warp_mma(float (&acc)[N][4], const float* a, int sa, int m0,
                                         const float* b, int sb, int n0, int K) {
    const int g = threadIdx.x % 32 / 4, t = threadIdx.x % 4;
    auto A = [&](int m, int k) { return AT ? a[k * sa + m] : a[m * sa + k]; };
    auto B = [&](int k, int n) { return BT ? b[n * sb + k] : b[k * sb + n]; };
    for (int k0 = 0; k0 < K; k0 += 8) {
        u32 ab[4], as[4];
        split_tf32(A(m0 + g, k0 + t), ab[0], as[0]);
        split_tf32(A(m0 + g + 8, k0 + t), ab[1], as[1]);
        split_tf32(A(m0 + g, k0 + t + 4), ab[2], as[2]);
        split_tf32(A(m0 + g + 8, k0 + t + 4), ab[3], as[3]);
#pragma unroll
        for (int n = 0; n < N; ++n) {
            u32 bb0, bs0, bb1, bs1;
            split_tf32(B(k0 + t, n0 + 8 * n + g), bb0, bs0);
            split_tf32(B(k0 + t + 4, n0 + 8 * n + g), bb1, bs1);
            mma_tf32(acc[n], as, bb0, bb1);
            mma_tf32(acc[n], ab, bs0, bs1);
            mma_tf32(acc[n], ab, bb0, bb1);
        }
    }
}

// Calls f(row, column, value) for each output a lane holds of warp_mma's acc.
template <int N, typename F>
__device__ __forceinline__ void each_output(const float (&acc)[N][4], int m0, int n0, F f) {
    const int g = threadIdx.x % 32 / 4, t = threadIdx.x % 4;
#pragma unroll
    for (int n = 0; n < N; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) f(m0 + g + 8 * (e / 2), n0 + 8 * n + 2 * t + e % 2, acc[n][e]);
}

// One chunk's rows of a head (at `at` in each qkv row, `width` values) into tile[RC][RS], zeros
// past its `len` tokens and `width`; with `norm` each row L2-normed (rsqrt(sum x^2 + 1e-6), as
// the step kernel); times `scale` and factor[i] where given. Each warp reads whole rows (four
// values a lane), all of a thread's loads issued before any is used. The caller synchronizes
// before and after.
template <int THREADS, typename Tin>
__device__ void load_rows(float* tile, const Tin* qkv, long long stride, long long at, int t0,
                          int len, int width, bool norm, float scale, const float* factor) {
    constexpr int WARPS = THREADS / 32, R = RC / WARPS;
    const int warp = threadIdx.x / 32, p = (threadIdx.x % 32) * 4;
    float v[R][4];
#pragma unroll
    for (int r = 0; r < R; ++r) {
        const int i = warp + WARPS * r;
#pragma unroll
        for (int e = 0; e < 4; ++e)
            v[r][e] = i < len && p + e < width
                          ? ld(qkv, (long long)(t0 + i) * stride + at + p + e)
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
        *(float4*)(tile + i * RS + p) =
            make_float4(v[r][0] * f, v[r][1] * f, v[r][2] * f, v[r][3] * f);
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
                            int h, int v_heads, float rate, float bias, float gate_lo,
                            float gate_hi) {
    int i = threadIdx.x;
    if (i < RC) {
        float g = 0.0f, bt = 0.0f;
        if (i < len) {
            long long at = (long long)(t0 + i) * v_heads + h;
            token_gates<SSD>(ld(a, at), SSD ? 0.0f : ld(b, at), rate, bias, gate_lo, gate_hi, g,
                             bt);
        }
        cum[i] = g;
        beta[i] = bt;
    }
    __syncthreads();
    if (i == 0)
        for (int r = 1; r < RC; ++r) cum[r] += cum[r - 1];
}

// KEYED: the chunk's gates, beta[] a token, its decays summed from the chunk's start a key
// channel each into sc[RC][RS] (zeros past `len` tokens and `dk` channels).
template <typename Tin>
__device__ void chunk_keyed_gates(float* sc, float* beta, const Tin* a, const Tin* b, int t0,
                                  int len, int h, int v_heads, int dk, float rate,
                                  const float* dt_bias, float lo) {
    const int tid = threadIdx.x;
    const long long keyed = (long long)v_heads * dk;
    for (int e = tid; e < RC * RK; e += PREP_THREADS) {
        const int i = e / RK, d = e % RK;
        float g = 0.0f, bt = 0.0f;
        if (i < len && d < dk) {
            const long long t = t0 + i;
            token_gates<false>(ld(a, t * keyed + (long long)h * dk + d), ld(b, t * v_heads + h),
                               rate, dt_bias[(long long)h * dk + d], lo, 0.0f, g, bt);
        }
        sc[i * RS + d] = g;
        if (d == 0) beta[i] = bt;
    }
    __syncthreads();
    if (tid < RK)
        for (int r = 1; r < RC; ++r) sc[r * RS + tid] += sc[(r - 1) * RS + tid];
}

// KEYED: the within-chunk products P[i][j] = sum_d q_i k_j exp(c_i - c_j) (j <= i) and
// A[i][j] = beta_i sum_d k_i k_j exp(c_i - c_j) (j < i) of the unit-normed queries sq and keys
// sk, whose decay differs in every channel d. Within each sub-chunk of SUB tokens, a pair a
// thread on the CUDA cores with exp(c_i - c_j) per channel. Between sub-chunks on the tensor
// cores: with r the first token of i's sub-chunk and j < r, exp(c_i - c_j) = exp(c_i - c_r)
// exp(c_r - c_j), both factors never above 1 (c falls along the chunk), so the rows of each
// sub-chunk are scaled in place by the first and the keys before r into sx by the second. The
// sub-chunks are taken from the last down, so the keys before r are still unscaled; sq and sk
// are left scaled. The caller synchronizes before and after.
__device__ void keyed_pairs(float* P, float* sa, float* sq, float* sk, const float* sc,
                            float* sx, const float* beta, long long row0, long long hv, int len,
                            int dk) {
    const int tid = threadIdx.x, warp = tid / 32, dk8 = (dk + 7) & ~7;
    // Within: i's sub-chunk a lane a column j (each lane starting at its own channel, so that
    // the rows' reads fall in distinct banks); zeros above the sub-chunks.
    const int rot = (tid % 32) % dk;
    for (int e = tid; e < RC * SUB; e += PREP_THREADS) {
        const int i = e / SUB, j = i / SUB * SUB + e % SUB;
        float p = 0.0f, kk = 0.0f;
        if (j <= i && i < len) {
            for (int dd = 0; dd < dk; ++dd) {
                const int d = dd + rot < dk ? dd + rot : dd + rot - dk;
                const float kj = sk[j * RS + d] * expf(sc[i * RS + d] - sc[j * RS + d]);
                p += sq[i * RS + d] * kj;
                kk += sk[i * RS + d] * kj;
            }
        }
        if (i < len) P[(row0 + i * hv) * RC + j] = p;
        sa[i * RCS + j] = j < i ? beta[i] * kk : 0.0f;
    }
    for (int e = tid; e < RC * RC; e += PREP_THREADS) {
        const int i = e / RC, j = e % RC;
        if (j / SUB > i / SUB) {
            if (i < len) P[(row0 + i * hv) * RC + j] = 0.0f;
            sa[i * RCS + j] = 0.0f;
        }
    }
    // Between: sub-chunk I's rows against the keys before r = SUB I, P's and A's 16-column
    // tiles a warp each.
    for (int I = RC / SUB - 1; I > 0; --I) {
        const int r = SUB * I;
        __syncthreads();
        for (int e = tid; e < r * RK; e += PREP_THREADS) {
            const int j = e / RK, d = e % RK;
            sx[j * RS + d] = sk[j * RS + d] * expf(sc[r * RS + d] - sc[j * RS + d]);
        }
        for (int e = tid; e < SUB * RK; e += PREP_THREADS) {
            const int i = r + e / RK, d = e % RK;
            const float f = expf(sc[i * RS + d] - sc[r * RS + d]);
            sq[i * RS + d] *= f;
            sk[i * RS + d] *= f;
        }
        __syncthreads();
        for (int w = warp; w < 2 * I; w += PREP_THREADS / 32) {
            const bool is_a = w >= I;
            const int n0 = 16 * (w % I);
            float acc[2][4] = {};
            warp_mma<2, false, true>(acc, is_a ? sk : sq, RS, r, sx, RS, n0, dk8);
            each_output(acc, r, n0, [&](int i, int j, float v) {
                if (is_a)
                    sa[i * RCS + j] = beta[i] * v;
                else if (i < len)
                    P[(row0 + i * hv) * RC + j] = v;
            });
        }
    }
}

// Per (chunk, value head): P [t, v_heads, RC] (row i's products with the chunk's tokens),
// U [t, v_heads, dv4], for the delta rule W [t, v_heads, dk4] (each row padded with zeros to a
// multiple of 4), and cum [t, v_heads] (KEYED: [t, v_heads, dk4]). Chunk c is tokens
// chunks[c]..chunks[c + 1]. The delta rule's system is solved as (I + A)^-1 (one column a
// thread of two warps, forward substitution in registers) times the right-hand sides on the
// tensor cores.
template <typename Tin, bool SSD, bool KEYED>
__device__ void chunk_prepare_t(float* P, float* U, float* W, float* cum_out, const Tin* qkv,
                                const Tin* a, const Tin* b, const float* a_log,
                                const float* dt_bias, const u32* chunks, int k_heads, int v_heads,
                                int dk, int dv, int kh_span, float gate_lo, float gate_hi) {
    extern __shared__ float4 smem4[];
    float* sq = (float*)smem4;   // [RC][RS] queries, then beta V
    float* sk = sq + RC * RS;    // [RC][RS] keys, then beta exp(c) K
    float* sa = sk + RC * RS;    // [RC][RCS] the delta rule's A, then (I + A)^-1
    float* sc = sa + RC * RCS;   // KEYED: [RC][RS] the summed decays, a key channel each
    float* sx = sc + RC * RS;    // KEYED: [RC - SUB][RS] keys scaled for keyed_pairs
    __shared__ float cum[RC], beta[RC], wf[RC];
    const int h = blockIdx.y, tid = threadIdx.x, warp = tid / 32, t0 = chunks[blockIdx.x];
    const int len = chunks[blockIdx.x + 1] - t0;
    const int dk8 = (dk + 7) & ~7, dv4 = (dv + 3) & ~3, dk4 = (dk + 3) & ~3;
    const long long hv = v_heads, row0 = (long long)t0 * hv + h;  // (t0, h)'s record
    const QkvRow row(SSD, k_heads, v_heads, dk, dv, (h / kh_span) % k_heads, h);
    load_rows<PREP_THREADS>(sq, qkv, row.width, row.q_at, t0, len, dk, !SSD,
                            SSD ? 1.0f : rsqrtf((float)dk), nullptr);
    load_rows<PREP_THREADS>(sk, qkv, row.width, row.k_at, t0, len, dk, !SSD, 1.0f, nullptr);
    if (KEYED)
        chunk_keyed_gates<Tin>(sc, beta, a, b, t0, len, h, v_heads, dk, -expf(a_log[h]), dt_bias,
                               gate_lo);
    else
        chunk_gates<Tin, SSD>(cum, beta, a, b, t0, len, h, v_heads, -expf(a_log[h]), dt_bias[h],
                              gate_lo, gate_hi);
    __syncthreads();
    if (KEYED)
        keyed_pairs(P, sa, sq, sk, sc, sx, beta, row0, hv, len, dk);
    else {
        // Q K^T and (delta rule) K K^T: each warp 16 rows and 32 columns of both.
        const int m0 = 16 * (warp % 4), n0 = 32 * (warp / 4);
        float qk[4][4] = {}, kk[4][4] = {};
        warp_mma<4, false, true>(qk, sq, RS, m0, sk, RS, n0, dk8);
        if (!SSD) warp_mma<4, false, true>(kk, sk, RS, m0, sk, RS, n0, dk8);
        each_output(qk, m0, n0, [&](int i, int j, float v) {
            float decay = j <= i ? expf(cum[i] - cum[j]) : 0.0f;
            if (i < len) P[(row0 + i * hv) * RC + j] = v * decay;
        });
        if (!SSD)
            each_output(kk, m0, n0, [&](int i, int j, float v) {
                sa[i * RCS + j] = j < i ? beta[i] * v * expf(cum[i] - cum[j]) : 0.0f;
            });
    }
    if (KEYED) {
        for (int e = tid; e < len * dk4; e += PREP_THREADS) {
            const int i = e / dk4, d = e % dk4;
            cum_out[(row0 + i * hv) * dk4 + d] = sc[i * RS + d];
        }
    } else if (tid < RC) {
        if (tid < len) cum_out[row0 + tid * hv] = cum[tid];
        wf[tid] = beta[tid] * expf(cum[tid]);
    }
    __syncthreads();
    // The right-hand sides: beta V over the queries, beta exp(c) K over the keys.
    load_rows<PREP_THREADS>(sq, qkv, row.width, row.v_at, t0, len, dv, false, 1.0f, beta);
    if (KEYED) {  // keyed_pairs scaled the keys in place
        load_rows<PREP_THREADS>(sk, qkv, row.width, row.k_at, t0, len, dk, true, 1.0f, nullptr);
        __syncthreads();
    }
    if (SSD) {
        __syncthreads();
        for (int e = tid; e < RC * dv4; e += PREP_THREADS) {
            int i = e / dv4, j = e % dv4;
            if (i < len) U[(row0 + i * hv) * dv4 + j] = sq[i * RS + j];
        }
        return;
    }
    for (int e = tid; e < RC * RK; e += PREP_THREADS) {
        const int i = e / RK, d = e % RK;
        sk[i * RS + d] *= KEYED ? beta[i] * expf(sc[i * RS + d]) : wf[i];
    }
    // (I + A)^-1, column j by thread j: x_i = [i == j] - sum_{p < i} A[i][p] x_p.
    float x[RC];
    if (tid < RC) {
#pragma unroll
        for (int i = 0; i < RC; ++i) {
            float r = i == tid ? 1.0f : 0.0f;
#pragma unroll
            for (int p = 0; p < i; ++p) r -= sa[i * RCS + p] * x[p];
            x[i] = r;
        }
    }
    __syncthreads();
    if (tid < RC) {
#pragma unroll
        for (int i = 0; i < RC; ++i) sa[i * RCS + tid] = x[i];
    }
    __syncthreads();
    // U = T (beta V), W = T (beta exp(c) K): each warp 16 rows and 64 columns of each.
    const int m0 = 16 * (warp % 4), n0 = 64 * (warp / 4);
    auto solve = [&](const float* rhs, float* dst, int cols4) {
        if (n0 >= cols4) return;
        float acc[8][4] = {};
        warp_mma<8, false, false>(acc, sa, RCS, m0, rhs, RS, n0, (len + 7) & ~7);
        each_output(acc, m0, n0, [&](int i, int j, float v) {
            if (i < len && j < cols4) dst[(row0 + i * hv) * cols4 + j] = v;
        });
    };
    solve(sq, U, dv4);
    solve(sk, W, dk4);
}

// Per (sequence, value head, RV value columns from blockIdx.z * RV): the sequence's chunks
// (seq_chunks[s]..seq_chunks[s + 1]) in order from a zero state, writing out [t, v_heads * dv].
// Each warp holds 32 rows of the f32 state as tensor-core accumulators (KEYED: each row
// decayed by its own channel's sum).
template <typename Tin, typename Tout, bool SSD, bool KEYED>
__device__ void chunk_scan_t(Tout* out, const float* P, const float* U, const float* W,
                             const float* cum_in, const Tin* qkv, const float* d,
                             const u32* chunks, const u32* seq_chunks, int k_heads, int v_heads,
                             int dk, int dv, int kh_span) {
    extern __shared__ float4 smem4[];
    float* sx = (float*)smem4;  // [RC][RS]: W, then the decayed queries, then the decayed keys
    float* ss = sx + RC * RS;   // [RK][SV]: the state's columns
    float* sp = ss + RK * SV;   // [RC][RCS]: P
    float* sv = sp + RC * RCS;  // [RC][SV]: U, then the new values
    float* sc = sv + RC * SV;   // KEYED: [RC][RS] the summed decays, a key channel each
    __shared__ float cum[RC], qf[RC], kf[RC], lastc[KEYED ? RK : 1];
    const int h = blockIdx.y, j0 = blockIdx.z * RV, tid = threadIdx.x, warp = tid / 32;
    const QkvRow row(SSD, k_heads, v_heads, dk, dv, (h / kh_span) % k_heads, h);
    const float skip = SSD ? d[h] : 0.0f;
    const int dk8 = (dk + 7) & ~7, dk4 = (dk + 3) & ~3, dv4 = (dv + 3) & ~3;
    const long long hv = v_heads;
    float s[2][4][4] = {};  // state rows 32 warp + 16 m, columns 8 n (fragment layout)
    for (int e = tid; e < RK * SV; e += SCAN_THREADS) ss[e] = 0.0f;
    for (u32 c = seq_chunks[blockIdx.x]; c < seq_chunks[blockIdx.x + 1]; ++c) {
        const int t0 = chunks[c], len = chunks[c + 1] - t0, len8 = (len + 7) & ~7;
        const long long row0 = (long long)t0 * hv + h;
        __syncthreads();
        if (KEYED)
            load_tile<RC, RK, SCAN_THREADS>(sc, RS, cum_in + row0 * dk4, hv * dk4, len, dk4);
        else if (tid < RC)
            cum[tid] = tid < len ? cum_in[row0 + tid * hv] : 0.0f;
        load_tile<RC, RC, SCAN_THREADS>(sp, RCS, P + row0 * RC, hv * RC, len, RC);
        load_tile<RC, RV, SCAN_THREADS>(sv, SV, U + row0 * dv4 + j0, hv * dv4, len, dv4 - j0);
        if (!SSD) load_tile<RC, RK, SCAN_THREADS>(sx, RS, W + row0 * dk4, hv * dk4, len, dk4);
        __syncthreads();
        const float last = KEYED ? 0.0f : cum[len - 1];
        if (KEYED && tid < RK) lastc[tid] = sc[(len - 1) * RS + tid];
        if (!KEYED && tid < RC) {
            qf[tid] = expf(cum[tid]);
            kf[tid] = tid < len ? expf(last - cum[tid]) : 0.0f;
        }
        if (!SSD) {
            // V' = U - W S (each lane its own elements of sv).
            float ws[4][4] = {};
            warp_mma<4, false, false>(ws, sx, RS, 16 * warp, ss, SV, 0, dk8);
            each_output(ws, 16 * warp, 0, [&](int i, int j, float v) { sv[i * SV + j] -= v; });
        }
        __syncthreads();
        // O = exp(c) Q S + P V' (+ D x).
        load_rows<SCAN_THREADS>(sx, qkv, row.width, row.q_at, t0, len, dk, !SSD,
                                SSD ? 1.0f : rsqrtf((float)dk), KEYED ? nullptr : qf);
        __syncthreads();
        if (KEYED) {
            for (int e = tid; e < RC * RK; e += SCAN_THREADS)
                sx[e / RK * RS + e % RK] *= expf(sc[e / RK * RS + e % RK]);
            __syncthreads();
        }
        float o[4][4] = {};
        warp_mma<4, false, false>(o, sx, RS, 16 * warp, ss, SV, 0, dk8);
        warp_mma<4, false, false>(o, sp, RCS, 16 * warp, sv, SV, 0, len8);
        each_output(o, 16 * warp, 0, [&](int i, int jj, float y) {
            const int j = j0 + jj;
            if (i < len && j < dv) {
                const long long t = t0 + i;
                if (SSD) y += skip * ld(qkv, t * row.width + row.v_at + j);
                st(out, t * hv * dv + (long long)h * dv + j, y);
            }
        });
        __syncthreads();
        // S = exp(c_last) S + (exp(c_last - c) K)^T V'.
        load_rows<SCAN_THREADS>(sx, qkv, row.width, row.k_at, t0, len, dk, !SSD, 1.0f,
                                KEYED ? nullptr : kf);
        __syncthreads();
        if (KEYED) {
            for (int e = tid; e < RC * RK; e += SCAN_THREADS) {
                const int i = e / RK, c = e % RK;
                sx[i * RS + c] *= i < len ? expf(lastc[c] - sc[i * RS + c]) : 0.0f;
            }
            __syncthreads();
        }
        const float decay = expf(last);
        const int g = tid % 32 / 4;
#pragma unroll
        for (int m = 0; m < 2; ++m) {
#pragma unroll
            for (int n = 0; n < 4; ++n)
#pragma unroll
                for (int e = 0; e < 4; ++e)
                    s[m][n][e] *= KEYED ? expf(lastc[32 * warp + 16 * m + g + 8 * (e / 2)]) : decay;
            warp_mma<4, true, false>(s[m], sx, RS, 32 * warp + 16 * m, sv, SV, 0, len8);
            each_output(s[m], 32 * warp + 16 * m, 0,
                        [&](int i, int j, float v) { ss[i * SV + j] = v; });
        }
    }
}

// <rule>_<in>_<out>: any key width up to DR_MAX_DK; _k128 the key width of 128. The rules:
// gated_delta_rule, ssd_scan, kimi_delta_rule (a decay a key channel).
#define LINEAR_RECURRENCE_ENTRY(NAME, SSD, KEYED, IN, TIN, OUT, TOUT)                          \
    extern "C" __global__ void NAME##_##IN##_##OUT(                                            \
        TOUT* out, const TIN* qkv, const TIN* a, const TIN* b, const float* d,                 \
        const float* a_log, const float* dt_bias, const u32* seq_start, int tokens,            \
        int k_heads, int v_heads, int dk, int dv, int kh_span, float gate_lo, float gate_hi) { \
        linear_recurrence_t<TIN, TOUT, 0, SSD, KEYED>(out, qkv, a, b, d, a_log, dt_bias,       \
                                                      seq_start, tokens, k_heads, v_heads, dk, \
                                                      dv, kh_span, gate_lo, gate_hi);          \
    }                                                                                          \
    extern "C" __global__ void NAME##_k128_##IN##_##OUT(                                       \
        TOUT* out, const TIN* qkv, const TIN* a, const TIN* b, const float* d,                 \
        const float* a_log, const float* dt_bias, const u32* seq_start, int tokens,            \
        int k_heads, int v_heads, int dk, int dv, int kh_span, float gate_lo, float gate_hi) { \
        linear_recurrence_t<TIN, TOUT, 128, SSD, KEYED>(out, qkv, a, b, d, a_log, dt_bias,     \
                                                        seq_start, tokens, k_heads, v_heads,   \
                                                        dk, dv, kh_span, gate_lo, gate_hi);    \
    }

// E(args..., IN, TIN, OUT, TOUT) for each (input, output) type pair.
#define EACH_IN_OUT(E, ...)                        \
    E(__VA_ARGS__, bf16, bf16_t, bf16, bf16_t)     \
    E(__VA_ARGS__, bf16, bf16_t, f32, float)       \
    E(__VA_ARGS__, f32, float, bf16, bf16_t)       \
    E(__VA_ARGS__, f32, float, f32, float)

EACH_IN_OUT(LINEAR_RECURRENCE_ENTRY, gated_delta_rule, false, false)
EACH_IN_OUT(LINEAR_RECURRENCE_ENTRY, ssd_scan, true, false)
EACH_IN_OUT(LINEAR_RECURRENCE_ENTRY, kimi_delta_rule, false, true)

// recurrence_chunk_prepare_<rule>_<in> and recurrence_chunk_scan_<rule>_<in>_<out>, the rules
// delta, ssd and kimi (the delta rule, a decay a key channel).
#define CHUNK_PREPARE_ENTRY(RULE, SSD, KEYED, IN, TIN)                                           \
    extern "C" __global__ void __launch_bounds__(PREP_THREADS)                                   \
        recurrence_chunk_prepare_##RULE##_##IN(                                                  \
            float* P, float* U, float* W, float* cum, const TIN* qkv, const TIN* a,              \
            const TIN* b, const float* a_log, const float* dt_bias, const u32* chunks,           \
            int k_heads, int v_heads, int dk, int dv, int kh_span, float gate_lo,                \
            float gate_hi) {                                                                     \
        chunk_prepare_t<TIN, SSD, KEYED>(P, U, W, cum, qkv, a, b, a_log, dt_bias, chunks,        \
                                         k_heads, v_heads, dk, dv, kh_span, gate_lo, gate_hi);   \
    }
#define CHUNK_SCAN_ENTRY(RULE, SSD, KEYED, IN, TIN, OUT, TOUT)                                   \
    extern "C" __global__ void __launch_bounds__(SCAN_THREADS)                                   \
        recurrence_chunk_scan_##RULE##_##IN##_##OUT(                                             \
            TOUT* out, const float* P, const float* U, const float* W, const float* cum,         \
            const TIN* qkv, const float* d, const u32* chunks, const u32* seq_chunks,            \
            int k_heads, int v_heads, int dk, int dv, int kh_span) {                             \
        chunk_scan_t<TIN, TOUT, SSD, KEYED>(out, P, U, W, cum, qkv, d, chunks, seq_chunks,       \
                                            k_heads, v_heads, dk, dv, kh_span);                  \
    }
#define CHUNK_TYPES(RULE, SSD, KEYED)                                                            \
    CHUNK_PREPARE_ENTRY(RULE, SSD, KEYED, bf16, bf16_t)                                          \
    CHUNK_PREPARE_ENTRY(RULE, SSD, KEYED, f32, float)                                            \
    EACH_IN_OUT(CHUNK_SCAN_ENTRY, RULE, SSD, KEYED)

CHUNK_TYPES(delta, false, false)
CHUNK_TYPES(ssd, true, false)
CHUNK_TYPES(kimi, false, true)
