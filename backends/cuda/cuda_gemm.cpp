#include "cuda_gemm.h"

#include "cuda_error.h"

namespace lab::cuda {

// cuBLAS is column-major. A row-major (M, N) matrix with row stride ldc is the column-major (N, M)
// matrix with the same stride, so the row-major C = op(A) op(B) is the column-major
// C^T = op(B)^T op(A)^T: swap the operands and the dimensions, keep each operand's transpose flag.
void sgemm(CudaContext& ctx, bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a, int lda,
           const float* b, int ldb, float beta, float* c, int ldc) {
  DTLAB_CUBLAS_CHECK(cublasSgemm(ctx.cublas(), trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,
                                 n, m, k, &alpha, b, ldb, a, lda, &beta, c, ldc));
}

}  // namespace lab::cuda
