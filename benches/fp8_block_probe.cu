// docs/performance.md "FP8 block scales": how cuBLASLt reads 128x128 weight-block scales
// (BLK128x128_32F on A) and 1x128 token-group scales (VEC128_32F on B) in the layout of
// src/backend/cuda/gemm8.rs (A = the weight read transposed, B = the input, D = y^T in
// column-major terms), and what the block-scaled products cost against per-channel scales.
// Unit codes with power-of-two scales: every output is a sum of two exactly representable
// terms, so one layout guess matches exactly and the others cannot.
//   nvcc -O3 -o fp8_block_probe benches/fp8_block_probe.cu -lcublasLt && ./fp8_block_probe
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <cstdio>
#include <cmath>
#include <vector>
#include <chrono>
#include <cstring>

struct Gemm {
  cublasLtMatmulDesc_t desc;
  cublasLtMatrixLayout_t la, lb, ld;
  cublasLtMatmulHeuristicResult_t res;
  cublasStatus_t status;
};

static Gemm plan(cublasLtHandle_t h, int m, int n, int k, int mode_a, int mode_b, void* sa,
                 void* sb, size_t wsz) {
  Gemm g;
  cublasLtMatmulDescCreate(&g.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
  int32_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  int8_t fa = 0;
  cublasLtMatmulDescSetAttribute(g.desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, 4);
  cublasLtMatmulDescSetAttribute(g.desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, 4);
  cublasLtMatmulDescSetAttribute(g.desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fa, 1);
  cublasLtMatmulDescSetAttribute(g.desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &mode_a, 4);
  cublasLtMatmulDescSetAttribute(g.desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mode_b, 4);
  cublasLtMatmulDescSetAttribute(g.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sa, 8);
  cublasLtMatmulDescSetAttribute(g.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sb, 8);
  cublasLtMatrixLayoutCreate(&g.la, CUDA_R_8F_E4M3, k, m, k);
  cublasLtMatrixLayoutCreate(&g.lb, CUDA_R_8F_E4M3, k, n, k);
  cublasLtMatrixLayoutCreate(&g.ld, CUDA_R_16BF, m, n, m);
  cublasLtMatmulPreference_t pref;
  cublasLtMatmulPreferenceCreate(&pref);
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsz, 8);
  int cnt = 0;
  g.status = cublasLtMatmulAlgoGetHeuristic(h, g.desc, g.la, g.lb, g.ld, g.ld, pref, 1, &g.res, &cnt);
  if (g.status == CUBLAS_STATUS_SUCCESS && cnt == 0) g.status = CUBLAS_STATUS_NOT_SUPPORTED;
  return g;
}

static float bf16_to_f32(unsigned short b) {
  unsigned u = (unsigned)b << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

int main() {
  cublasLtHandle_t h;
  cublasLtCreate(&h);
  size_t wsz = 32 << 20;
  void* ws;
  cudaMalloc(&ws, wsz);
  // m = weight channels (2 blocks), n = tokens, k = inputs (2 groups; the weight's k-block
  // count 2 is padded to 4 in the guessed layout).
  const int m = 256, n = 64, k = 256, mb = m / 128, kb = k / 128, ld_kb = (kb + 3) / 4 * 4;
  std::vector<unsigned char> A(m * k, 0x38), B(n * k, 0x38);  // every code 1.0
  std::vector<float> sa(mb * ld_kb, 0.0f), sb(kb * n);
  auto wscale = [](int bm, int bk) { return ldexpf(1.0f, bm + 3 * bk); };
  auto xscale = [](int t, int g) { return ldexpf(1.0f, -(t % 8) - 5 * g); };
  for (int bm = 0; bm < mb; bm++)
    for (int bk = 0; bk < kb; bk++) sa[bm * ld_kb + bk] = wscale(bm, bk);
  for (int g = 0; g < kb; g++)
    for (int t = 0; t < n; t++) sb[g * n + t] = xscale(t, g);
  void *dA, *dB, *dD, *dsa, *dsb;
  cudaMalloc(&dA, m * k); cudaMalloc(&dB, n * k); cudaMalloc(&dD, m * n * 2);
  cudaMalloc(&dsa, sa.size() * 4); cudaMalloc(&dsb, sb.size() * 4);
  cudaMemcpy(dA, A.data(), A.size(), cudaMemcpyHostToDevice);
  cudaMemcpy(dB, B.data(), B.size(), cudaMemcpyHostToDevice);
  cudaMemcpy(dsa, sa.data(), sa.size() * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(dsb, sb.data(), sb.size() * 4, cudaMemcpyHostToDevice);
  const int VEC128 = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
  const int BLK = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
  const int OUTER = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
  Gemm g = plan(h, m, n, k, BLK, VEC128, dsa, dsb, wsz);
  printf("cuBLASLt %zu, A BLK128x128 / B VEC128 heuristic: status %d\n", cublasLtGetVersion(), (int)g.status);
  if (g.status != CUBLAS_STATUS_SUCCESS) return 0;
  float al = 1, be = 0;
  cublasStatus_t r = cublasLtMatmul(h, g.desc, &al, dA, g.la, dB, g.lb, &be, dD, g.ld, dD, g.ld,
                                    &g.res.algo, ws, wsz, 0);
  cudaDeviceSynchronize();
  std::vector<unsigned short> D(m * n);
  cudaMemcpy(D.data(), dD, D.size() * 2, cudaMemcpyDeviceToHost);
  int bad = 0;
  for (int t = 0; t < n; t++)
    for (int c = 0; c < m; c++) {
      float want = 0;
      for (int bk = 0; bk < kb; bk++) want += 128.0f * wscale(c / 128, bk) * xscale(t, bk);
      float got = bf16_to_f32(D[t * m + c]);
      if (got != want) {
        if (bad < 4) printf("  y[token %d, channel %d] = %g, want %g\n", t, c, got, want);
        bad++;
      }
    }
  printf("matmul status %d; layout (A: block row * round_up(k blocks, 4) + k block; B: group * "
         "tokens + token): %d of %d outputs differ\n", (int)r, bad, m * n);
  // Which token counts cuBLASLt's block-scaled kernels take (B's columns).
  printf("tokens with a kernel:");
  for (int t : {1, 2, 3, 4, 8, 12, 16, 17, 24, 32, 48, 64, 65, 100, 128, 129})
    if (plan(h, m, t, k, BLK, VEC128, dsa, dsb, wsz).status == CUBLAS_STATUS_SUCCESS) printf(" %d", t);
  printf("\n");
  // Cost: the 8B's gate/up and down shapes at 8,192 tokens, block scales against per-channel.
  for (auto [M, K] : {std::pair{28672, 4096}, std::pair{4096, 14336}}) {
    const int N = 8192;
    void *a, *b, *d, *s1, *s2;
    cudaMalloc(&a, (size_t)M * K); cudaMalloc(&b, (size_t)N * K); cudaMalloc(&d, (size_t)M * N * 2);
    cudaMalloc(&s1, (size_t)M * K / 128 * 4 + 4096); cudaMalloc(&s2, (size_t)N * K / 128 * 4 + 4096);
    cudaMemset(a, 0x38, (size_t)M * K); cudaMemset(b, 0x38, (size_t)N * K);
    cudaMemset(s1, 0, (size_t)M * K / 128 * 4); cudaMemset(s2, 0, (size_t)N * K / 128 * 4);
    for (int blk : {0, 1}) {
      Gemm p = blk ? plan(h, M, N, K, BLK, VEC128, s1, s2, wsz) : plan(h, M, N, K, OUTER, OUTER, s1, s2, wsz);
      if (p.status != CUBLAS_STATUS_SUCCESS) { printf("%dx%dx%d %s: no kernel\n", M, N, K, blk ? "block" : "outer"); continue; }
      for (int i = 0; i < 3; i++)
        cublasLtMatmul(h, p.desc, &al, a, p.la, b, p.lb, &be, d, p.ld, d, p.ld, &p.res.algo, ws, wsz, 0);
      cudaDeviceSynchronize();
      auto t0 = std::chrono::steady_clock::now();
      const int it = 20;
      for (int i = 0; i < it; i++)
        cublasLtMatmul(h, p.desc, &al, a, p.la, b, p.lb, &be, d, p.ld, d, p.ld, &p.res.algo, ws, wsz, 0);
      cudaDeviceSynchronize();
      double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / it;
      printf("%d x %d x %d %-22s %.3f ms  %.0f TFLOP/s\n", M, N, K,
             blk ? "BLK128x128 / VEC128" : "OUTER_VEC / OUTER_VEC", s * 1e3, 2.0 * M * N * K / s / 1e12);
    }
    cudaFree(a); cudaFree(b); cudaFree(d); cudaFree(s1); cudaFree(s2);
  }
  return 0;
}
