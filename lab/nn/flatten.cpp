#include "flatten.h"

#include <cassert>

namespace lab {

void Flatten::forward(const Tensor& x, Tensor& y, Mode /*mode*/) {
  assert(x.ndim() >= 1);
  m_in_shape = x.shape;
  const int64_t n = x.dim(0);
  // Tensors own their storage, so a "view" is a copy; it is a small fraction of a step.
  y.shape = {n, n ? x.numel() / n : Tensor::numel_of({x.shape.begin() + 1, x.shape.end()})};
  y.data = x.data;
}

void Flatten::backward(const Tensor& dy, Tensor* dx) {
  assert(dy.numel() == Tensor::numel_of(m_in_shape));
  if (!dx) return;
  dx->shape = m_in_shape;
  dx->data = dy.data;
}

}  // namespace lab
