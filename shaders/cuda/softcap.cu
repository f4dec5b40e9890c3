// x = cap * tanh(x / cap) in place, f32: Gemma 2's soft-capping of an output logits tile.
extern "C" __global__ void softcap(float* x, long long n, float cap) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = tanhf(x[i] / cap) * cap;
}
