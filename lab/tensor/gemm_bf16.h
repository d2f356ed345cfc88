// gemm_bf16: the matrix product of PyTorch's CPU autocast (torch.autocast("cpu", torch.bfloat16)):
// both operands rounded to bfloat16 (bf16.h), products and sums in float32, a float32 result.
// Row-major:  C = epilogue(bf16(A) * bf16(op(B)))
//   A: (M, K), row stride lda (no transpose: the layers never need one)
//   op(B): (K, N); B is stored (K, N) with row stride ldb, or (N, K) when trans_b
//   C: (M, N), row stride ldc, overwritten
//   epilogue (Bf16Epilogue), in float32 on each sum: + bias (per row or per column), then rounded
//   to bf16 when asked: what PyTorch's bf16 addmm / convolution do with their float32
//   accumulators (the bias, itself a bf16 value, is added before the one rounding).
// Every product of two bf16 values is exact in float32 (8 x 8 significant bits), so the
// implementations below differ only in the order they add the products in (and in the AVX512
// kernel's flushing of subnormals): tests compare them with a summation-order tolerance, and bit
// for bit on inputs whose sums are exact.
//
// lab/ holds the readable reference (gemm_bf16_ref, gemm_bf16.cpp). The backend
// (backends/cpu/gemm_bf16_avx512.cpp) defines gemm_bf16(): an AVX512-BF16 kernel (VDPBF16PS)
// when the CPU has the instruction, else the float32 sgemm on bf16-rounded copies of the operands.
#pragma once

namespace lab {

// What happens to each float32 sum acc_ij before it is stored.
struct Bf16Epilogue {
  const float* bias = nullptr;  // acc_ij + bias[i] (bias_per_row) or + bias[j]; nullptr: no bias.
                                // Autocast passes a bias already rounded to bf16.
  bool bias_per_row = false;    // Conv2d: one bias per output channel = row; Linear: per column
  bool round = false;           // store round_bf16(acc_ij + bias) instead of the float32 value
};

// The reference: for every (i, j), acc = sum over p = 0, 1, ..., K-1 of bf16(a_ip) * bf16(b_pj),
// added in that order in float32, then the epilogue.
void gemm_bf16_ref(bool trans_b, int m, int n, int k, const float* a, int lda, const float* b, int ldb, float* c,
                   int ldc, const Bf16Epilogue& ep = {});

// Backend implementation (see above): the fastest kernel this CPU runs.
void gemm_bf16(bool trans_b, int m, int n, int k, const float* a, int lda, const float* b, int ldb, float* c, int ldc,
               const Bf16Epilogue& ep = {});
// "avx512-bf16" or "sgemm on bf16-rounded operands": which kernel gemm_bf16() runs here.
const char* gemm_bf16_kernel_name();

// The backend's kernels one by one, for tests and benchmarks.
// True when this CPU has AVX512-BF16 (and AVX512F/BW/VL) and the compiler could build the kernel.
bool gemm_bf16_avx512_supported();
// The AVX512-BF16 kernel; only when gemm_bf16_avx512_supported(). For every (i, j) it adds the
// products in pairs (p = 2q, 2q + 1), q = 0, 1, ..., one VDPBF16PS per pair, with subnormal
// operands and results flushed to zero (the instruction's DAZ/FTZ); the epilogue runs in registers.
void gemm_bf16_avx512(bool trans_b, int m, int n, int k, const float* a, int lda, const float* b, int ldb, float* c,
                      int ldc, const Bf16Epilogue& ep = {});
// The portable path: rounds copies of A and B to bf16, calls sgemm() (gemm.h), then the epilogue.
void gemm_bf16_sgemm(bool trans_b, int m, int n, int k, const float* a, int lda, const float* b, int ldb, float* c,
                     int ldc, const Bf16Epilogue& ep = {});

}  // namespace lab
