// nvrtc: exact
// Routing on the device, the rules of src/backend/routing.rs (the host reference): each
// token's top-k experts from its f32 router logits, then the tokens grouped by expert.
// Equal scores keep the lower expert first (`beats`), as torch.topk does on the CPU.

#define MAX_K 32
#define MAX_GROUPS 64
#define NEG_INF __int_as_float(0xff800000u)
#define FULL 0xffffffffu

// A candidate expert and the key it is ranked by; e < 0: none.
struct Pick {
    float key;
    int e;
};

// Higher key first; at equal keys the lower expert (torch.topk on the CPU).
__device__ __forceinline__ bool beats(Pick a, Pick b) {
    return a.e >= 0 && (b.e < 0 || a.key > b.key || (a.key == b.key && a.e < b.e));
}

// The warp's best candidate, the same in every lane (lane 0's, where NaN keys could make
// lanes disagree).
__device__ __forceinline__ Pick warp_best(Pick p) {
    for (int o = 16; o > 0; o >>= 1) {
        Pick q = {__shfl_xor_sync(FULL, p.key, o), __shfl_xor_sync(FULL, p.e, o)};
        if (beats(q, p)) p = q;
    }
    return {__shfl_sync(FULL, p.key, 0), __shfl_sync(FULL, p.e, 0)};
}

// v[i] with i known only at run time, without spilling v to local memory.
template <int SLOTS>
__device__ __forceinline__ float slot(const float (&v)[SLOTS], int i) {
    float x = 0.0f;
#pragma unroll
    for (int j = 0; j < SLOTS; ++j)
        if (j == i) x = v[j];
    return x;
}

// v's value for expert e (in its lane's slot e / 32), in every lane.
template <int SLOTS>
__device__ __forceinline__ float expert_value(const float (&v)[SLOTS], int e) {
    return __shfl_sync(FULL, slot(v, e / 32), e % 32);
}

// sqrt(softplus(x)) as torch computes it (softplus is x past 20).
__device__ __forceinline__ float sqrt_softplus(float x) {
    return x > 20.0f ? sqrtf(x) : sqrtf(log1pf(expf(x)));
}

// One warp per token: its k experts (ids, weights) and a count per expert. Lanes hold the
// token's logits (coalesced), rank in registers and pick the k best by shuffles; sums run in
// the host reference's order (the softmax denominator in expert order, the k weights in pick
// order), so the same picks and weights come out.
// rule == 0: softmax over every expert, top k, weights renormalised when `renorm`.
// rule == 2: top k of the logits, weights a softmax over those k (gpt-oss).
// rule == 3: top k of the logits, weights their sigmoids (Llama 4).
// rule == 1: sigmoid scores; choice = score + bias; groups ranked by the sum of their two
// best choices, the `top_groups` best kept; top k of their experts by choice; weights the
// scores, renormalised (their sum + eps) when `renorm`, times `scale`.
// rule == 4: sqrt(softplus) scores (DeepSeek-V4); choice = score + bias, top k by choice, or
// the k experts `fixed` names for the token (its hash-routed layers); weights the scores
// renormalised (their sum + eps) times `scale`.
// Then, where `expert_scale` is not null, each weight times its expert's factor (Gemma 4).
// SLOTS: experts a lane holds (expert e in lane e % 32, slot e / 32), 32 SLOTS experts at
// most: every loop over the slots is unrolled, so the entry of the fewest slots that hold the
// experts runs (Qwen3-30B-A3B's 128: 4, a quarter of the instructions of 16).
template <int SLOTS>
__device__ void route_topk(const float* logits, const float* bias, const float* expert_scale,
                           const u32* fixed, u32* ids, float* weights, u32* counts, int tokens,
                           int experts, int k, int rule, int renorm, int groups, int top_groups,
                           float scale, float eps) {
    int lane = threadIdx.x & 31;
    long long t = (long long)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (t >= tokens) return;  // the whole warp
    const float* x = logits + t * experts;
    float key[SLOTS], weight_of[SLOTS];
    unsigned allowed = 0;
#pragma unroll
    for (int i = 0; i < SLOTS; ++i) {
        int e = i * 32 + lane;
        key[i] = e < experts ? x[e] : 0.0f;
        weight_of[i] = key[i];
        if (e < experts) allowed |= 1u << i;
    }
    if (rule == 0) {
        float max = NEG_INF;
#pragma unroll
        for (int i = 0; i < SLOTS; ++i)
            if ((allowed >> i) & 1u) max = fmaxf(max, key[i]);
        max = warp_max(max);
#pragma unroll
        for (int i = 0; i < SLOTS; ++i) key[i] = expf(key[i] - max);
        // Summed in expert order in every lane, as the host reference sums; unrolled, so that
        // the shuffles are issued ahead of the adds that wait for them.
        float total = 0.0f;
#pragma unroll
        for (int i = 0; i < SLOTS; ++i)
#pragma unroll
            for (int l = 0; l < 32; ++l) {
                float v = __shfl_sync(FULL, key[i], l);
                if (i * 32 + l < experts) total += v;
            }
        float inv = 1.0f / total;
#pragma unroll
        for (int i = 0; i < SLOTS; ++i) weight_of[i] = key[i] = __fmul_rn(key[i], inv);
    } else if (rule == 4) {
#pragma unroll
        for (int i = 0; i < SLOTS; ++i) {
            int e = i * 32 + lane;
            weight_of[i] = sqrt_softplus(key[i]);
            key[i] = e < experts ? __fadd_rn(weight_of[i], bias[e]) : 0.0f;
        }
    } else if (rule == 1) {
        int size = experts / groups;
#pragma unroll
        for (int i = 0; i < SLOTS; ++i) {
            int e = i * 32 + lane;
            weight_of[i] = 1.0f / (1.0f + expf(-key[i]));
            key[i] = e < experts ? __fadd_rn(weight_of[i], bias[e]) : 0.0f;
        }
        // Each group's two best choices, merged over the lanes (the same in every lane).
        float gs[MAX_GROUPS];
        for (int g = 0; g < groups; ++g) {
            float a = NEG_INF, b = NEG_INF;
#pragma unroll
            for (int i = 0; i < SLOTS; ++i) {
                float c = key[i];
                if (((allowed >> i) & 1u) && (i * 32 + lane) / size == g) {
                    b = fmaxf(b, fminf(a, c));
                    a = fmaxf(a, c);
                }
            }
            for (int o = 16; o > 0; o >>= 1) {
                float a2 = __shfl_xor_sync(FULL, a, o), b2 = __shfl_xor_sync(FULL, b, o);
                b = fmaxf(fminf(a, a2), fmaxf(b, b2));
                a = fmaxf(a, a2);
            }
            gs[g] = size > 1 ? a + b : a;
        }
        unsigned long long mask = 0;
        for (int j = 0; j < top_groups; ++j) {
            int best = -1;
            for (int g = 0; g < groups; ++g)
                if (!((mask >> g) & 1ull) && (best < 0 || gs[g] > gs[best])) best = g;
            mask |= 1ull << best;
        }
#pragma unroll
        for (int i = 0; i < SLOTS; ++i)
            if (((allowed >> i) & 1u) && !((mask >> ((i * 32 + lane) / size)) & 1ull))
                allowed &= ~(1u << i);
    }
    // k rounds of the warp's best untaken allowed expert; lane j keeps pick j.
    unsigned taken = 0;
    int my_e = 0;
    float my_w = 0.0f, sum = 0.0f, first = 0.0f;
    for (int j = 0; j < k; ++j) {
        Pick p = {0.0f, -1};
        if (fixed) {
            p.e = (int)fixed[t * k + j];
        } else {
#pragma unroll
            for (int i = 0; i < SLOTS; ++i) {
                Pick c = {key[i], i * 32 + lane};
                if (((allowed & ~taken) >> i) & 1u && beats(c, p)) p = c;
            }
            p = warp_best(p);
            if (lane == p.e % 32) taken |= 1u << (p.e / 32);
        }
        float w = expert_value(weight_of, p.e);
        if (rule == 2) {
            // Pick 0 holds the largest logit: exp(x - max), then times the reciprocal of
            // their sum.
            if (j == 0) first = w;
            w = expf(w - first);
        }
        if (rule == 3) w = 1.0f / (1.0f + expf(-w));
        sum += w;
        if (lane == j) {
            my_e = p.e;
            my_w = w;
        }
    }
    if (lane >= k) return;
    float v;
    if (rule == 2) {
        v = __fmul_rn(my_w, 1.0f / sum);
    } else {
        if ((rule == 1 || rule == 4) && renorm) sum += eps;
        v = renorm ? my_w / sum : my_w;
        if (rule == 1 || rule == 4) v *= scale;
    }
    if (expert_scale) v *= expert_scale[my_e];
    ids[t * k + lane] = (u32)my_e;
    weights[t * k + lane] = v;
    atomicAdd(&counts[my_e], 1u);
}

#define ROUTE_TOPK(N, SLOTS)                                                                   \
    extern "C" __global__ void route_topk_##N(                                                 \
        const float* logits, const float* bias, const float* expert_scale, const u32* fixed,   \
        u32* ids, float* weights, u32* counts, int tokens, int experts, int k, int rule,       \
        int renorm, int groups, int top_groups, float scale, float eps) {                      \
        route_topk<SLOTS>(logits, bias, expert_scale, fixed, ids, weights, counts, tokens,     \
                          experts, k, rule, renorm, groups, top_groups, scale, eps);           \
    }
ROUTE_TOPK(128, 4)
ROUTE_TOPK(256, 8)
ROUTE_TOPK(512, 16)

// Each token's (expert, weight) pairs into their expert's group: `cursor` starts at each
// group's offset; `slots[i]` records where pick i (token i / k) went, for combine_experts.cu.
// A block's picks take their places among its picks of the same expert first (shared-memory
// atomics), then the block takes one range of places an expert from the cursors: every pick's
// own atomic on a cursor, the few hundred cursors contended by all of a layer's picks, cost
// more. The order inside a group is the order the atomics give; every token is in a group at
// most once, so results do not depend on it.
#define MAX_EXPERTS 512
extern "C" __global__ void route_fill(const u32* ids, const float* weights, u32* cursor,
                                      u32* rows, float* row_weights, u32* slots, int tokens,
                                      int k, int experts) {
    __shared__ u32 count[MAX_EXPERTS], base[MAX_EXPERTS];
    for (int e = threadIdx.x; e < experts; e += blockDim.x) count[e] = 0;
    __syncthreads();
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    bool live = i < (long long)tokens * k;
    u32 e = live ? ids[i] : 0, local = live ? atomicAdd(&count[e], 1u) : 0;
    __syncthreads();
    for (int x = threadIdx.x; x < experts; x += blockDim.x)
        if (count[x] > 0) base[x] = atomicAdd(&cursor[x], count[x]);
    __syncthreads();
    if (!live) return;
    u32 pos = base[e] + local;
    rows[pos] = (u32)(i / k);
    row_weights[pos] = weights[i];
    slots[i] = pos;
}
