#include "model.h"

#include <algorithm>
#include <cassert>
#include <map>
#include <cstdint>
#include <cstring>
#include <limits>

#include "bf16.h"
#include "device_memory.h"
#include "conv2d.h"
#include "errors.h"
#include "flatten.h"
#include "linear.h"
#include "maxpool2d.h"
#include "mutation.h"
#include "optim.h"
#include "relu.h"
#include "torch_rng.h"

namespace lab {

namespace {
// The mutation "autocast-coarse-activations" (mutation.h): p[i] rounded to nearest with `bits`
// stored mantissa bits (bf16 keeps 7), a precision far below bfloat16's. Finite values only.
void round_mantissa_bits(float* p, size_t n, int bits) {
  const int drop = 23 - bits;
  for (size_t i = 0; i < n; ++i) {
    uint32_t u;
    std::memcpy(&u, &p[i], sizeof u);
    u = (u + (1u << (drop - 1))) & ~((1u << drop) - 1u);
    std::memcpy(&p[i], &u, sizeof u);
  }
}
}  // namespace

bool Model::fused_at(size_t i) const {
  if (!m_fusion || i + 2 >= std::min(m_end, m_modules.size())) return false;
  const auto* pool = dynamic_cast<const MaxPool2d*>(m_modules[i + 2].get());
  return dynamic_cast<const BatchNorm*>(m_modules[i].get()) && dynamic_cast<const ReLU*>(m_modules[i + 1].get()) &&
         pool && pool->kernel_size() == 2;
}

size_t Model::forward_step(size_t i, const Tensor& in, Mode mode) {
  // (cast only once fused_at() has seen a BatchNorm: a static_cast to the wrong type is undefined)
  auto* bn = fused_at(i) ? static_cast<BatchNorm*>(m_modules[i].get()) : nullptr;
  if (bn && BnReluPool::applies(*bn, in)) {
    if (!m_fused[i]) m_fused[i] = std::make_unique<BnReluPool>();
    m_fused[i]->forward(*bn, in, m_acts[i + 2], mode);  // in is m_acts[i - 1] or x: kept until backward
    m_fused_end[i + 2] = static_cast<int>(i);
    return i + 2;
  }
  m_modules[i]->forward(in, m_acts[i], mode);
  return i;
}

void Model::set_executor(std::unique_ptr<ModelExecutor> exec) {
  if (exec && m_autocast != Autocast::None)
    throw ConfigError("autocast bf16 is the CPU's emulation: it cannot run on " + exec->describe());
  m_exec = std::move(exec);
}

void Model::set_autocast(Autocast a) {
  if (m_exec && a != Autocast::None)
    throw ConfigError("autocast bf16 is the CPU's emulation: it cannot run on " + m_exec->describe());
  m_autocast = mutated("autocast-ignored") ? Autocast::None : a;  // a lesson's mutation test (mutation.h)
  for (size_t i = 0; i < m_modules.size(); ++i) m_lower_precision[i] = m_modules[i]->set_autocast(m_autocast) ? 1 : 0;
}

// Under autocast, `bf16` follows PyTorch's dtype of each activation: Linear and Conv2d return bf16
// (they round their outputs); any other module's output is bf16 when its input was, and is rounded
// here. A fused BatchNorm -> ReLU -> MaxPool2d run is rounded once, at its end: rounding is
// monotonic (and keeps 0 and NaN), so it commutes with ReLU and with max, and one rounding of the
// pooled output equals rounding after each of the three modules, bit for bit.
const Tensor& Model::forward(const Tensor& x, Mode mode) {
  assert(!m_modules.empty());
  if (m_exec) return m_exec->forward(x, mode);
  return forward_range(0, m_modules.size(), x, mode);
}

const Tensor& Model::forward_range(size_t begin, size_t end, const Tensor& x, Mode mode) {
  assert(begin < end && end <= m_modules.size());
  if (m_exec && (begin != 0 || end != m_modules.size()))
    throw ConfigError("a pipeline stage's forward runs on the CPU's modules: " + m_exec->describe() + " runs whole models");
  if (m_autocast != Autocast::None && mode == Mode::Train)
    throw ConfigError("autocast bf16 emulates inference only: a train-mode forward (model.train(), batch "
                      "statistics, backward) is not emulated under it",
                      "evaluate with running statistics (dtlab eval --bn-mode eval), or leave autocast off");
  const size_t count = m_modules.size();
  m_acts.resize(count);
  m_fused.resize(count);
  m_fused_end.assign(count, -1);
  m_input = &x;
  m_begin = begin;
  m_end = end;
  const Tensor* in = &x;
  bool bf16 = false;  // autocast: *in is a bfloat16 tensor in PyTorch
  const bool coarse = m_autocast == Autocast::BF16 && mutated("autocast-coarse-activations");
  const ModuleHooks* hooks = mode == Mode::Train ? m_hooks : nullptr;
  m_saved_upto = 0;
  for (size_t i = begin; i < end; ++i) {
    const size_t span = hooks && fused_at(i) ? 2 : 0;  // (the hooks' modules of a fused run)
    if (hooks && hooks->before_forward)
      for (size_t j = i; j <= i + span; ++j) hooks->before_forward(j);
    const size_t last = forward_step(i, *in, mode);
    if (hooks && hooks->after_forward)
      for (size_t j = i; j <= i + span; ++j) hooks->after_forward(j);
    if (m_autocast == Autocast::BF16) {
      if (m_lower_precision[i]) bf16 = true;
      else if (bf16 && coarse) round_mantissa_bits(m_acts[last].ptr(), static_cast<size_t>(m_acts[last].numel()), 2);
      else if (bf16) round_bf16(m_acts[last].ptr(), static_cast<size_t>(m_acts[last].numel()));
    }
    in = &m_acts[last];
    i = last;
  }
  m_saved_upto = mode == Mode::Train ? end : 0;
  return m_acts[end - 1];
}

float Model::forward_loss(const Tensor& x, const std::vector<int>& labels, int* correct) {
  float loss = 0.0f;
  int hits = 0;
  m_loss_on_device = m_exec && m_exec->forward_loss(x, labels, loss, hits);
  if (!m_loss_on_device) loss = cross_entropy(forward(x, Mode::Train), labels, &m_dloss, &hits);
  if (correct) *correct = hits;
  return loss;
}

void Model::backward_from_loss(const std::function<void(int)>& on_param_ready) {
  if (m_loss_on_device) return m_exec->backward_loss(on_param_ready);
  backward(m_dloss, on_param_ready);
}

void Model::poison_loss_grad() {
  if (m_loss_on_device) return m_exec->poison_loss_grad();
  if (m_dloss.numel() > 0) m_dloss.data[0] = std::numeric_limits<float>::quiet_NaN();
}

GraphStepOutcome Model::graph_step(const Tensor& x, const std::vector<int>& labels, Optimizer& opt) {
  GraphStepOutcome out;
  if (m_exec && x.ndim() > 0 && x.dim(0) > 0 && m_exec->can_graph_step(nullptr)) {
    // (zero_grad's: the device zeroes the gradients in the step and keeps them; the host's are
    // mirrors from then on, brought up to date by to_host(kStateGrads))
    const DeviceStepPlan plan = opt.begin_device_step();
    if (m_exec->graph_step(x, labels, plan, out)) {
      m_loss_on_device = true;
      if (out.nonfinite >= 0) opt.undo_device_step();
      return out;
    }
    opt.undo_device_step();
  }
  if (m_exec) m_exec->keep_grads(true);  // as DDP's reducer asks: the gradients stay where they are computed
  out.loss = forward_loss(x, labels, &out.correct);
  zero_grad();
  std::vector<int> order;
  backward_from_loss([&](int i) { order.push_back(i); });
  out.nonfinite = first_nonfinite_grad(order);
  if (out.nonfinite < 0) opt.step();
  return out;
}

void Model::backward(const Tensor& dlogits, const std::function<void(int)>& on_param_ready) {
  if (m_exec) return m_exec->backward(dlogits, on_param_ready);
  assert(m_begin == 0 && m_end == m_modules.size());
  const ParamLayout layout = param_layout();
  backward_modules(dlogits, layout, layout.first_with_params, on_param_ready);
}

const Tensor* Model::backward_range(const Tensor& dy) {
  assert(!m_exec && m_end > m_begin);
  const ParamLayout layout = param_layout();
  const size_t first_with_params = layout.first_with_params;
  backward_modules(dy, layout, std::max(m_begin, first_with_params), {});
  return m_begin > first_with_params ? &m_grads[m_begin - 1] : nullptr;
}

void Model::backward_modules(const Tensor& dlogits, const ParamLayout& layout, size_t stop,
                             const std::function<void(int)>& on_param_ready) {
  const size_t count = m_modules.size();
  m_grads.resize(count);
  const size_t first_with_params = layout.first_with_params;
  // m_grads[i] holds the gradient of module i's output; module i writes its dx into m_grads[i - 1].
  const ModuleHooks* hooks = m_hooks;
  for (size_t i = m_end; i-- > stop;) {
    const Tensor& dy = i + 1 == m_end ? dlogits : m_grads[i];
    const size_t end = i;
    const size_t start = m_fused_end.size() == count && m_fused_end[i] >= 0 ? static_cast<size_t>(m_fused_end[i]) : i;
    if (hooks && hooks->before_backward)
      for (size_t j = end + 1; j-- > start;) hooks->before_backward(j);
    i = start;
    Tensor* dx = i > first_with_params ? &m_grads[i - 1] : nullptr;
    if (start != end)  // a fused run ends at module `end`
      m_fused[i]->backward(*static_cast<BatchNorm*>(m_modules[i].get()), dy, dx);
    else
      m_modules[i]->backward(dy, dx);
    m_saved_upto = start;
    if (on_param_ready)
      for (int p = layout.count[i] - 1; p >= 0; --p) on_param_ready(layout.first[i] + p);
    if (hooks && hooks->after_backward)
      for (size_t j = end + 1; j-- > start;) hooks->after_backward(j);
  }
  m_saved_upto = 0;
}

int64_t Model::activation_bytes() const {
  if (m_saved_upto == 0 || m_exec) return 0;
  const size_t upto = std::min(m_saved_upto, m_modules.size());
  // the loss's gradient, until backward starts (forward_loss's: a pipeline stage's loss is its mode's)
  int64_t b = upto == m_modules.size() && m_begin == 0 ? m_dloss.numel() * 4 : 0;
  for (size_t i = m_begin; i < upto; ++i) {
    const bool fused_run = m_fused_end.size() == m_modules.size() && i + 2 < upto &&
                           m_fused_end[i + 2] == static_cast<int>(i);
    if (fused_run) {  // the run's output and what the fused layer saved
      b += m_acts[i + 2].numel() * 4 + m_fused[i]->saved_bytes();
      i += 2;
      continue;
    }
    b += m_acts[i].numel() * 4 + m_modules[i]->saved_bytes();
  }
  return b;
}

Model::ParamLayout Model::param_layout() {
  ParamLayout l;
  l.first_with_params = m_modules.size();
  int total = 0;
  for (size_t i = 0; i < m_modules.size(); ++i) {
    const int np = static_cast<int>(m_modules[i]->params().size());
    if (np > 0 && l.first_with_params == m_modules.size()) l.first_with_params = i;
    l.first.push_back(total);
    l.count.push_back(np);
    total += np;
  }
  return l;
}

std::vector<std::vector<int64_t>> Model::module_output_shapes(const std::vector<int64_t>& sample_shape) {
  std::vector<int64_t> shape{1};
  shape.insert(shape.end(), sample_shape.begin(), sample_shape.end());
  // The CPU modules' forward (an executor keeps no per-module outputs): shapes only, nothing changes.
  std::unique_ptr<ModelExecutor> exec = std::move(m_exec);
  const bool fusion = m_fusion;
  m_fusion = false;
  forward(Tensor(shape), Mode::Eval);
  m_fusion = fusion;
  m_exec = std::move(exec);
  std::vector<std::vector<int64_t>> out;
  for (size_t i = 0; i < m_modules.size(); ++i) out.emplace_back(m_acts[i].shape.begin() + 1, m_acts[i].shape.end());
  return out;
}

std::vector<int64_t> Model::module_macs(const std::vector<int64_t>& sample_shape) {
  const std::vector<std::vector<int64_t>> outs = module_output_shapes(sample_shape);
  std::vector<int64_t> out;
  for (size_t i = 0; i < m_modules.size(); ++i) {
    std::vector<int64_t> in{1};
    const std::vector<int64_t>& s = i == 0 ? sample_shape : outs[i - 1];
    in.insert(in.end(), s.begin(), s.end());
    out.push_back(m_modules[i]->forward_macs(in));
  }
  return out;
}

int64_t Model::train_flops_per_sample(const std::vector<int64_t>& sample_shape) {
  const std::vector<int64_t> macs = module_macs(sample_shape);
  int64_t fwd = 0, dx = 0;
  bool first = true;
  for (size_t i = 0; i < m_modules.size(); ++i) {
    fwd += macs[i];
    if (m_modules[i]->params().empty()) continue;
    if (!first) dx += macs[i];
    first = false;
  }
  return 2 * (2 * fwd + dx);  // forward and weight gradients: fwd each; input gradients: dx
}

std::vector<Param*> Model::params() {
  std::vector<Param*> out;
  for (auto& m : m_modules)
    for (Param* p : m->params()) out.push_back(p);
  return out;
}

std::vector<StateEntry> Model::state_dict() {
  std::vector<StateEntry> out;
  for (size_t i = 0; i < m_modules.size(); ++i) {
    const std::string prefix = std::to_string(i) + ".";
    for (Param* p : m_modules[i]->params()) out.push_back({prefix + p->name, p, nullptr});
    for (Buffer* b : m_modules[i]->buffers()) out.push_back({prefix + b->name, nullptr, b});
  }
  return out;
}

std::vector<BatchNorm*> Model::batchnorms() {
  std::vector<BatchNorm*> out;
  for (auto& m : m_modules)
    if (auto* bn = dynamic_cast<BatchNorm*>(m.get())) out.push_back(bn);
  return out;
}

std::vector<int> Model::batchnorm_module_index() {
  std::vector<int> out;
  for (size_t i = 0; i < m_modules.size(); ++i)
    if (dynamic_cast<BatchNorm*>(m_modules[i].get())) out.push_back(static_cast<int>(i));
  return out;
}

void Model::zero_grad() {
  for (Param* p : params()) p->grad.zero();
  if (m_exec) m_exec->zero_grads();
}

bool Model::grad_finite(size_t i) {
  if (float* g = device_grad(i)) {
    const Param& p = *params()[i];
    return m_exec->device_memory()->all_finite(g, p.value.data.size());
  }
  return all_finite(params()[i]->grad);
}

int Model::first_nonfinite_grad(const std::vector<int>& order) {
  const std::vector<Param*> ps = params();
  std::vector<const float*> xs;
  std::vector<size_t> counts;
  std::vector<int> on_device;                 // the indices xs holds, in order
  std::vector<char> device_held(ps.size(), 0);  // per parameter: its gradient is in xs
  for (int i : order)
    if (const float* g = device_grad(static_cast<size_t>(i))) {
      xs.push_back(g);
      counts.push_back(ps[static_cast<size_t>(i)]->value.data.size());
      on_device.push_back(i);
      device_held[static_cast<size_t>(i)] = 1;
    }
  const int k = xs.empty() ? -1 : m_exec->device_memory()->first_nonfinite(xs, counts);
  const int device_first = k < 0 ? -1 : on_device[static_cast<size_t>(k)];
  for (int i : order) {
    if (i == device_first) return i;
    if (!device_held[static_cast<size_t>(i)] && !all_finite(ps[static_cast<size_t>(i)]->grad)) return i;
  }
  return -1;
}

std::string Model::describe() const {
  std::string s = "Sequential(";
  for (size_t i = 0; i < m_modules.size(); ++i) {
    if (i) s += ", ";
    s += m_modules[i]->describe();
  }
  return s + ")";
}

namespace {

std::unique_ptr<BatchNorm> make_bn(const BatchNormOptions& base, int features, int spatial_dims) {
  BatchNormOptions o = base;
  o.num_features = features;
  o.spatial_dims = spatial_dims;
  return std::make_unique<BatchNorm>(o);
}

}  // namespace

std::unique_ptr<Model> build_model(const ModelOptions& opt, uint64_t seed) {
  // Modules are built in tools/torch/dtlab_models.py's order and each draws its initial weights
  // from g as it is built, exactly as the nn.Module constructors do after torch.manual_seed(seed).
  TorchGenerator g(seed);
  auto model = std::make_unique<Model>();
  auto linear = [&](int in, int out) {
    auto m = std::make_unique<Linear>(in, out);
    m->reset_parameters(g);
    model->add(std::move(m));
  };
  auto conv = [&](int cin, int cout) {
    auto m = std::make_unique<Conv2d>(cin, cout, 3, 1, false);
    m->reset_parameters(g);
    model->add(std::move(m));
  };
  auto batchnorm = [&](int features, int spatial_dims) {
    std::unique_ptr<Module> m = opt.make_batchnorm ? opt.make_batchnorm(features, spatial_dims)
                                                   : make_bn(opt.bn, features, spatial_dims);
    if (m) model->add(std::move(m));
  };
  if (opt.name == "mlp") {
    model->add(std::make_unique<Flatten>());
    linear(784, 256);
    batchnorm(256, 0);
    model->add(std::make_unique<ReLU>());
    linear(256, 128);
    batchnorm(128, 0);
    model->add(std::make_unique<ReLU>());
    linear(128, 10);
  } else if (opt.name == "cnn") {
    conv(1, 32);
    batchnorm(32, 2);
    model->add(std::make_unique<ReLU>());
    model->add(std::make_unique<MaxPool2d>(2));
    conv(32, 64);
    batchnorm(64, 2);
    model->add(std::make_unique<ReLU>());
    model->add(std::make_unique<MaxPool2d>(2));
    model->add(std::make_unique<Flatten>());
    linear(64 * 7 * 7, 128);
    model->add(std::make_unique<ReLU>());
    linear(128, 10);
  } else {
    throw ConfigError("unknown model '" + opt.name + "'", "choose one of: mlp, cnn");
  }
  return model;
}

void copy_state(Model& src, Model& dst) {
  src.to_host(kStateModel);
  std::vector<StateEntry> s = src.state_dict();
  std::vector<StateEntry> d = dst.state_dict();
  assert(s.size() == d.size());
  for (size_t i = 0; i < s.size(); ++i) {
    assert(s[i].name == d[i].name);
    if (s[i].param) {
      assert(d[i].param && d[i].param->value.shape == s[i].param->value.shape);
      d[i].param->value.data = s[i].param->value.data;
    } else {
      assert(d[i].buffer && d[i].buffer->is_int64 == s[i].buffer->is_int64);
      d[i].buffer->value.data = s[i].buffer->value.data;
      d[i].buffer->i64 = s[i].buffer->i64;
    }
  }
  dst.host_changed(kStateModel);
}

std::vector<std::string> param_names(Model& model) {
  std::map<const Param*, std::string> by_ptr;
  for (const StateEntry& e : model.state_dict())
    if (e.param) by_ptr[e.param] = e.name;
  std::vector<std::string> out;
  for (const Param* p : model.params()) out.push_back(by_ptr.at(p));
  return out;
}

std::vector<std::string> param_names(Model& model, const std::vector<Param*>& params, const std::string& prefix) {
  std::map<const Param*, std::string> by_ptr;
  for (const StateEntry& e : model.state_dict())
    if (e.param) by_ptr[e.param] = e.name;
  std::vector<std::string> out;
  for (const Param* p : params) {
    const auto it = by_ptr.find(p);
    out.push_back(prefix + (it == by_ptr.end() ? p->name : it->second));
  }
  return out;
}

std::vector<int64_t> param_numels(Model& model) {
  std::vector<int64_t> out;
  for (const Param* p : model.params()) out.push_back(p->value.numel());
  return out;
}

}  // namespace lab
