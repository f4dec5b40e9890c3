// Routing on the device, the rules of src/backend/routing.rs (the host reference): each
// token's top-k experts from its f32 router logits, then the tokens grouped by expert.
// Scores are ranked with strict comparisons over ascending expert index, so equal scores keep
// the lower index first, as torch.topk does on the CPU.

#define MAX_K 32
#define MAX_GROUPS 64
#define NEG_INF __int_as_float(0xff800000u)

// The expert among those `allowed` (bit e / group of e in `group_mask`) and not yet `taken`
// with the largest score(e); -1 when none is left.
template <typename Score>
__device__ int best_expert(Score score, int experts, int group_size, unsigned long long group_mask,
                           const int* taken, int n_taken) {
    int best = -1;
    float best_s = 0.0f;
    for (int e = 0; e < experts; ++e) {
        if (!((group_mask >> (e / group_size)) & 1ull)) continue;
        bool used = false;
        for (int j = 0; j < n_taken; ++j) used |= taken[j] == e;
        if (used) continue;
        float s = score(e);
        if (best < 0 || s > best_s) {
            best = e;
            best_s = s;
        }
    }
    return best;
}

// One thread per token: its k experts (ids, weights) and a count per expert.
// rule == 0: softmax over every expert, top k, weights renormalised when `renorm`.
// rule == 2: top k of the logits, weights a softmax over those k (gpt-oss).
// rule == 1: sigmoid scores; choice = score + bias; groups ranked by the sum of their two
// best choices, the `top_groups` best kept; top k of their experts by choice; weights the
// scores, renormalised (+1e-20) when `renorm`, times `scale`.
extern "C" __global__ void route_topk(const float* logits, const float* bias, u32* ids,
                                      float* weights, u32* counts, int tokens, int experts,
                                      int k, int rule, int renorm, int groups,
                                      int top_groups, float scale) {
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= tokens) return;
    const float* x = logits + (long long)t * experts;
    int taken[MAX_K];
    float w[MAX_K];
    float sum = 0.0f;
    if (rule == 2) {
        auto logit = [&](int e) { return x[e]; };
        for (int j = 0; j < k; ++j) taken[j] = best_expert(logit, experts, experts, 1ull, taken, j);
        // taken[0] holds the largest logit: exp(x - max) times the reciprocal of their sum.
        for (int j = 0; j < k; ++j) {
            w[j] = expf(x[taken[j]] - x[taken[0]]);
            sum += w[j];
        }
        float inv = 1.0f / sum;
        for (int j = 0; j < k; ++j) w[j] = __fmul_rn(w[j], inv);
    } else if (rule == 0) {
        float max = NEG_INF;
        for (int e = 0; e < experts; ++e) max = fmaxf(max, x[e]);
        float total = 0.0f;
        for (int e = 0; e < experts; ++e) total += expf(x[e] - max);
        float inv = 1.0f / total;
        auto p = [&](int e) { return __fmul_rn(expf(x[e] - max), inv); };
        for (int j = 0; j < k; ++j) {
            taken[j] = best_expert(p, experts, experts, 1ull, taken, j);
            w[j] = p(taken[j]);
            sum += w[j];
        }
    } else {
        auto score = [&](int e) { return 1.0f / (1.0f + expf(-x[e])); };
        auto choice = [&](int e) { return __fadd_rn(score(e), bias[e]); };
        int size = experts / groups;
        float gs[MAX_GROUPS];
        for (int g = 0; g < groups; ++g) {
            // The two best choices of the group (one when it holds one expert).
            float a = NEG_INF, b = NEG_INF;
            for (int e = g * size; e < (g + 1) * size; ++e) {
                float c = choice(e);
                if (c > a) {
                    b = a;
                    a = c;
                } else if (c > b) {
                    b = c;
                }
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
        for (int j = 0; j < k; ++j) {
            taken[j] = best_expert(choice, experts, size, mask, taken, j);
            w[j] = score(taken[j]);
            sum += w[j];
        }
        if (renorm) sum += 1e-20f;
    }
    for (int j = 0; j < k; ++j) {
        float v = renorm ? w[j] / sum : w[j];
        if (rule == 1) v *= scale;
        ids[(long long)t * k + j] = (u32)taken[j];
        weights[(long long)t * k + j] = v;
        atomicAdd(&counts[taken[j]], 1u);
    }
}

// Each token's (expert, weight) pairs into their expert's group: `cursor` starts at each
// group's offset; `slots[i]` records where pick i (token i / k) went, for combine_experts.cu.
// The order inside a group is the order the atomics give; every token is in a group at most
// once, so results do not depend on it.
extern "C" __global__ void route_fill(const u32* ids, const float* weights, u32* cursor,
                                      u32* rows, float* row_weights, u32* slots, int tokens,
                                      int k) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long long)tokens * k) return;
    u32 pos = atomicAdd(&cursor[ids[i]], 1u);
    rows[pos] = (u32)(i / k);
    row_weights[pos] = weights[i];
    slots[i] = pos;
}
