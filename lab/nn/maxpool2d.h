// MaxPool2d: nn.MaxPool2d(k) (stride k, no padding, floor mode) over NCHW.
//   x: (N, C, H, W) -> y: (N, C, H/k, W/k) (rounded down)
// Ties go to the first maximum in window scan order (row by row), as PyTorch's CPU kernel does;
// forward stores that argmax so backward routes each dy to exactly one input.
#pragma once

#include <cstdint>

#include "module.h"

namespace lab {

class MaxPool2d : public Module {
 public:
  explicit MaxPool2d(int kernel_size) : m_k(kernel_size) {}
  int kernel_size() const { return m_k; }
  std::string kind() const override { return "MaxPool2d"; }
  std::string describe() const override { return "MaxPool2d(" + std::to_string(m_k) + ")"; }
  // x: (N, C, H, W) -> y: (N, C, H/k, W/k)
  void forward(const Tensor& x, Tensor& y, Mode mode) override;
  // dy: (N, C, H/k, W/k) -> dx: (N, C, H, W), zero except at the stored argmaxes
  void backward(const Tensor& dy, Tensor* dx) override;
  int64_t saved_bytes() const override { return static_cast<int64_t>(m_argmax.size() * sizeof(int32_t)); }

 private:
  int m_k;
  std::vector<int64_t> m_in_shape;
  std::vector<int32_t> m_argmax;  // (N, C, H/k, W/k): index of the max within its input plane (H*W)
  // 2x2 fast path scratch, (N, C, H, W/2): winner of each horizontal pair and whether it was the right one
  std::vector<float> m_pair_value;
  std::vector<uint8_t> m_pair_flag;
};

}  // namespace lab
