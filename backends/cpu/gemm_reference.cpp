// sgemm backend for builds without a BLAS: forwards to the reference kernel in lab/.
// Supports everything; fast at nothing. Install libopenblas-dev for real speed.
#include "gemm.h"

namespace lab {

void sgemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a, int lda,
           const float* b, int ldb, float beta, float* c, int ldc) {
  sgemm_ref(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
void gemm_set_threads(int) {}
const char* gemm_backend_name() { return "reference"; }

}  // namespace lab
