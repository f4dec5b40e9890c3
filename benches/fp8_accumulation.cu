// docs/performance.md "W8A8 on the 8-bit tensor cores": how exactly cuBLASLt's FP8 GEMMs sum.
// Random E4M3 codes times per-channel and per-token scales (OUTER_VEC_32F, the layout of
// src/backend/cuda/gemm8.rs) against exact double sums, per inner size and FAST_ACCUM.
//   nvcc -O3 -o fp8_accumulation benches/fp8_accumulation.cu -lcublasLt && ./fp8_accumulation
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <cstdio>
#include <cmath>
#include <vector>
#include <random>
#include <cstring>
static float e4m3(unsigned char b) {
  int s = b >> 7, e = (b >> 3) & 15, m = b & 7;
  float v = e == 0 ? ldexpf(m, -9) : ldexpf(8 + m, e - 10);
  return s ? -v : v;
}
int main() {
  cublasLtHandle_t h; cublasLtCreate(&h);
  std::mt19937 rng(1);
  for (int k : {64, 256, 1024, 4096, 14336}) for (int fast : {0, 1}) for (int dt : {1, 0}) {
    const int m = 256, n = 256;
    std::vector<unsigned char> A(m * k), B(n * k);
    for (auto& v : A) { do v = rng() & 0xff; while ((v & 0x7f) == 0x7f); }
    for (auto& v : B) { do v = rng() & 0xff; while ((v & 0x7f) == 0x7f); }
    std::vector<float> sa(m), sb(n);
    for (auto& v : sa) v = 0.001f * (1 + rng() % 1000);
    for (auto& v : sb) v = 0.001f * (1 + rng() % 1000);
    void *dA, *dB, *dD, *dsa, *dsb, *ws; size_t wsz = 32 << 20;
    cudaMalloc(&dA, m * k); cudaMalloc(&dB, n * k); cudaMalloc(&dD, m * n * 4); cudaMalloc(&ws, wsz);
    cudaMalloc(&dsa, m * 4); cudaMalloc(&dsb, n * 4);
    cudaMemcpy(dA, A.data(), m * k, cudaMemcpyHostToDevice);
    cudaMemcpy(dB, B.data(), n * k, cudaMemcpyHostToDevice);
    cudaMemcpy(dsa, sa.data(), m * 4, cudaMemcpyHostToDevice);
    cudaMemcpy(dsb, sb.data(), n * 4, cudaMemcpyHostToDevice);
    cublasLtMatmulDesc_t desc; cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    int32_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N, sm = 3; int8_t fa = fast;
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, 4);
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, 4);
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fa, 1);
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &sm, 4);
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &sm, 4);
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &dsa, 8);
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &dsb, 8);
    cudaDataType_t dty = dt ? CUDA_R_32F : CUDA_R_16BF;
    cublasLtMatrixLayout_t la, lb, ld;
    cublasLtMatrixLayoutCreate(&la, CUDA_R_8F_E4M3, k, m, k);
    cublasLtMatrixLayoutCreate(&lb, CUDA_R_8F_E4M3, k, n, k);
    cublasLtMatrixLayoutCreate(&ld, dty, m, n, m);
    cublasLtMatmulPreference_t pref; cublasLtMatmulPreferenceCreate(&pref);
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsz, 8);
    cublasLtMatmulHeuristicResult_t res; int cnt = 0;
    cublasLtMatmulAlgoGetHeuristic(h, desc, la, lb, ld, ld, pref, 1, &res, &cnt);
    float al = 1, be = 0;
    cublasStatus_t r = cublasLtMatmul(h, desc, &al, dA, la, dB, lb, &be, dD, ld, dD, ld, &res.algo, ws, wsz, 0);
    cudaDeviceSynchronize();
    std::vector<float> D(m * n);
    if (dt) cudaMemcpy(D.data(), dD, m * n * 4, cudaMemcpyDeviceToHost);
    else {
      std::vector<unsigned short> b(m * n); cudaMemcpy(b.data(), dD, m * n * 2, cudaMemcpyDeviceToHost);
      for (int i = 0; i < m * n; i++) { unsigned u = (unsigned)b[i] << 16; memcpy(&D[i], &u, 4); }
    }
    double worst = 0, bias = 0;
    for (int j = 0; j < n; j++) for (int i = 0; i < m; i++) {
      double s = 0, sabs = 0;
      for (int t = 0; t < k; t++) { double p = (double)e4m3(A[i * k + t]) * e4m3(B[j * k + t]); s += p; sabs += fabs(p); }
      s *= (double)sa[i] * sb[j]; sabs *= (double)sa[i] * sb[j];
      double e = (D[j * m + i] - s) / sabs;
      worst = fmax(worst, fabs(e)); bias += (D[j * m + i] - s) / sabs * (s > 0 ? 1 : -1);
    }
    printf("k %5d fast %d D %s: status %d, max |err|/sum|p| %.3e, mean signed (toward |s|) %.3e\n", k, fast, dt ? "f32 " : "bf16", r, worst, bias / (m * n));
    cudaFree(dA); cudaFree(dB); cudaFree(dD); cudaFree(dsa); cudaFree(dsb); cudaFree(ws);
  }
  return 0;
}
