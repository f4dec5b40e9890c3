// Dequantizes rows [row0, row0 + nrows) of one linear's packed weight into a bf16 scratch
// buffer (row-major, n_in wide), bit for bit the values of QLinear::dequantize_rows rounded
// to bf16: w = round_model(round_scale((q - z) * s)). One thread per 8 consecutive weights of
// a row, stored with one 16-byte write when the row width allows it.

#define PER 8

// (row, first column) of this thread's chunk; false when past the end.
__device__ __forceinline__ bool chunk(int nrows, int n_in, long long* r, int* c0) {
    long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    int chunks = (n_in + PER - 1) / PER;
    if (idx >= (long long)nrows * chunks) return false;
    *r = idx / chunks;
    *c0 = (int)(idx % chunks) * PER;
    return true;
}

// Writes v[0..PER) to out row r (local index) from column c0.
__device__ __forceinline__ void store(bf16_t* out, long long r, int c0, int n_in, const float* v) {
    bf16_t* o = out + r * n_in + c0;
    if ((n_in & (PER - 1)) == 0) {
        uint4 pk;
        pk.x = (u32)f32_to_bf16(v[0]) | ((u32)f32_to_bf16(v[1]) << 16);
        pk.y = (u32)f32_to_bf16(v[2]) | ((u32)f32_to_bf16(v[3]) << 16);
        pk.z = (u32)f32_to_bf16(v[4]) | ((u32)f32_to_bf16(v[5]) << 16);
        pk.w = (u32)f32_to_bf16(v[6]) | ((u32)f32_to_bf16(v[7]) << 16);
        *(uint4*)o = pk;
    } else {
        for (int j = 0; j < PER && c0 + j < n_in; ++j) o[j] = f32_to_bf16(v[j]);
    }
}

// Scale strategy codes (Rust: kernels/dequant.rs): 0 tensor, 1 channel, 2 group, 3 block.
__device__ __forceinline__ void scale_index(int strategy, int group, int block_h, int block_w,
                                            const int* g_idx, long long r, int c, int n_in,
                                            long long* si, long long* zi) {
    if (strategy == 0) { *si = 0; *zi = 0; }
    else if (strategy == 1) { *si = r; *zi = 0; }
    else if (strategy == 2) {
        int n_groups = (n_in + group - 1) / group;
        int gi = g_idx ? g_idx[c] : c / group;
        *si = r * n_groups + gi;
        *zi = gi;
    } else {
        int ncb = (n_in + block_w - 1) / block_w;
        long long i = (r / block_h) * ncb + c / block_w;
        *si = i;
        *zi = i;
    }
}

// compressed-tensors pack-quantized: unsigned codes q + 2^(bits-1), LSB first, either a dense
// bitstream (legacy_per == 0) or `legacy_per` codes per 32-bit word. `zeros` are signed zero
// points [out, zero_cols] (or one value when zeros_len == 1), null when symmetric.
extern "C" __global__ void dequant_int(bf16_t* out, const u32* packed, const float* scales,
                                       const int* zeros, long long zeros_len, int zero_cols,
                                       const int* g_idx, int row0, int nrows, int n_in,
                                       int words_per_row, int bits, int legacy_per, int strategy,
                                       int group, int block_h, int block_w, int scale_dt,
                                       int model_dt) {
    long long lr;
    int c0;
    if (!chunk(nrows, n_in, &lr, &c0)) return;
    long long r = row0 + lr;
    const u32* row = packed + r * words_per_row;
    u32 mask = (1u << bits) - 1u;
    float vals[PER];
#pragma unroll
    for (int j = 0; j < PER; ++j) {
        int c = c0 + j;
        vals[j] = 0.0f;
        if (c >= n_in) continue;
        u32 code;
        if (legacy_per > 0) {
            code = (row[c / legacy_per] >> (bits * (c % legacy_per))) & mask;
        } else {
            long long bit = (long long)c * bits;
            int w = (int)(bit >> 5), off = (int)(bit & 31);
            u32 v = row[w] >> off;
            if (off + bits > 32) v |= row[w + 1] << (32 - off);
            code = v & mask;
        }
        int q = (int)code - (1 << (bits - 1));
        long long si, zi;
        scale_index(strategy, group, block_h, block_w, g_idx, r, c, n_in, &si, &zi);
        int z = 0;
        if (zeros) z = zeros_len == 1 ? zeros[0] : zeros[r * zero_cols + zi];
        float w = round_to(scale_dt, (float)(q - z) * scales[si]);
        vals[j] = round_to(model_dt, w);
    }
    store(out, lr, c0, n_in, vals);
}

// NVFP4: two E2M1 codes per byte (low nibble first), an FP8 scale per 16 weights and a global
// divisor: W = RN_bf16(e2m1 * (s / global_scale)) with an IEEE f32 division.
extern "C" __global__ void dequant_nvfp4(bf16_t* out, const u8* packed, const u8* scales,
                                         float global_scale, int row0, int nrows, int n_in,
                                         int model_dt) {
    long long lr;
    int c0;
    if (!chunk(nrows, n_in, &lr, &c0)) return;
    long long r = row0 + lr;
    const float e2m1[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    // n_in is a multiple of 16, so the 8 weights share one scale.
    float s_eff = __fdiv_rn(fp8_e4m3_to_f32(scales[r * (n_in / 16) + c0 / 16]), global_scale);
    float vals[PER];
#pragma unroll
    for (int j = 0; j < PER; ++j) {
        int c = c0 + j;
        u8 byte = packed[r * (n_in / 2) + c / 2];
        u8 code = (c & 1) ? (byte >> 4) : (byte & 0xf);
        float e = e2m1[code & 7];
        if (code & 8) e = -e;
        vals[j] = round_to(model_dt, round_bf16(e * s_eff));
    }
    store(out, lr, c0, n_in, vals);
}

// One FP8 E4M3 (is_int8 == 0) or INT8 code per weight; zero points as f32 per scale, or null.
extern "C" __global__ void dequant_unpacked(bf16_t* out, const u8* weight, int is_int8,
                                            const float* scales, const float* zeros, int row0,
                                            int nrows, int n_in, int strategy, int group,
                                            int block_h, int block_w, int scale_dt,
                                            int model_dt) {
    long long lr;
    int c0;
    if (!chunk(nrows, n_in, &lr, &c0)) return;
    long long r = row0 + lr;
    float vals[PER];
#pragma unroll
    for (int j = 0; j < PER; ++j) {
        int c = c0 + j;
        vals[j] = 0.0f;
        if (c >= n_in) continue;
        u8 raw = weight[r * n_in + c];
        float v = is_int8 ? (float)(signed char)raw : fp8_e4m3_to_f32(raw);
        long long si, zi;
        scale_index(strategy, group, block_h, block_w, 0, r, c, n_in, &si, &zi);
        float z = zeros ? zeros[si] : 0.0f;
        vals[j] = round_to(model_dt, round_to(scale_dt, (v - z) * scales[si]));
    }
    store(out, lr, c0, n_in, vals);
}
