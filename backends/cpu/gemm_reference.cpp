// sgemm backend for builds without a BLAS: the reference kernel (sgemm_ref's arithmetic, in
// register blocks: gemm_blocked.h). Supports everything; fast at nothing. Install
// libopenblas-dev for real speed.
#include "gemm.h"
#include "gemm_blocked.h"
#include "mutation.h"

namespace lab {

void sgemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a, int lda,
           const float* b, int ldb, float beta, float* c, int ldc) {
  sgemm_blocked(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
void gemm_set_threads(int threads) {
  sgemm_blocked_set_threads(mutated("gemm-one-thread") ? 1 : threads);  // a lesson's mutation test (mutation.h)
}
const char* gemm_backend_name() { return "reference"; }

}  // namespace lab
