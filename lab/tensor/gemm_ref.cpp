// The readable reference sgemm (row-major). Slow and obviously right: faster backends are
// tested against it.
#include "gemm.h"

namespace lab {

void sgemm_ref(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a, int lda,
               const float* b, int ldb, float beta, float* c, int ldc) {
  for (int i = 0; i < m; ++i) {
    for (int j = 0; j < n; ++j) {
      float acc = 0.0f;
      for (int p = 0; p < k; ++p) {
        const float av = trans_a ? a[p * lda + i] : a[i * lda + p];
        const float bv = trans_b ? b[j * ldb + p] : b[p * ldb + j];
        acc += av * bv;
      }
      float& out = c[i * ldc + j];
      out = alpha * acc + (beta == 0.0f ? 0.0f : beta * out);
    }
  }
}

}  // namespace lab
