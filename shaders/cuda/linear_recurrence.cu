// The recurrent layers' gated linear recurrence step by step (src/backend/recurrent.rs says
// what it computes): gated DeltaNet's delta rule, or with SSD Mamba-2's scan (the same update
// without the delta correction, no normalization, dt as the update strength, D's skip). A
// block of DR_COLS threads per (sequence, value head, DR_COLS columns of the value head), each
// thread one column S[:, j] of the f32 state. Blocks are launched for every token and return
// unless theirs starts a sequence. Each step stages the token's query and key in shared
// memory (L2-normed there by a block reduction for the delta rule) while the next token's
// inputs are already being loaded into registers, so a step costs its arithmetic rather than
// global-memory latency; with the key width known at compile time (DK, 128 in Qwen3.5 and
// the Mamba-2 hybrids) the state column lives in registers. A first form: the chunked one,
// with tensor-core products within a chunk, is what uses the whole GPU on long sequences.
#define DR_COLS 64
#define DR_MAX_DK 256
// Query/key values a thread stages: DR_MAX_DK / DR_COLS.
#define DR_PER (DR_MAX_DK / DR_COLS)

// qkv rows: the delta rule's [q | k | v], Mamba-2's [x (v) | B (k) | C (q)]. `b` is the delta
// rule's beta input per token, `d` Mamba-2's skip per head; the other is null.
template <typename Tin, typename Tout, int DK, bool SSD>
__device__ void linear_recurrence_t(Tout* out, const Tin* qkv, const Tin* a, const Tin* b,
                                    const float* d, const float* a_log, const float* dt_bias,
                                    const u32* seq_start, int tokens, int k_heads, int v_heads,
                                    int dk_arg, int dv, float dt_min, float dt_max) {
    __shared__ float sq[DR_MAX_DK], sk[DR_MAX_DK], red[2][DR_COLS / 32];
    const int dk = DK > 0 ? DK : dk_arg;
    int t0 = blockIdx.x, h = blockIdx.y, lid = threadIdx.x, j = blockIdx.z * DR_COLS + lid;
    if ((int)seq_start[t0] != t0) return;
    int kh = h / (v_heads / k_heads);
    long long kw = (long long)k_heads * dk, vw = (long long)v_heads * dv;
    long long width = 2 * kw + vw;
    long long q_at = SSD ? vw + kw : 0, k_at = SSD ? vw : kw, v_at = SSD ? 0 : 2 * kw;
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
            nq[e] = i < dk ? ld(qkv, t * width + q_at + (long long)kh * dk + i) : 0.0f;
            nk[e] = i < dk ? ld(qkv, t * width + k_at + (long long)kh * dk + i) : 0.0f;
        }
        nv = j < dv ? ld(qkv, t * width + v_at + (long long)h * dv + j) : 0.0f;
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
        float v = nv, x = na + bias, bb = nb;
        __syncthreads();
        // The step below hides these loads' latency.
        if (t + 1 < tokens && (int)seq_start[t + 1] == t0) load(t + 1);
        float sp = x > 20.0f ? x : log1pf(expf(x));
        float qinv = 1.0f, kinv = 1.0f, beta;
        if (SSD) {
            beta = fminf(fmaxf(sp, dt_min), dt_max);
            sp = beta;
        } else {
            qs = red[0][0] + red[0][1];
            ks = red[1][0] + red[1][1];
            qinv = rsqrtf(qs + 1e-6f) * scale;
            kinv = rsqrtf(ks + 1e-6f);
            beta = 1.0f / (1.0f + expf(-bb));
        }
        float decay = expf(rate * sp);
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
