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

// The products are cut in two halves of their rows once there are at least 2 * kMinRows of them
// (one half per core on the machines the lab targets; a BLAS runs one big product faster than
// several small ones: 172 against 132 GFLOP/s for 256 against 64 rows of the mlp's first layer).
constexpr int kMinRows = 64;

// fn(first, rows) for each part of [0, count), the parts spread over the compute threads.
template <class Fn>
void for_row_blocks(int count, Fn&& fn) {
  const int parts = count >= 2 * kMinRows ? 2 : 1;
  parallel_for(parts, [&](int64_t p0, int64_t p1, int) {
    for (int64_t p = p0; p < p1; ++p) {
      const int first = static_cast<int>(count * p / parts), last = static_cast<int>(count * (p + 1) / parts);
      fn(first, last - first);
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

// The products are cut into parts that depend on the batch alone, never on the number of compute
// threads (parallel.h), so neither do the bits: a BLAS may pick another kernel for another shape.
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
