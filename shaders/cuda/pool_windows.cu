// DeepSeek-V4's compressors (`Backend::pool_windows`): entry e of a sequence (row start + e of
// the output, f32) pools the tokens of its window of `rate`, value by value: the softmax over
// the window's slots (in f32: exp(x - max) over their sum) of gate + bias[slot] weighing kv.
// With `overlap` kv and gate hold 2w values a token and entry e pools the first halves of
// window e - 1 (slots 0..rate; none for the first entry) with the second halves of window e.
// Rows past a sequence's whole windows are zero. A thread a value; `seq_start` the first row of
// each row's sequence.

// Slot s of entry e (its window's first row `first`): its row and the column offset and bias
// row it reads; false where the slot is empty (the first entry's earlier window).
__device__ __forceinline__ bool pool_slot(int s, long long e, long long first, int rate,
                                          int overlap, int w, long long* row, int* off, int* b) {
    if (!overlap) {
        *row = first + s; *off = 0; *b = s;
    } else if (s < rate) {
        if (e == 0) return false;
        *row = first - rate + s; *off = 0; *b = s;
    } else {
        *row = first + s - rate; *off = w; *b = s - rate;
    }
    return true;
}

template <typename T>
__device__ void pool_windows_t(float* out, const T* kv, const T* gate, const float* bias,
                               const u32* seq_start, long long rows, int w, int rate,
                               int overlap) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= rows * w) return;
    long long r = i / w;
    int c = (int)(i % w);
    long long start = seq_start[r], e = r - start, first = start + e * rate;
    // The window's last token lies in the same sequence (the batch's rows are its tokens).
    long long last = first + rate - 1;
    if (last >= rows || seq_start[last] != start) {
        out[i] = 0.0f;
        return;
    }
    int cols = overlap ? 2 * w : w, slots = overlap ? 2 * rate : rate;
    long long row;
    int off, b;
    float mx = -__int_as_float(0x7f800000);
    for (int s = 0; s < slots; ++s)
        if (pool_slot(s, e, first, rate, overlap, w, &row, &off, &b))
            mx = fmaxf(mx, __fadd_rn(ld(gate, row * cols + off + c), bias[b * cols + off + c]));
    float sum = 0.0f;
    for (int s = 0; s < slots; ++s)
        if (pool_slot(s, e, first, rate, overlap, w, &row, &off, &b)) {
            float g = __fadd_rn(ld(gate, row * cols + off + c), bias[b * cols + off + c]);
            sum = __fadd_rn(sum, expf(g - mx));
        }
    float acc = 0.0f;
    for (int s = 0; s < slots; ++s)
        if (pool_slot(s, e, first, rate, overlap, w, &row, &off, &b)) {
            float g = __fadd_rn(ld(gate, row * cols + off + c), bias[b * cols + off + c]);
            acc = __fadd_rn(acc, __fmul_rn(ld(kv, row * cols + off + c), expf(g - mx) / sum));
        }
    out[i] = acc;
}

#define POOL_ENTRY(IN, TIN)                                                                   \
    extern "C" __global__ void pool_windows_##IN(                                             \
        float* out, const TIN* kv, const TIN* gate, const float* bias,                        \
        const u32* seq_start, long long rows, int w, int rate, int overlap) {            \
        pool_windows_t(out, kv, gate, bias, seq_start, rows, w, rate, overlap);               \
    }

POOL_ENTRY(bf16, bf16_t)
POOL_ENTRY(f32, float)
