#include "linear.h"

#include <algorithm>
#include <cassert>
#include <cstring>

#include "gemm.h"
#include "parallel.h"

namespace lab {

namespace {

void add_row(double* __restrict acc, const float* __restrict row, int n) {
  for (int j = 0; j < n; ++j) acc[j] += row[j];
}

constexpr int kRows = 64;

// fn(first, rows) for the blocks of kRows rows of [0, count), spread over the compute threads.
template <class Fn>
void for_row_blocks(int count, Fn&& fn) {
  const int blocks = (count + kRows - 1) / kRows;
  parallel_for(blocks, [&](int64_t b0, int64_t b1, int) {
    for (int64_t b = b0; b < b1; ++b) {
      const int first = static_cast<int>(b) * kRows;
      fn(first, std::min(kRows, count - first));
    }
  });
}

}  // namespace

Linear::Linear(int in_features, int out_features, bool bias)
    : m_in(in_features), m_out(out_features), m_has_bias(bias) {
  m_weight = {"weight", Tensor({out_features, in_features}), Tensor({out_features, in_features})};
  if (bias) m_bias = {"bias", Tensor({out_features}), Tensor({out_features})};
}

std::string Linear::describe() const {
  return "Linear(" + std::to_string(m_in) + ", " + std::to_string(m_out) + (m_has_bias ? "" : ", bias=False") + ")";
}

std::vector<Param*> Linear::params() {
  if (m_has_bias) return {&m_weight, &m_bias};
  return {&m_weight};
}

void Linear::reset_parameters(TorchGenerator& g) {
  kaiming_uniform_default(m_weight.value.ptr(), m_weight.value.numel(), m_in, g);
  if (m_has_bias) bias_uniform_default(m_bias.value.ptr(), m_bias.value.numel(), m_in, g);
}

// The products are cut into blocks of kRows rows, the same blocks with any number of compute
// threads (parallel.h), so the bits never depend on the thread count: a BLAS may pick another
// kernel for another shape.
void Linear::forward(const Tensor& x, Tensor& y, Mode mode) {
  assert(x.ndim() == 2 && x.dim(1) == m_in);
  const int n = static_cast<int>(x.dim(0));
  y.resize({n, m_out});
  for_row_blocks(n, [&](int r0, int rows) {
    float* yr = y.ptr() + static_cast<size_t>(r0) * m_out;
    float beta = 0.0f;
    if (m_has_bias) {
      // Seed every row with the bias and let the gemm accumulate onto it (beta = 1).
      for (int i = 0; i < rows; ++i) std::memcpy(yr + static_cast<size_t>(i) * m_out, m_bias.value.ptr(), sizeof(float) * m_out);
      beta = 1.0f;
    }
    // y rows (rows, out) = x rows (rows, in) W^T (in, out)
    sgemm(false, true, rows, m_out, m_in, 1.0f, x.ptr() + static_cast<size_t>(r0) * m_in, m_in, m_weight.value.ptr(),
          m_in, beta, yr, m_out);
  });
  if (mode == Mode::Train) m_x = x;
}

void Linear::backward(const Tensor& dy, Tensor* dx) {
  const int n = static_cast<int>(m_x.dim(0));
  assert(dy.ndim() == 2 && dy.dim(0) == n && dy.dim(1) == m_out);
  // dW rows (rows, in) += dy^T rows (rows, N) x (N, in); db += column sums of dy, in double, row
  // by row (contiguous, vectorized across columns)
  m_bias_acc.assign(static_cast<size_t>(m_out), 0.0);
  for_row_blocks(m_out, [&](int o0, int rows) {
    sgemm(true, false, rows, m_in, n, 1.0f, dy.ptr() + o0, m_out, m_x.ptr(), m_in, 1.0f,
          m_weight.grad.ptr() + static_cast<size_t>(o0) * m_in, m_in);
    if (!m_has_bias) return;
    for (int i = 0; i < n; ++i) add_row(m_bias_acc.data() + o0, dy.ptr() + static_cast<size_t>(i) * m_out + o0, rows);
    float* db = m_bias.grad.ptr();
    for (int j = o0; j < o0 + rows; ++j) db[j] += static_cast<float>(m_bias_acc[static_cast<size_t>(j)]);
  });
  if (dx) {
    // dx rows (rows, in) = dy rows (rows, out) W (out, in)
    dx->resize({n, m_in});
    for_row_blocks(n, [&](int r0, int rows) {
      sgemm(false, false, rows, m_in, m_out, 1.0f, dy.ptr() + static_cast<size_t>(r0) * m_out, m_out,
            m_weight.value.ptr(), m_in, 0.0f, dx->ptr() + static_cast<size_t>(r0) * m_in, m_in);
    });
  }
}

}  // namespace lab
