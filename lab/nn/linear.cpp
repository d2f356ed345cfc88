#include "linear.h"

#include <algorithm>
#include <cassert>
#include <cstring>
#include <vector>

#include "bf16.h"
#include "gemm.h"
#include "gemm_bf16.h"
#include "parallel.h"

namespace lab {

namespace {

void add_row(double* __restrict acc, const float* __restrict row, int n) {
  for (int j = 0; j < n; ++j) acc[j] += row[j];
}

// A product is cut in two halves, along its rows once there are at least 2 * kMinSide of them,
// otherwise along its columns once there are that many (one half per core on the machines the lab
// targets; a BLAS runs one big product faster than several small ones: 172 against 132 GFLOP/s for
// 256 against 64 rows of the mlp's first layer). The cut depends on the shape alone.
constexpr int kMinSide = 64;

// fn(r0, rows, c0, cols) for each block of the (row_count x col_count) result, the blocks spread
// over the compute threads.
template <class Fn>
void for_blocks(int row_count, int col_count, Fn&& fn) {
  const bool by_rows = row_count >= 2 * kMinSide;
  const bool by_cols = !by_rows && col_count >= 2 * kMinSide;
  const int parts = by_rows || by_cols ? 2 : 1;
  parallel_for(parts, [&](int64_t p0, int64_t p1, int) {
    for (int64_t p = p0; p < p1; ++p) {
      const int side = by_rows ? row_count : by_cols ? col_count : 0;
      const int first = static_cast<int>(side * p / parts), last = static_cast<int>(side * (p + 1) / parts);
      if (by_rows) fn(first, last - first, 0, col_count);
      else if (by_cols) fn(0, row_count, first, last - first);
      else fn(0, row_count, 0, col_count);
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
  if (m_autocast == Autocast::BF16) {
    assert(mode == Mode::Eval);  // Model::forward refuses Train under autocast
    std::vector<float> bias(m_has_bias ? static_cast<size_t>(m_out) : 0);  // (out,) bf16(b)
    for (size_t j = 0; j < bias.size(); ++j) bias[j] = round_bf16(m_bias.value.ptr()[j]);
    for_blocks(n, m_out, [&](int r0, int rows, int o0, int outs) {
      // y block (rows, outs) = bf16(bf16(x rows) bf16(W rows o0..)^T + bf16(b o0..)), sums in float32
      Bf16Epilogue ep;
      ep.bias = m_has_bias ? bias.data() + o0 : nullptr;
      ep.round = true;
      gemm_bf16(true, rows, outs, m_in, x.ptr() + static_cast<size_t>(r0) * m_in, m_in,
                m_weight.value.ptr() + static_cast<size_t>(o0) * m_in, m_in,
                y.ptr() + static_cast<size_t>(r0) * m_out + o0, m_out, ep);
    });
    return;
  }
  if (m_has_bias) {
    // Seed every row with the bias and let the gemm accumulate onto it (beta = 1).
    for (int i = 0; i < n; ++i) std::memcpy(y.ptr() + static_cast<size_t>(i) * m_out, m_bias.value.ptr(), sizeof(float) * m_out);
  }
  const float beta = m_has_bias ? 1.0f : 0.0f;
  for_blocks(n, m_out, [&](int r0, int rows, int o0, int outs) {
    // y block (rows, outs) = x rows (rows, in) W rows o0.. ^T (in, outs)
    sgemm(false, true, rows, outs, m_in, 1.0f, x.ptr() + static_cast<size_t>(r0) * m_in, m_in,
          m_weight.value.ptr() + static_cast<size_t>(o0) * m_in, m_in, beta,
          y.ptr() + static_cast<size_t>(r0) * m_out + o0, m_out);
  });
  if (mode == Mode::Train) m_x = x;
}

void Linear::backward(const Tensor& dy, Tensor* dx) {
  const int n = static_cast<int>(m_x.dim(0));
  assert(dy.ndim() == 2 && dy.dim(0) == n && dy.dim(1) == m_out);
  if (nondeterministic()) {
    param_grads_in_drawn_order(dy);
  } else {
    // dW block (outs, ins) += dy^T rows o0.. (outs, N) x columns i0.. of x (N, ins); db += column
    // sums of dy, in double, row by row (contiguous, vectorized across columns)
    m_bias_acc.assign(static_cast<size_t>(m_out), 0.0);
    for_blocks(m_out, m_in, [&](int o0, int outs, int i0, int ins) {
      sgemm(true, false, outs, ins, n, 1.0f, dy.ptr() + o0, m_out, m_x.ptr() + i0, m_in, 1.0f,
            m_weight.grad.ptr() + static_cast<size_t>(o0) * m_in + i0, m_in);
      // The bias rows o0.. go with the block that starts the columns.
      if (!m_has_bias || i0 != 0) return;
      for (int i = 0; i < n; ++i) add_row(m_bias_acc.data() + o0, dy.ptr() + static_cast<size_t>(i) * m_out + o0, outs);
      float* db = m_bias.grad.ptr();
      for (int j = o0; j < o0 + outs; ++j) db[j] += static_cast<float>(m_bias_acc[static_cast<size_t>(j)]);
    });
  }
  if (dx) {
    // dx block (rows, ins) = dy rows (rows, out) W columns i0.. (out, ins)
    dx->resize({n, m_in});
    for_blocks(n, m_in, [&](int r0, int rows, int i0, int ins) {
      sgemm(false, false, rows, ins, m_out, 1.0f, dy.ptr() + static_cast<size_t>(r0) * m_out, m_out,
            m_weight.value.ptr() + i0, m_in, 0.0f, dx->ptr() + static_cast<size_t>(r0) * m_in + i0, m_in);
    });
  }
}

// --nondeterministic: split-K over the batch. Each block of samples is one partial: its weight
// gradient (one sgemm over its rows) and its bias gradient (column sums in double, rounded to
// float), added into the gradients in float, block after block in a drawn order, as thread blocks
// adding with atomicAdd on a GPU do. With N >= 3 samples there are at least three blocks, and the
// order changes the sums' last bits.
void Linear::param_grads_in_drawn_order(const Tensor& dy) {
  const int n = static_cast<int>(m_x.dim(0));
  const ReductionSplit split = split_reduction(n, 1);
  m_partial_w.resize({m_out, m_in});
  m_partial_b.resize(static_cast<size_t>(m_out));
  arrival_order(split.count(), m_order);
  float* gw = m_weight.grad.ptr();
  float* pw = m_partial_w.ptr();
  for (const int64_t p : m_order) {
    int64_t r0, r1, i0, i1;
    split.range(p, r0, r1, i0, i1);
    const int rows = static_cast<int>(r1 - r0);
    if (rows == 0) continue;
    for_blocks(m_out, m_in, [&](int o0, int outs, int c0, int ins) {
      // partial dW block (outs, ins) = dy^T rows r0..r1 (outs, rows) x rows r0..r1 of x (rows, ins), then added
      sgemm(true, false, outs, ins, rows, 1.0f, dy.ptr() + static_cast<size_t>(r0) * m_out + o0, m_out,
            m_x.ptr() + static_cast<size_t>(r0) * m_in + c0, m_in, 0.0f, pw + static_cast<size_t>(o0) * m_in + c0, m_in);
      for (int o = o0; o < o0 + outs; ++o) {
        float* __restrict g = gw + static_cast<size_t>(o) * m_in + c0;
        const float* __restrict q = pw + static_cast<size_t>(o) * m_in + c0;
        for (int j = 0; j < ins; ++j) g[j] += q[j];
      }
    });
    if (!m_has_bias) continue;
    m_bias_acc.assign(static_cast<size_t>(m_out), 0.0);
    for (int64_t i = r0; i < r1; ++i) add_row(m_bias_acc.data(), dy.ptr() + static_cast<size_t>(i) * m_out, m_out);
    float* db = m_bias.grad.ptr();
    for (int j = 0; j < m_out; ++j) db[j] += static_cast<float>(m_bias_acc[static_cast<size_t>(j)]);
  }
}

}  // namespace lab
