// sgemm_blocked: the reference sgemm's arithmetic at a usable speed. Every element of C is
// computed exactly as lab's sgemm_ref computes it (lab/tensor/gemm.h):
//   acc = 0; acc += a_ip * b_pj for p = 0, 1, ..., K-1 (float32, each product rounded before it
//   is added); c_ij = alpha * acc + (beta == 0 ? 0 : beta * c_ij)
// so the result is the same bits as sgemm_ref's, whatever the shapes and the threads (tested bit
// for bit on random values, tests/test_gemm.cpp). Only the loops are arranged differently: a
// 1 x 32 block of C keeps its accumulators in registers while p runs, over contiguous copies of
// the block's rows of op(A) and columns of op(B), and threads take whole column blocks. About 10x
// the plain triple loop, a tenth of OpenBLAS.
//
// It is the kernel of the build without a BLAS (gemm_reference.cpp) and of DTLAB_SGEMM=reference
// in a build with OpenBLAS (gemm_choice.h): the second order of additions the lessons and tests
// are checked on without a second build.
#pragma once

namespace lab {

// Row-major, as sgemm (gemm.h). Uses up to sgemm_blocked_threads() threads.
void sgemm_blocked(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a, int lda,
                   const float* b, int ldb, float beta, float* c, int ldc);
// Threads one call may use (gemm_set_threads); 1 by default and for emulated ranks.
void sgemm_blocked_set_threads(int threads);
int sgemm_blocked_threads();

}  // namespace lab
