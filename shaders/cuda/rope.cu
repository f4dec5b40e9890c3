// Rotate-half RoPE in place: x[t, h, i] and x[t, h, i + half] rotated by the angle of the
// token's position; cos/sin are f32 tables [max_position, half]. One thread per pair.
extern "C" __global__ void rope(bf16_t* x, const u32* positions, const float* cos_t,
                                const float* sin_t, int tokens, int heads, int head_dim) {
    int half = head_dim / 2;
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long long)tokens * heads * half) return;
    int k = (int)(i % half);
    long long th = i / half;  // token * heads + head
    long long t = th / heads;
    long long p = (long long)positions[t] * half + k;
    float c = cos_t[p], s = sin_t[p];
    bf16_t* v = x + th * head_dim;
    float a = bf16_to_f32(v[k]), b = bf16_to_f32(v[k + half]);
    v[k] = f32_to_bf16(a * c - b * s);
    v[k + half] = f32_to_bf16(b * c + a * s);
}
