// Flatten: nn.Flatten() (start_dim 1). x: (N, d1, d2, ...) -> y: (N, d1*d2*...).
#pragma once

#include "module.h"

namespace lab {

class Flatten : public Module {
 public:
  std::string kind() const override { return "Flatten"; }
  std::string describe() const override { return "Flatten()"; }
  // x: (N, ...) -> y: (N, prod(...))
  void forward(const Tensor& x, Tensor& y, Mode mode) override;
  // dy: (N, prod(...)) -> dx: (N, ...) with the shape of the last forward's x
  void backward(const Tensor& dy, Tensor* dx) override;

 private:
  std::vector<int64_t> m_in_shape;
};

}  // namespace lab
