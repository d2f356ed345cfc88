// gemm_bf16 backend (gemm_bf16.h): an AVX512-BF16 kernel where the CPU has the instruction, the
// float32 sgemm on bf16-rounded operands elsewhere. Debian's OpenBLAS 0.3.21 exports no sbgemm,
// hence a kernel of our own.
//
// Supports: row-major, A not transposed, B either way, any M, N, K (K odd: padded with a zero),
// the epilogue (bias per row or column, rounding to bf16). Single-threaded: the layers call it
// from their parallel_for slices.
//
// The AVX512 kernel (VDPBF16PS, compiled with a target attribute so that any x86-64 compiler
// and CPU builds this file; chosen at run time by CPUID through __builtin_cpu_supports):
//   1. packs A to bf16 rows, Ap: (M, Kp) with Kp = K rounded up to even; one 32-bit word holds
//      the pair (a_i,2q, a_i,2q+1);
//   2. packs op(B) to bf16 "VNNI" panels of 16 columns, Bp: (panels, Kp / 2, 16) 32-bit words,
//      word (q, j) holding the pair (b_2q,j, b_2q+1,j);
//   3. per tile of 6 rows x 4 panels (64 columns): 24 zmm accumulators; for q = 0, 1, ...: load
//      the 4 panels' words q, broadcast each row's pair q, one VDPBF16PS per (row, panel), which
//      adds both products of the pair to the float32 lane (DAZ/FTZ, round to nearest even);
//   4. adds the bias and rounds to bf16 in registers (the epilogue), stores, masked at the
//      right edge.
// The whole K stays in the tile loop (the models' B panels fit the L2 cache), so each output's
// sum runs in one order: pair 0, pair 1, ... Rounding uses integer adds (round_bf16's rule), not
// VCVTNEPS2BF16, which would flush subnormal inputs to zero.
//
// The portable path (no AVX512-BF16, or an old compiler): round copies of A and B, then sgemm().
// Chosen over a blocked loop of our own because OpenBLAS's sgemm is the fastest float32 kernel
// here and is already tested against sgemm_ref; its products of bf16 values are exact, so it
// differs from gemm_bf16_ref only in the order of the sum (FMA or not makes no difference).
#include <algorithm>
#include <cassert>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "bf16.h"
#include "gemm.h"
#include "gemm_bf16.h"

#if defined(__x86_64__) && ((defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 11) || \
                            (defined(__clang__) && __clang_major__ >= 12))
#define DTLAB_BF16_AVX512 1
#include <immintrin.h>
#define DTLAB_TARGET_BF16 __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512bf16")))
#endif

namespace lab {

void gemm_bf16_sgemm(bool trans_b, int m, int n, int k, const float* a, int lda, const float* b, int ldb, float* c,
                     int ldc, const Bf16Epilogue& ep) {
  if (m <= 0 || n <= 0) return;
  thread_local std::vector<float> ar, br;  // rounded copies: (M, K) and (K, N) or (N, K)
  const int b_rows = trans_b ? n : k, b_cols = trans_b ? k : n;
  ar.resize(static_cast<size_t>(m) * k);
  br.resize(static_cast<size_t>(b_rows) * b_cols);
  for (int i = 0; i < m; ++i)
    for (int p = 0; p < k; ++p) ar[static_cast<size_t>(i) * k + p] = round_bf16(a[static_cast<size_t>(i) * lda + p]);
  for (int r = 0; r < b_rows; ++r)
    for (int s = 0; s < b_cols; ++s)
      br[static_cast<size_t>(r) * b_cols + s] = round_bf16(b[static_cast<size_t>(r) * ldb + s]);
  sgemm(false, trans_b, m, n, k, 1.0f, ar.data(), std::max(1, k), br.data(), std::max(1, b_cols), 0.0f, c, ldc);
  if (!ep.bias && !ep.round) return;
  for (int i = 0; i < m; ++i) {
    float* row = c + static_cast<size_t>(i) * ldc;
    if (ep.bias)
      for (int j = 0; j < n; ++j) row[j] += ep.bias[ep.bias_per_row ? i : j];
    if (ep.round) round_bf16(row, static_cast<size_t>(n));
  }
}

#ifdef DTLAB_BF16_AVX512

namespace {

constexpr int kRows = 6;    // MR: rows of a tile
constexpr int kPanels = 4;  // NR: 16-column panels of a tile

// 16 floats (as 32-bit lanes) -> their bf16 bits in the low half of each lane: bf16.h's rule.
DTLAB_TARGET_BF16 inline __m512i bf16_lanes(__m512i u) {
  const __m512i lsb = _mm512_and_si512(_mm512_maskz_srli_epi32(0xFFFF, u, 16), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF)));
  const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7FFFFFFF)),
                                                _mm512_set1_epi32(0x7F800000));
  const __m512i q = _mm512_mask_mov_epi32(rounded, nan, _mm512_or_si512(u, _mm512_set1_epi32(0x00400000)));
  return _mm512_maskz_srli_epi32(0xFFFF, q, 16);
}

DTLAB_TARGET_BF16 inline __mmask16 first_lanes(int count) {
  return count >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << count) - 1u);
}

// src rows (rows, k), row stride ld -> dst (rows, kp2) bf16 bits, zero-padded to kp2 (even).
DTLAB_TARGET_BF16 void pack_rows(const float* src, int rows, int k, int ld, uint16_t* dst, int kp2) {
  for (int r = 0; r < rows; ++r) {
    const float* s = src + static_cast<size_t>(r) * ld;
    uint16_t* d = dst + static_cast<size_t>(r) * kp2;
    for (int p = 0; p < k; p += 16) {
      const __mmask16 m = first_lanes(k - p);
      const __m512i v = bf16_lanes(_mm512_maskz_loadu_epi32(m, s + p));
      _mm512_mask_cvtepi32_storeu_epi16(d + p, m, v);
    }
    for (int p = k; p < kp2; ++p) d[p] = 0;
  }
}

// op(B) -> Bp: (panels, kpairs, 16) words, word (q, j) of panel t = (b_2q,16t+j, b_2q+1,16t+j),
// zero outside B. b: (K, N), row stride ldb.
DTLAB_TARGET_BF16 void pack_b_kn(const float* b, int k, int n, int ldb, int panels, int kpairs, uint32_t* bp) {
  for (int t = 0; t < panels; ++t) {
    const int j0 = 16 * t;
    const __mmask16 m = first_lanes(n - j0);
    uint32_t* out = bp + static_cast<size_t>(t) * kpairs * 16;
    for (int q = 0; q < kpairs; ++q) {
      const int p = 2 * q;
      const __m512i lo = bf16_lanes(_mm512_maskz_loadu_epi32(m, b + static_cast<size_t>(p) * ldb + j0));
      const __m512i hi = p + 1 < k ? bf16_lanes(_mm512_maskz_loadu_epi32(m, b + static_cast<size_t>(p + 1) * ldb + j0))
                                   : _mm512_setzero_si512();
      _mm512_storeu_si512(out + static_cast<size_t>(q) * 16, _mm512_or_si512(lo, _mm512_maskz_slli_epi32(0xFFFF, hi, 16)));
    }
  }
}

// B stored (N, K): its rows packed to bf16 pairs first (rows32: (N, kpairs) words), then dealt
// into the panels.
void pack_b_nk(const uint32_t* rows32, int n, int panels, int kpairs, uint32_t* bp) {
  for (int t = 0; t < panels; ++t) {
    uint32_t* out = bp + static_cast<size_t>(t) * kpairs * 16;
    for (int j = 0; j < 16; ++j) {
      const int col = 16 * t + j;
      if (col >= n) {
        for (int q = 0; q < kpairs; ++q) out[static_cast<size_t>(q) * 16 + j] = 0;
        continue;
      }
      const uint32_t* src = rows32 + static_cast<size_t>(col) * kpairs;
      for (int q = 0; q < kpairs; ++q) out[static_cast<size_t>(q) * 16 + j] = src[q];
    }
  }
}

// The float32 bits of 16 values rounded to bf16 (bf16.h's rule), low halves zero.
DTLAB_TARGET_BF16 inline __m512 round_lanes(__m512 v) {
  const __m512i u = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_maskz_srli_epi32(0xFFFF, u, 16), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF)));
  const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7FFFFFFF)),
                                                _mm512_set1_epi32(0x7F800000));
  const __m512i q = _mm512_mask_mov_epi32(rounded, nan, _mm512_or_si512(u, _mm512_set1_epi32(0x00400000)));
  return _mm512_castsi512_ps(_mm512_and_si512(q, _mm512_set1_epi32(static_cast<int>(0xFFFF0000u))));
}

// One tile: C rows (MR, cols) = epilogue(Ap rows (MR, kpairs words) x NR panels), cols <= 16 * NR
// valid. bias: at the tile's first row (per row) or first column (per column), or null.
template <int MR, int NR>
DTLAB_TARGET_BF16 void tile(const uint32_t* ap, int kpairs, const uint32_t* bp, size_t panel_words, float* c, int ldc,
                            int cols, const float* bias, bool bias_per_row, bool round) {
  __m512 acc[MR][NR];
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
    for (int t = 0; t < NR; ++t) acc[r][t] = _mm512_setzero_ps();
  for (int q = 0; q < kpairs; ++q) {
    __m512i bv[NR];
#pragma GCC unroll 4
    for (int t = 0; t < NR; ++t) bv[t] = _mm512_loadu_si512(bp + t * panel_words + static_cast<size_t>(q) * 16);
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      const __m512i av = _mm512_set1_epi32(static_cast<int>(ap[static_cast<size_t>(r) * kpairs + q]));
#pragma GCC unroll 4
      for (int t = 0; t < NR; ++t) acc[r][t] = _mm512_dpbf16_ps(acc[r][t], (__m512bh)av, (__m512bh)bv[t]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) {
    float* row = c + static_cast<size_t>(r) * ldc;
#pragma GCC unroll 4
    for (int t = 0; t < NR; ++t) {
      const __mmask16 m = first_lanes(cols - 16 * t);
      __m512 v = acc[r][t];
      if (bias) v = _mm512_add_ps(v, bias_per_row ? _mm512_set1_ps(bias[r]) : _mm512_maskz_loadu_ps(m, bias + 16 * t));
      if (round) v = round_lanes(v);
      _mm512_mask_storeu_ps(row + 16 * t, m, v);
    }
  }
}

using TileFn = void (*)(const uint32_t*, int, const uint32_t*, size_t, float*, int, int, const float*, bool, bool);

template <int MR>
constexpr TileFn tile_for(int nr) {
  return nr == 1 ? &tile<MR, 1> : nr == 2 ? &tile<MR, 2> : nr == 3 ? &tile<MR, 3> : &tile<MR, 4>;
}

TileFn tile_fn(int mr, int nr) {
  static_assert(kRows == 6 && kPanels == 4, "tile_fn lists the tile shapes");
  switch (mr) {
    case 1: return tile_for<1>(nr);
    case 2: return tile_for<2>(nr);
    case 3: return tile_for<3>(nr);
    case 4: return tile_for<4>(nr);
    case 5: return tile_for<5>(nr);
    default: return tile_for<6>(nr);
  }
}

bool cpu_has_avx512_bf16() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bf16");
}

}  // namespace

bool gemm_bf16_avx512_supported() {
  static const bool supported = cpu_has_avx512_bf16();
  return supported;
}

void gemm_bf16_avx512(bool trans_b, int m, int n, int k, const float* a, int lda, const float* b, int ldb, float* c,
                      int ldc, const Bf16Epilogue& ep) {
  assert(gemm_bf16_avx512_supported());
  if (m <= 0 || n <= 0) return;
  const int kpairs = (k + 1) / 2;
  const int panels = (n + 15) / 16;
  thread_local std::vector<uint16_t> ap;  // (M, 2 * kpairs) bf16
  thread_local std::vector<uint16_t> bt;  // trans_b: (N, 2 * kpairs) bf16
  thread_local std::vector<uint32_t> bp;  // (panels, kpairs, 16) pairs
  ap.resize(static_cast<size_t>(m) * 2 * kpairs + 2);
  bp.resize(static_cast<size_t>(panels) * kpairs * 16 + 16);
  pack_rows(a, m, k, lda, ap.data(), 2 * kpairs);
  if (trans_b) {
    bt.resize(static_cast<size_t>(n) * 2 * kpairs + 2);
    pack_rows(b, n, k, ldb, bt.data(), 2 * kpairs);
    pack_b_nk(reinterpret_cast<const uint32_t*>(bt.data()), n, panels, kpairs, bp.data());
  } else {
    pack_b_kn(b, k, n, ldb, panels, kpairs, bp.data());
  }
  const auto* ap32 = reinterpret_cast<const uint32_t*>(ap.data());
  const size_t panel_words = static_cast<size_t>(kpairs) * 16;
  for (int i0 = 0; i0 < m; i0 += kRows) {
    const int mr = std::min(kRows, m - i0);
    for (int t0 = 0; t0 < panels; t0 += kPanels) {
      const int nr = std::min(kPanels, panels - t0);
      const float* bias = !ep.bias ? nullptr : ep.bias_per_row ? ep.bias + i0 : ep.bias + 16 * t0;
      tile_fn(mr, nr)(ap32 + static_cast<size_t>(i0) * kpairs, kpairs, bp.data() + t0 * panel_words, panel_words,
                      c + static_cast<size_t>(i0) * ldc + 16 * t0, ldc, std::min(n - 16 * t0, 16 * nr), bias,
                      ep.bias_per_row, ep.round);
    }
  }
}

#else  // no AVX512-BF16 kernel in this build

bool gemm_bf16_avx512_supported() { return false; }

void gemm_bf16_avx512(bool, int, int, int, const float*, int, const float*, int, float*, int, const Bf16Epilogue&) {
  assert(false && "gemm_bf16_avx512: not built (see gemm_bf16_avx512_supported)");
}

#endif

void gemm_bf16(bool trans_b, int m, int n, int k, const float* a, int lda, const float* b, int ldb, float* c, int ldc,
               const Bf16Epilogue& ep) {
  if (gemm_bf16_avx512_supported()) gemm_bf16_avx512(trans_b, m, n, k, a, lda, b, ldb, c, ldc, ep);
  else gemm_bf16_sgemm(trans_b, m, n, k, a, lda, b, ldb, c, ldc, ep);
}

const char* gemm_bf16_kernel_name() {
  return gemm_bf16_avx512_supported() ? "avx512-bf16" : "sgemm on bf16-rounded operands";
}

}  // namespace lab
