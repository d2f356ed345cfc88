// Loss and optimizer with PyTorch's exact rules.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "executor.h"
#include "module.h"

namespace lab {

// nn.CrossEntropyLoss() (mean reduction): logits (N, C), labels (N,) in [0, C).
// Returns the mean loss; writes dlogits (N, C) = (softmax - onehot) / N. correct = number of
// argmax hits (ties: first index, like torch.argmax).
float cross_entropy(const Tensor& logits, const std::vector<int>& labels, Tensor* dlogits, int* correct);
// One part of a batch's nn.CrossEntropyLoss (mean over mean_over rows, of which logits holds some:
// a pipeline's micro-batch of a loss over the whole mini-batch, as PyTorch's Pipe computes it on the
// concatenated outputs): returns the sum of the rows' losses in double; dlogits gets (softmax -
// onehot) / mean_over, the mini-batch loss's gradient.
double cross_entropy_part(const Tensor& logits, const std::vector<int>& labels, int64_t mean_over, Tensor* dlogits,
                          int* correct);

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
// Optimizer::step's update of one parameter's n contiguous values: w, g, buf (nullptr without momentum;
// `first`: the parameter's first step, buf filled from g). The one place its arithmetic is chosen
// (sgd_element of elementwise.h, specialized on the options), for the host and for any device
// that steps with the CPU's ops.
void sgd_apply(const SgdOptions& opt, bool first, float* w, const float* g, float* buf, int64_t n);

// torch.optim.Adam (decoupled false) and torch.optim.AdamW (decoupled true), amsgrad and maximize
// off: the update of elementwise.h's adam_element. PyTorch's own defaults are lr 1e-3 and, for
// AdamW, weight_decay 1e-2.
struct AdamOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  bool decoupled = false;
};

// Adam's update of n contiguous values at step `step` (1 for the first): w, g, m (exp_avg), v
// (exp_avg_sq), for the host and for any device that steps with the CPU's ops.
void adam_apply(const AdamOptions& opt, int64_t step, float* w, const float* g, float* m, float* v, int64_t n);

// Which optimizer a run steps with (--optimizer) and its settings.
struct OptimizerOptions {
  OptimizerOptions() = default;
  OptimizerOptions(const SgdOptions& s) : sgd(s) {}  // NOLINT: SGD with these options
  std::string kind = "sgd";  // sgd | adam | adamw
  SgdOptions sgd;
  AdamOptions adam;          // adam and adamw (decoupled)
  bool is_sgd() const { return kind == "sgd"; }
};

class ModelExecutor;

// The optimizer of a model's parameters: torch.optim.SGD, Adam or AdamW, one param group.
class Optimizer {
 public:
  Optimizer(std::vector<Param*> params, const OptimizerOptions& opt);
  // The model's executor (executor.h): the parameters it keeps on its device are stepped there,
  // their state here (momentum, Adam's moments) becomes its mirrors. nullptr: all on the host.
  void set_device(ModelExecutor* device) { m_device = device; }
  void step();
  // ZeroRedundancyOptimizer (--mode zero): this rank's optimizer is the local optimizer of its
  // partition. It steps, and keeps state for, the parameters it owns only (owned[i], params()
  // order); the others get no state (empty tensors in state()) and step() leaves them alone.
  // Empty (the default): every parameter.
  void set_owned(std::vector<bool> owned);
  // FullyShardedDataParallel (--mode fsdp): the optimizer steps the rank's flat shards, not the
  // model's parameters. Before the first step only.
  void set_params(std::vector<Param*> params);
  bool owns(size_t i) const { return m_owned.empty() || m_owned[i]; }
  // What it steps: the model's parameters, or what set_params gave it (FSDP's shards).
  const std::vector<Param*>& params() const { return m_params; }
  const OptimizerOptions& options() const { return m_opt; }
  double lr() const { return m_opt.is_sgd() ? m_opt.sgd.lr : m_opt.adam.lr; }
  void set_lr(double lr);  // a scheduler's new rate (param_group['lr'] = lr)
  // Steps taken (Adam's state['step']; its bias corrections use it).
  int64_t steps() const { return m_steps; }
  // Bytes of its state on the host (memory.h's "optimizer_state"): 0 before the first step.
  int64_t state_bytes() const;

  // The optimizer's state per parameter (params() order), by name: SGD's "momentum" buffers (with
  // momentum), Adam's "exp_avg" and "exp_avg_sq". Empty before the first step (PyTorch creates
  // it then), and for SGD without momentum.
  std::vector<std::string> state_names() const;
  // state_names() of an optimizer with these options once it has stepped.
  static std::vector<std::string> state_names_of(const OptimizerOptions& opt);
  // Up to date (a device's mirrors brought current first). name: one of state_names(). A
  // parameter the optimizer does not own (set_owned) has an empty tensor.
  std::vector<Tensor>& state(const std::string& name);
  // From a checkpoint: every one of state_names() (as after a step; empty tensors for the
  // parameters it does not own) and the steps taken.
  void restore_state(std::map<std::string, std::vector<Tensor>> state, int64_t steps);
  // SGD's momentum buffers: state("momentum").
  std::vector<Tensor>& momentum_buffers() { return state("momentum"); }
  // --cuda-graphs (Model::graph_step): the host's half of step() for a device that steps every
  // parameter in its own captured step: the step counted and the state sized as step() does it;
  // returns step_param's arguments (executor.h). undo_device_step: the device stepped nothing (a
  // gradient was not finite), so the step does not count, as step() is then not called.
  DeviceStepPlan begin_device_step();
  void undo_device_step() { --m_steps; }

 private:
  std::vector<Param*> m_params;
  OptimizerOptions m_opt;
  std::vector<Tensor> m_buf;       // SGD: momentum buffers
  std::vector<Tensor> m_m, m_v;    // Adam: exp_avg, exp_avg_sq
  int64_t m_steps = 0;
  ModelExecutor* m_device = nullptr;
  std::vector<bool> m_owned;       // set_owned (empty: every parameter)
};

}  // namespace lab
