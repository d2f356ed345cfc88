// sgemm on the GPU with cuBLAS, in the lab's row-major convention (gemm.h):
//   C = alpha * op(A) * op(B) + beta * C,  op(A): (M, K), op(B): (K, N), C: (M, N)
// lda/ldb/ldc are row strides; every pointer is device memory. IEEE fp32 unless the context
// allows TF32 (cuda_context.h). Queued on the context's stream.
#pragma once

#include "cuda_context.h"

namespace lab::cuda {

void sgemm(CudaContext& ctx, bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a, int lda,
           const float* b, int ldb, float beta, float* c, int ldc);

}  // namespace lab::cuda
