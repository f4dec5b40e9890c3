// What an INT8 weight's codes miss of the reference's weight, as a second INT8 operand: the
// reference rounds `code * scale` to bf16 (the scale's dtype) before the product, so with the
// scale s = M * u (M its 8-bit significand, u a power of two, `unit`) the weight is
// u * (M * code + R), R = (bf16(code * s) - code * s) / u: an integer of at most 64 in
// magnitude (code * M has at most 15 significant bits, bf16 keeps 8). Every step is exact in
// f32. The linear's sums are then s * (x . codes) + u * (x . R), both exact in int32.
extern "C" __global__ void int8_residual(signed char* out, const signed char* codes,
                                         const float* scale, const float* unit, int n_out,
                                         int n_in) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long long)n_out * n_in) return;
    int r = (int)(i / n_in);
    float v = (float)codes[i] * scale[r];
    out[i] = (signed char)(int)((round_bf16(v) - v) / unit[r]);
}
