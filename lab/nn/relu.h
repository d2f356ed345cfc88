// ReLU: nn.ReLU(). y = max(x, 0), elementwise, any shape; NaN propagates as in torch.relu.
#pragma once

#include <cstdint>

#include "module.h"

namespace lab {

class ReLU : public Module {
 public:
  std::string kind() const override { return "ReLU"; }
  std::string describe() const override { return "ReLU()"; }
  // x: any shape -> y: same shape
  void forward(const Tensor& x, Tensor& y, Mode mode) override;
  // dx = dy where y > 0 (or NaN), else 0: torch's threshold_backward on the result
  void backward(const Tensor& dy, Tensor* dx) override;
  int64_t saved_bytes() const override { return static_cast<int64_t>(m_mask.size()); }

 private:
  // like x: 1 where y > 0 or NaN. A byte per value rather than a copy of y: the layer is
  // memory-bound, and this is a quarter of the traffic.
  std::vector<uint8_t> m_mask;
};

}  // namespace lab
