// BnReluPool: BatchNorm2d -> ReLU -> MaxPool2d(2) computed together, the cnn's two blocks. Model
// uses it in place of the three modules (model.h, Model::set_fusion); they stay the readable
// reference it is tested against (tests/test_bn_relu_pool.cpp).
//
// Why: on their own the three layers read and write the full-size tensor six times forward and
// seven times backward (BatchNorm's output and saved input, ReLU's output and mask, the pooling's
// pair winners, the zero-filled gradient). Together, forward reads the input for the statistics
// (BatchNorm::prepare_forward) and once more to write the pooled output; backward reads the
// input and writes its gradient once. What backward needs is one byte per pooled output: which
// of the window's four inputs won and whether ReLU let its gradient through.
//
// Same numbers as the three layers: the BatchNorm output is x * alpha + beta in float, ReLU is
// v < 0 ? 0 : v, the window's winner is the first maximum (the last NaN) in scan order a b / c d,
// so the pooled output is bitwise the unfused one. Backward uses the unfused formula for every
// element, dx = (dy - grad_mean - (x - mean) * k) * scale with dy = 0 off the winners, so dx is
// bitwise the unfused one for the same coefficients; the coefficients come from BatchNorm's sums
// of dy and dy * (x - mean), which here add only the winners' terms, in double, where BatchNorm
// adds every term in float blocks: equal up to float rounding.
#pragma once

#include <cstdint>
#include <vector>

#include "batchnorm.h"

namespace lab {

class BnReluPool {
 public:
  // Whether the fused path computes bn -> ReLU -> MaxPool2d(2) on input x (N, C, H, W): a
  // BatchNorm2d and even H and W.
  static bool applies(const BatchNorm& bn, const Tensor& x);
  // x: (N, C, H, W) -> y: (N, C, H/2, W/2). In Train, x must stay unchanged until backward.
  void forward(BatchNorm& bn, const Tensor& x, Tensor& y, Mode mode);
  // dy: (N, C, H/2, W/2) -> dx: (N, C, H, W), or only the parameter gradients when dx is null.
  void backward(BatchNorm& bn, const Tensor& dy, Tensor* dx);
  // What the last Train forward saved for backward: the winners' places and their x (the input
  // itself is the caller's, counted there).
  int64_t saved_bytes() const { return static_cast<int64_t>(m_win.size() * 4 + m_xwin.size() * 4); }

 private:
  const Tensor* m_x = nullptr;  // the last Train forward's input (owned by the caller)
  // (N, C, H/2, W/2): bits 0-1 the winner's place in its window (0 a, 1 b, 2 c, 3 d), bit 2 set
  // when ReLU passed it (its BatchNorm output was > 0 or NaN)
  std::vector<int32_t> m_win;
  std::vector<float> m_xwin;  // (N, C, H/2, W/2): x at each winner, for backward's sums
  // (H * W / 2): one plane's horizontal pair winners: ReLU output, BatchNorm output, x, place;
  // one set per compute thread (parallel.h)
  struct Scratch {
    std::vector<float> pair_r, pair_v, pair_x;
    std::vector<int32_t> pair_i;
  };
  std::vector<Scratch> m_scratch;
  // --nondeterministic (parallel.h: arrival_order): BatchNorm's per-channel sums of backward, (C,)
  // each, added partial by partial in a drawn order. dy: (N, C, H/2, W/2); mean: (C,)
  void grad_sums_in_drawn_order(const Tensor& dy, const float* mean, std::vector<double>& sum_dy,
                                std::vector<double>& sum_dy_xmu) const;
};

}  // namespace lab
