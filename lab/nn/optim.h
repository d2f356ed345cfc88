// Loss and optimizer with PyTorch's exact rules.
#pragma once

#include <cstdint>
#include <vector>

#include "module.h"

namespace lab {

// nn.CrossEntropyLoss() (mean reduction): logits (N, C), labels (N,) in [0, C).
// Returns the mean loss; writes dlogits (N, C) = (softmax - onehot) / N. correct = number of
// argmax hits (ties: first index, like torch.argmax).
float cross_entropy(const Tensor& logits, const std::vector<int>& labels, Tensor* dlogits, int* correct);

// Whether every value of t is finite (no NaN, no infinity): AMP's found_inf test of a gradient.
// Reads the exponent bits, so it is exact whatever the values and runs at memory speed.
bool all_finite(const Tensor& t);

struct SgdOptions {
  double lr = 0.01;
  double momentum = 0.0;
  double dampening = 0.0;
  double weight_decay = 0.0;
  bool nesterov = false;
};

// torch.optim.SGD. Per parameter p with gradient g:
//   g = g + wd * p;  buf = g (first step) else buf = momentum * buf + (1 - dampening) * g;
//   g = nesterov ? g + momentum * buf : buf;  p = p - lr * g
// Sgd::step's update of one parameter's n contiguous values: w, g, buf (nullptr without momentum;
// `first`: the parameter's first step, buf filled from g). The one place its arithmetic is chosen
// (sgd_element of elementwise.h, specialized on the options), for the host and for any device
// that steps with the CPU's ops.
void sgd_apply(const SgdOptions& opt, bool first, float* w, const float* g, float* buf, int64_t n);

class ModelExecutor;

class Sgd {
 public:
  Sgd(std::vector<Param*> params, const SgdOptions& opt);
  // The model's executor (executor.h): the parameters it keeps on its device are stepped there,
  // their momentum buffers here become its mirrors. nullptr: every parameter on the host.
  void set_device(ModelExecutor* device) { m_device = device; }
  void step();
  const SgdOptions& options() const { return m_opt; }
  void set_lr(double lr) { m_opt.lr = lr; }  // a scheduler's new rate (param_group['lr'] = lr)
  // Up to date (a device's mirrors brought current first).
  std::vector<Tensor>& momentum_buffers();
  // The momentum buffers have been filled (after the first step): a checkpoint saves them.
  bool has_momentum() const { return !m_first && m_opt.momentum != 0.0; }
  // From a checkpoint: buffers per parameter (params() order), as after a first step.
  void restore_momentum(std::vector<Tensor> buffers);

 private:
  std::vector<Param*> m_params;
  SgdOptions m_opt;
  std::vector<Tensor> m_buf;
  bool m_first = true;
  ModelExecutor* m_device = nullptr;
};

}  // namespace lab
