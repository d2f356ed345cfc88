#include "linear.h"

#include <cassert>
#include <cstring>

#include "gemm.h"

namespace lab {

namespace {

void add_row(double* __restrict acc, const float* __restrict row, int n) {
  for (int j = 0; j < n; ++j) acc[j] += row[j];
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

void Linear::forward(const Tensor& x, Tensor& y, Mode mode) {
  assert(x.ndim() == 2 && x.dim(1) == m_in);
  const int n = static_cast<int>(x.dim(0));
  y.resize({n, m_out});
  float beta = 0.0f;
  if (m_has_bias) {
    // Seed every row with the bias and let the gemm accumulate onto it (beta = 1).
    for (int i = 0; i < n; ++i) std::memcpy(y.ptr() + static_cast<size_t>(i) * m_out, m_bias.value.ptr(), sizeof(float) * m_out);
    beta = 1.0f;
  }
  sgemm(false, true, n, m_out, m_in, 1.0f, x.ptr(), m_in, m_weight.value.ptr(), m_in, beta, y.ptr(), m_out);
  if (mode == Mode::Train) m_x = x;
}

void Linear::backward(const Tensor& dy, Tensor* dx) {
  const int n = static_cast<int>(m_x.dim(0));
  assert(dy.ndim() == 2 && dy.dim(0) == n && dy.dim(1) == m_out);
  // dW (out, in) += dy^T (out, N) x (N, in)
  sgemm(true, false, m_out, m_in, n, 1.0f, dy.ptr(), m_out, m_x.ptr(), m_in, 1.0f, m_weight.grad.ptr(), m_in);
  if (m_has_bias) {
    // db += column sums of dy, in double, row by row (contiguous, vectorized across columns).
    m_bias_acc.assign(static_cast<size_t>(m_out), 0.0);
    for (int i = 0; i < n; ++i) add_row(m_bias_acc.data(), dy.ptr() + static_cast<size_t>(i) * m_out, m_out);
    float* db = m_bias.grad.ptr();
    for (int j = 0; j < m_out; ++j) db[j] += static_cast<float>(m_bias_acc[static_cast<size_t>(j)]);
  }
  if (dx) {
    // dx (N, in) = dy (N, out) W (out, in)
    dx->resize({n, m_in});
    sgemm(false, false, n, m_in, m_out, 1.0f, dy.ptr(), m_out, m_weight.value.ptr(), m_in, 0.0f, dx->ptr(), m_in);
  }
}

}  // namespace lab
