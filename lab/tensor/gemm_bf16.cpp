// The readable reference bf16 gemm (gemm_bf16.h): round each operand to bf16, multiply in
// float32 (exact for bf16 operands), add in order of p, then the epilogue. Slow and obviously
// right.
#include "gemm_bf16.h"

#include "bf16.h"

namespace lab {

void gemm_bf16_ref(bool trans_b, int m, int n, int k, const float* a, int lda, const float* b, int ldb, float* c,
                   int ldc, const Bf16Epilogue& ep) {
  for (int i = 0; i < m; ++i) {
    for (int j = 0; j < n; ++j) {
      float acc = 0.0f;
      for (int p = 0; p < k; ++p) {
        const float av = round_bf16(a[i * lda + p]);
        const float bv = round_bf16(trans_b ? b[j * ldb + p] : b[p * ldb + j]);
        acc += av * bv;
      }
      if (ep.bias) acc += ep.bias[ep.bias_per_row ? i : j];
      c[i * ldc + j] = ep.round ? round_bf16(acc) : acc;
    }
  }
}

}  // namespace lab
