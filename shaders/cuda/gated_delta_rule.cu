// The gated delta rule step by step (src/backend/recurrent.rs says what it computes): a block
// of DR_COLS threads per (sequence, value head, DR_COLS columns of the value head), each
// thread one column S[:, j] of the f32 state. Blocks are launched for every token and return
// unless theirs starts a sequence. Each step stages the token's query and key in shared
// memory (L2-normed there by a block reduction) while the next token's inputs are already
// being loaded into registers, so a step costs its arithmetic rather than global-memory
// latency; with the key width known at compile time (DK, 128 in Qwen3.5) the state column
// lives in registers. A first form: the chunked one, with tensor-core products within a
// chunk, is what uses the whole GPU on long sequences.
#define DR_COLS 64
#define DR_MAX_DK 256
// Query/key values a thread stages: DR_MAX_DK / DR_COLS.
#define DR_PER (DR_MAX_DK / DR_COLS)

template <typename Tin, typename Tout, int DK>
__device__ void gated_delta_rule_t(Tout* out, const Tin* qkv, const Tin* a, const Tin* b,
                                   const float* a_log, const float* dt_bias, const u32* seq_start,
                                   int tokens, int k_heads, int v_heads, int dk_arg, int dv) {
    __shared__ float sq[DR_MAX_DK], sk[DR_MAX_DK], red[2][DR_COLS / 32];
    const int dk = DK > 0 ? DK : dk_arg;
    int t0 = blockIdx.x, h = blockIdx.y, lid = threadIdx.x, j = blockIdx.z * DR_COLS + lid;
    if ((int)seq_start[t0] != t0) return;
    int kh = h / (v_heads / k_heads);
    long long width = 2LL * k_heads * dk + (long long)v_heads * dv;
    long long kw = (long long)k_heads * dk, ow = (long long)v_heads * dv;
    float s[DK > 0 ? DK : DR_MAX_DK];
#pragma unroll
    for (int i = 0; i < (DK > 0 ? DK : DR_MAX_DK); ++i) s[i] = 0.0f;
    const float scale = rsqrtf((float)dk), rate = -expf(a_log[h]), bias = dt_bias[h];
    // The next token's inputs, in registers.
    float nq[DR_PER], nk[DR_PER], nv = 0.0f, na = 0.0f, nb = 0.0f;
    auto load = [&](int t) {
#pragma unroll
        for (int e = 0; e < DR_PER; ++e) {
            int i = lid + e * DR_COLS;
            nq[e] = i < dk ? ld(qkv, t * width + (long long)kh * dk + i) : 0.0f;
            nk[e] = i < dk ? ld(qkv, t * width + kw + (long long)kh * dk + i) : 0.0f;
        }
        nv = j < dv ? ld(qkv, t * width + 2 * kw + (long long)h * dv + j) : 0.0f;
        na = ld(a, (long long)t * v_heads + h);
        nb = ld(b, (long long)t * v_heads + h);
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
        for (int o = 16; o > 0; o >>= 1) {
            qs += __shfl_xor_sync(0xffffffffu, qs, o);
            ks += __shfl_xor_sync(0xffffffffu, ks, o);
        }
        if (lid % 32 == 0) {
            red[0][lid / 32] = qs;
            red[1][lid / 32] = ks;
        }
        float v = nv, x = na + bias, bb = nb;
        __syncthreads();
        // The step below hides these loads' latency.
        if (t + 1 < tokens && (int)seq_start[t + 1] == t0) load(t + 1);
        qs = red[0][0] + red[0][1];
        ks = red[1][0] + red[1][1];
        float qinv = rsqrtf(qs + 1e-6f) * scale, kinv = rsqrtf(ks + 1e-6f);
        float decay = expf(rate * (x > 20.0f ? x : log1pf(expf(x))));
        float beta = 1.0f / (1.0f + expf(-bb));
        if (j < dv) {
            float remembered = 0.0f;
#pragma unroll
            for (int i = 0; i < (DK > 0 ? DK : DR_MAX_DK); ++i) {
                if (DK == 0 && i >= dk) break;
                s[i] *= decay;
                remembered += s[i] * sk[i];
            }
            float delta = (v - remembered * kinv) * beta;
            float o = 0.0f, kd = kinv * delta;
#pragma unroll
            for (int i = 0; i < (DK > 0 ? DK : DR_MAX_DK); ++i) {
                if (DK == 0 && i >= dk) break;
                s[i] += sk[i] * kd;
                o += s[i] * sq[i];
            }
            st(out, t * ow + (long long)h * dv + j, o * qinv);
        }
    }
}

// gated_delta_rule_<in>_<out>: any key width up to DR_MAX_DK; _k128 the key width of 128.
#define GATED_DELTA_RULE_ENTRY(IN, TIN, OUT, TOUT)                                             \
    extern "C" __global__ void gated_delta_rule_##IN##_##OUT(                                  \
        TOUT* out, const TIN* qkv, const TIN* a, const TIN* b, const float* a_log,             \
        const float* dt_bias, const u32* seq_start, int tokens, int k_heads, int v_heads,      \
        int dk, int dv) {                                                                      \
        gated_delta_rule_t<TIN, TOUT, 0>(out, qkv, a, b, a_log, dt_bias, seq_start, tokens,    \
                                         k_heads, v_heads, dk, dv);                            \
    }                                                                                          \
    extern "C" __global__ void gated_delta_rule_k128_##IN##_##OUT(                             \
        TOUT* out, const TIN* qkv, const TIN* a, const TIN* b, const float* a_log,             \
        const float* dt_bias, const u32* seq_start, int tokens, int k_heads, int v_heads,      \
        int dk, int dv) {                                                                      \
        gated_delta_rule_t<TIN, TOUT, 128>(out, qkv, a, b, a_log, dt_bias, seq_start, tokens,  \
                                           k_heads, v_heads, dk, dv);                          \
    }

GATED_DELTA_RULE_ENTRY(bf16, bf16_t, bf16, bf16_t)
GATED_DELTA_RULE_ENTRY(bf16, bf16_t, f32, float)
GATED_DELTA_RULE_ENTRY(f32, float, bf16, bf16_t)
GATED_DELTA_RULE_ENTRY(f32, float, f32, float)
