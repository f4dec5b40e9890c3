// nvrtc: exact
// DeepSeek-V4's hyper-connection weights (`Backend::hyper_weights`; the host reference
// src/backend/compressed.rs `HyperRule::weights`, whose operations and their order this
// follows): from `fn`'s f32 outputs v (`(2 + n) * n` a token) and their bias `base`,
// pre = sigmoid(v * s_pre + base) + eps, post = 2 sigmoid(v * s_post + base), and comb: each
// of its n rows the softmax of v * s_comb + base, plus eps, then made doubly stochastic
// (columns, then `iters - 1` times rows and columns, each sum plus eps). A thread a token.

#define MAX_STREAMS 8

__device__ __forceinline__ float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

extern "C" __global__ void hyper_weights(float* pre, float* post, float* comb, const float* v,
                                         const float* base, long long tokens, int n, float s_pre,
                                         float s_post, float s_comb, float eps, int iters) {
    long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= tokens) return;
    const float* row = v + t * (2 + n) * n;
    for (int i = 0; i < n; ++i) {
        pre[t * n + i] = sigmoid(row[i] * s_pre + base[i]) + eps;
        post[t * n + i] = 2.0f * sigmoid(row[n + i] * s_post + base[n + i]);
    }
    float m[MAX_STREAMS * MAX_STREAMS];
    for (int j = 0; j < n; ++j) {
        float* mj = m + j * n;
        float max = __int_as_float(0xff800000u);
        for (int k = 0; k < n; ++k) {
            int at = 2 * n + j * n + k;
            mj[k] = row[at] * s_comb + base[at];
            max = fmaxf(max, mj[k]);
        }
        float sum = 0.0f;
        for (int k = 0; k < n; ++k) {
            mj[k] = expf(mj[k] - max);
            sum += mj[k];
        }
        float inv = 1.0f / sum;
        for (int k = 0; k < n; ++k) mj[k] = mj[k] * inv + eps;
    }
    // The columns once however few passes are asked for, as the reference.
    for (int it = 0; it < max(iters, 1); ++it) {
        if (it > 0) {
            for (int j = 0; j < n; ++j) {
                float sum = 0.0f;
                for (int k = 0; k < n; ++k) sum += m[j * n + k];
                sum += eps;
                for (int k = 0; k < n; ++k) m[j * n + k] /= sum;
            }
        }
        for (int k = 0; k < n; ++k) {
            float sum = 0.0f;
            for (int j = 0; j < n; ++j) sum += m[j * n + k];
            sum += eps;
            for (int j = 0; j < n; ++j) m[j * n + k] /= sum;
        }
    }
    for (int i = 0; i < n * n; ++i) comb[t * n * n + i] = m[i];
}
