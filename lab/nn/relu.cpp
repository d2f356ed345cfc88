#include "relu.h"

#include <algorithm>
#include <cassert>

#include "elementwise.h"
#include "parallel.h"

namespace lab {

namespace {

// Blocks of kLanes through __restrict parameters: the shape GCC vectorizes at -O2 (branch-free
// selects); a plain loop stays scalar there and branches on each sign, mispredicting half the time.
constexpr int kLanes = 16;
constexpr int64_t kChunk = 4096;  // values per slice of work for the compute threads

// out = relu_value(v) (v < 0 ? 0 : v, which lets NaN and -0 through as torch.relu does); mask = 1
// where the gradient passes (y > 0 or NaN). The formulas are elementwise.h's, shared with the GPU.
void relu_forward(const float* __restrict in, float* __restrict out, uint8_t* __restrict mask, int64_t n) {
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int j = 0; j < kLanes; ++j) {
      const float v = in[i + j];
      out[i + j] = relu_value(v);
      mask[i + j] = relu_passes(v);
    }
  }
  for (; i < n; ++i) {
    const float v = in[i];
    out[i] = relu_value(v);
    mask[i] = relu_passes(v);
  }
}

void relu_backward(const float* __restrict g, const uint8_t* __restrict mask, float* __restrict out, int64_t n) {
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int j = 0; j < kLanes; ++j) {
      out[i + j] = relu_grad(g[i + j], mask[i + j] != 0);
    }
  }
  for (; i < n; ++i) out[i] = relu_grad(g[i], mask[i] != 0);
}

}  // namespace

void ReLU::forward(const Tensor& x, Tensor& y, Mode /*mode*/) {
  y.resize(x.shape);
  // The mask is written in Eval too: it costs little and keeps one code path.
  m_mask.resize(static_cast<size_t>(x.numel()));
  parallel_for(x.numel() / kChunk + 1, [&](int64_t c0, int64_t c1, int) {
    const int64_t i0 = c0 * kChunk, i1 = std::min(x.numel(), c1 * kChunk);
    if (i0 < i1) relu_forward(x.ptr() + i0, y.ptr() + i0, m_mask.data() + i0, i1 - i0);
  });
}

void ReLU::backward(const Tensor& dy, Tensor* dx) {
  assert(dy.numel() == static_cast<int64_t>(m_mask.size()));
  if (!dx) return;
  dx->resize(dy.shape);
  parallel_for(dy.numel() / kChunk + 1, [&](int64_t c0, int64_t c1, int) {
    const int64_t i0 = c0 * kChunk, i1 = std::min(dy.numel(), c1 * kChunk);
    if (i0 < i1) relu_backward(dy.ptr() + i0, m_mask.data() + i0, dx->ptr() + i0, i1 - i0);
  });
}

}  // namespace lab
