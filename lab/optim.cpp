#include "optim.h"

#include <cassert>
#include <cmath>

namespace lab {

float cross_entropy(const Tensor& logits, const std::vector<int>& labels, Tensor* dlogits, int* correct) {
  assert(logits.ndim() == 2 && logits.dim(0) == static_cast<int64_t>(labels.size()));
  const int64_t n = logits.dim(0), c = logits.dim(1);
  if (dlogits) dlogits->resize(logits.shape);
  double total = 0.0;
  int hits = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float* z = logits.ptr() + i * c;
    const int label = labels[static_cast<size_t>(i)];
    assert(label >= 0 && label < c);
    // argmax with torch.argmax's rules: the first of equal maxima; a NaN counts as the maximum.
    int64_t best = 0;
    for (int64_t j = 1; j < c; ++j)
      if (!std::isnan(z[best]) && (z[j] > z[best] || std::isnan(z[j]))) best = j;
    if (best == label) ++hits;
    // log_softmax(z) = z - max - log(sum exp(z - max)): no overflow for large logits.
    const float zmax = z[best];
    double sum = 0.0;
    for (int64_t j = 0; j < c; ++j) sum += std::exp(static_cast<double>(z[j] - zmax));
    const double lse = std::log(sum);
    total += lse - (z[label] - zmax);
    if (dlogits) {
      // d(mean loss)/dz = (softmax(z) - onehot(label)) / N
      float* d = dlogits->ptr() + i * c;
      for (int64_t j = 0; j < c; ++j) {
        const double p = std::exp(static_cast<double>(z[j] - zmax) - lse);
        d[j] = static_cast<float>((p - (j == label ? 1.0 : 0.0)) / static_cast<double>(n));
      }
    }
  }
  if (correct) *correct = hits;
  return static_cast<float>(total / static_cast<double>(n));
}

Sgd::Sgd(std::vector<Param*> params, const SgdOptions& opt) : m_params(std::move(params)), m_opt(opt) {
  m_buf.resize(m_params.size());
}

void Sgd::step() {
  // torch.optim.SGD (_single_tensor_sgd, 1.13) op by op in float: every `add(x, alpha=a)` is
  // x * float(a) added, as ATen's add kernel computes it.
  const float wd = static_cast<float>(m_opt.weight_decay);
  const float mom = static_cast<float>(m_opt.momentum);
  const float damp = 1.0f - static_cast<float>(m_opt.dampening);
  const float neg_lr = -static_cast<float>(m_opt.lr);
  for (size_t k = 0; k < m_params.size(); ++k) {
    Param& p = *m_params[k];
    const int64_t n = p.value.numel();
    float* w = p.value.ptr();
    const float* g = p.grad.ptr();
    if (m_opt.momentum != 0.0 && m_first) m_buf[k].resize(p.value.shape);
    float* buf = m_opt.momentum != 0.0 ? m_buf[k].ptr() : nullptr;
    for (int64_t i = 0; i < n; ++i) {
      float d = g[i];
      if (m_opt.weight_decay != 0.0) d = d + wd * w[i];
      if (buf) {
        // First step: buf = clone(d), with no dampening, as PyTorch does.
        buf[i] = m_first ? d : buf[i] * mom + damp * d;
        d = m_opt.nesterov ? d + mom * buf[i] : buf[i];
      }
      w[i] = w[i] + neg_lr * d;
    }
  }
  m_first = false;
}

}  // namespace lab
