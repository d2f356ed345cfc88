// sgemm: the one dense kernel the lab's layers are built on (linear, and conv2d via im2col).
// Row-major, like cblas with CblasRowMajor:  C = alpha * op(A) * op(B) + beta * C
//   op(A): (M, K), op(B): (K, N), C: (M, N); lda/ldb/ldc are row strides.
// lab/ holds the readable reference (sgemm_ref). The executable links exactly one backend that
// defines sgemm(): backends/cpu/gemm_openblas.cpp (when a BLAS is found) or
// backends/cpu/gemm_reference.cpp, which forwards to sgemm_ref.
#pragma once

namespace lab {

void sgemm_ref(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a, int lda,
               const float* b, int ldb, float beta, float* c, int ldc);

// Backend implementation (see above).
void sgemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a, int lda,
           const float* b, int ldb, float beta, float* c, int ldc);

// Threads the backend may use inside one sgemm call (1 when ranks are threads).
void gemm_set_threads(int threads);
// "openblas 0.3.21 (Haswell)" or "reference": recorded in every run's header.
const char* gemm_backend_name();

}  // namespace lab
