// sgemm_blocked: sgemm_ref's order of additions in register blocks (gemm_blocked.h says why the
// bits are the same). Compiled with -ffp-contract=off (CMakeLists.txt): a_ip * b_pj + acc must
// stay two roundings, never one fused multiply-add.
#include "gemm_blocked.h"

#include <algorithm>
#include <atomic>
#include <thread>
#include <vector>

namespace lab {

namespace {

// A block of C: 1 row x 32 columns of accumulators (measured with GCC 12 on x86-64: 23 GFLOP/s on
// one core for 512 x 512, against 16 for 2 x 16, 15 for 4 x 8 and 2.2 for sgemm_ref's loop).
constexpr int kRows = 1;   // rows of C per register block
constexpr int kCols = 32;  // columns of C per register block (and per copied panel of op(B))
// Below this many multiply-adds a call runs on the calling thread: starting threads costs more.
constexpr double kThreadedWork = 1 << 21;

std::atomic<int> g_threads{1};

// C[:, j0 : j0 + nj] for nj <= kCols: one panel of op(B), then every block of kRows rows.
//   bpanel: (K, kCols) op(B)'s columns j0.., zero past nj;  apanel: (K, kRows) op(A)'s rows i0..
void column_block(bool trans_a, bool trans_b, int m, int k, int j0, int nj, float alpha, const float* a, int lda,
                  const float* b, int ldb, float beta, float* c, int ldc, std::vector<float>& bpanel,
                  std::vector<float>& apanel) {
  bpanel.assign(static_cast<size_t>(k) * kCols, 0.0f);
  apanel.assign(static_cast<size_t>(k) * kRows, 0.0f);
  for (int p = 0; p < k; ++p)
    for (int jj = 0; jj < nj; ++jj)
      bpanel[static_cast<size_t>(p) * kCols + jj] = trans_b ? b[static_cast<size_t>(j0 + jj) * ldb + p]
                                                            : b[static_cast<size_t>(p) * ldb + j0 + jj];
  for (int i0 = 0; i0 < m; i0 += kRows) {
    const int ni = std::min(kRows, m - i0);
    for (int p = 0; p < k; ++p)
      for (int ii = 0; ii < kRows; ++ii)
        apanel[static_cast<size_t>(p) * kRows + ii] =
            ii < ni ? (trans_a ? a[static_cast<size_t>(p) * lda + i0 + ii] : a[static_cast<size_t>(i0 + ii) * lda + p])
                    : 0.0f;
    // acc[ii][jj] sums over p in order, as sgemm_ref's acc for element (i0 + ii, j0 + jj)
    float acc[kRows][kCols] = {};
    const float* ap = apanel.data();
    const float* bp = bpanel.data();
    for (int p = 0; p < k; ++p, ap += kRows, bp += kCols)
      for (int ii = 0; ii < kRows; ++ii)
        for (int jj = 0; jj < kCols; ++jj) acc[ii][jj] += ap[ii] * bp[jj];
    for (int ii = 0; ii < ni; ++ii)
      for (int jj = 0; jj < nj; ++jj) {
        float& out = c[static_cast<size_t>(i0 + ii) * ldc + j0 + jj];
        out = alpha * acc[ii][jj] + (beta == 0.0f ? 0.0f : beta * out);  // as sgemm_ref
      }
  }
}

}  // namespace

void sgemm_blocked_set_threads(int threads) { g_threads = std::max(1, threads); }
int sgemm_blocked_threads() { return g_threads; }

void sgemm_blocked(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a, int lda,
                   const float* b, int ldb, float beta, float* c, int ldc) {
  if (m <= 0 || n <= 0) return;
  const int blocks = (n + kCols - 1) / kCols;
  const double work = static_cast<double>(m) * n * k;
  const int threads = work < kThreadedWork ? 1 : std::min(blocks, sgemm_blocked_threads());
  // thread t takes the column blocks t, t + threads, ...: each element is one thread's alone
  auto part = [&](int t) {
    std::vector<float> bpanel, apanel;
    for (int blk = t; blk < blocks; blk += threads) {
      const int j0 = blk * kCols;
      column_block(trans_a, trans_b, m, k, j0, std::min(kCols, n - j0), alpha, a, lda, b, ldb, beta, c, ldc, bpanel,
                   apanel);
    }
  };
  if (threads == 1) {
    part(0);
    return;
  }
  std::vector<std::thread> helpers;
  for (int t = 1; t < threads; ++t) helpers.emplace_back(part, t);
  part(0);
  for (std::thread& h : helpers) h.join();
}

}  // namespace lab
