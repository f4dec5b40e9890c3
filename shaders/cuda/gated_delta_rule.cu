// The gated delta rule step by step (src/backend/recurrent.rs says what it computes): a block
// per (sequence, value head, DR_COLS columns of the value head), each thread one column of the
// f32 state S[:, j] in local memory; the token's query and key are staged in shared memory and
// L2-normalized there. Blocks are launched for every token and return unless theirs starts a
// sequence. A first, exact form: the chunked form with tensor-core products within a chunk
// is what makes it fast.
#define DR_COLS 64
#define DR_MAX_DK 256

template <typename Tin, typename Tout>
__device__ void gated_delta_rule_t(Tout* out, const Tin* qkv, const Tin* a, const Tin* b,
                                   const float* a_log, const float* dt_bias, const u32* seq_start,
                                   int tokens, int k_heads, int v_heads, int dk, int dv) {
    __shared__ float sq[DR_MAX_DK], sk[DR_MAX_DK];
    int t0 = blockIdx.x, h = blockIdx.y, j = blockIdx.z * DR_COLS + threadIdx.x;
    if ((int)seq_start[t0] != t0) return;
    int kh = h / (v_heads / k_heads);
    long long width = 2LL * k_heads * dk + (long long)v_heads * dv;
    long long kw = (long long)k_heads * dk, ow = (long long)v_heads * dv;
    float s[DR_MAX_DK];
    for (int i = 0; i < dk; ++i) s[i] = 0.0f;
    float scale = rsqrtf((float)dk);
    float decay_rate = -expf(a_log[h]);
    for (int t = t0; t < tokens && (int)seq_start[t] == t0; ++t) {
        __syncthreads();
        for (int i = threadIdx.x; i < dk; i += blockDim.x) {
            sq[i] = ld(qkv, t * width + (long long)kh * dk + i);
            sk[i] = ld(qkv, t * width + kw + (long long)kh * dk + i);
        }
        __syncthreads();
        float qs = 0.0f, ks = 0.0f;
        for (int i = 0; i < dk; ++i) {
            qs += sq[i] * sq[i];
            ks += sk[i] * sk[i];
        }
        float qinv = rsqrtf(qs + 1e-6f) * scale, kinv = rsqrtf(ks + 1e-6f);
        float x = ld(a, (long long)t * v_heads + h) + dt_bias[h];
        float g = decay_rate * (x > 20.0f ? x : log1pf(expf(x)));
        float beta = 1.0f / (1.0f + expf(-ld(b, (long long)t * v_heads + h)));
        if (j < dv) {
            float decay = expf(g), remembered = 0.0f;
            for (int i = 0; i < dk; ++i) {
                s[i] *= decay;
                remembered += s[i] * sk[i] * kinv;
            }
            float delta = (ld(qkv, t * width + 2 * kw + (long long)h * dv + j) - remembered) * beta;
            float o = 0.0f;
            for (int i = 0; i < dk; ++i) {
                s[i] += sk[i] * kinv * delta;
                o += s[i] * sq[i] * qinv;
            }
            st(out, t * ow + (long long)h * dv + j, o);
        }
    }
}

#define GATED_DELTA_RULE_ENTRY(IN, TIN, OUT, TOUT)                                             \
    extern "C" __global__ void gated_delta_rule_##IN##_##OUT(                                  \
        TOUT* out, const TIN* qkv, const TIN* a, const TIN* b, const float* a_log,             \
        const float* dt_bias, const u32* seq_start, int tokens, int k_heads, int v_heads,      \
        int dk, int dv) {                                                                      \
        gated_delta_rule_t(out, qkv, a, b, a_log, dt_bias, seq_start, tokens, k_heads,         \
                           v_heads, dk, dv);                                                   \
    }

GATED_DELTA_RULE_ENTRY(bf16, bf16_t, bf16, bf16_t)
GATED_DELTA_RULE_ENTRY(bf16, bf16_t, f32, float)
GATED_DELTA_RULE_ENTRY(f32, float, bf16, bf16_t)
GATED_DELTA_RULE_ENTRY(f32, float, f32, float)
