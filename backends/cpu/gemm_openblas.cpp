// sgemm backend over OpenBLAS's cblas_sgemm. Supports: row-major float32, any transposes.
// Thread count is global to OpenBLAS; with emulated ranks every rank thread calls sgemm
// concurrently with OpenBLAS set to one thread.
// DTLAB_SGEMM=reference (gemm_choice.h) replaces it by the reference kernel for the whole process.
#include <cblas.h>

#include <cstdio>
#include <string>

#include "gemm.h"
#include "gemm_blocked.h"
#include "gemm_choice.h"
#include "mutation.h"

namespace lab {

void sgemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a, int lda,
           const float* b, int ldb, float beta, float* c, int ldc) {
  if (m == 0 || n == 0) return;
  if (m > 1 && mutated("sgemm-row-by-row")) {  // a lesson's mutation test (mutation.h)
    // Row i of op(A) starts at a + i (a column of A) when transposed, else at row i.
    for (int i = 0; i < m; ++i)
      sgemm(trans_a, trans_b, 1, n, k, alpha, trans_a ? a + i : a + static_cast<long>(i) * lda, lda, b, ldb, beta,
            c + static_cast<long>(i) * ldc, ldc);
    return;
  }
  if (sgemm_choice() == SgemmChoice::Reference) {
    sgemm_blocked(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, m, n, k,
              alpha, a, lda, b, ldb, beta, c, ldc);
}

void gemm_set_threads(int threads) {
  if (mutated("gemm-one-thread")) threads = 1;  // a lesson's mutation test (mutation.h)
  if (sgemm_choice() == SgemmChoice::Reference) sgemm_blocked_set_threads(threads);
  else openblas_set_num_threads(threads < 1 ? 1 : threads);
}

const char* gemm_backend_name() {
  static std::string name = [] {
    if (sgemm_choice() == SgemmChoice::Reference) return std::string("reference (DTLAB_SGEMM=reference)");
    std::string s = "openblas";
    const char* core = openblas_get_corename();
    if (core) s += std::string(" (") + core + ")";
    return s;
  }();
  return name.c_str();
}

}  // namespace lab
