#include "optim.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "elementwise.h"
#include "executor.h"
#include "parallel.h"

namespace lab {

float cross_entropy(const Tensor& logits, const std::vector<int>& labels, Tensor* dlogits, int* correct) {
  const int64_t n = logits.ndim() == 2 ? logits.dim(0) : 0;
  return static_cast<float>(cross_entropy_part(logits, labels, n, dlogits, correct) / static_cast<double>(n));
}

double cross_entropy_part(const Tensor& logits, const std::vector<int>& labels, int64_t mean_over, Tensor* dlogits,
                          int* correct) {
  assert(logits.ndim() == 2 && logits.dim(0) == static_cast<int64_t>(labels.size()));
  const int64_t n = logits.dim(0), c = logits.dim(1);
  if (dlogits) dlogits->resize(logits.shape);
  double total = 0.0;
  int hits = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int label = labels[static_cast<size_t>(i)];
    assert(label >= 0 && label < c);
    // log_softmax(z) = z - max - log(sum exp(z - max)): no overflow for large logits; the argmax
    // with torch.argmax's rules; d(mean loss)/dz = (softmax(z) - onehot(label)) / N. One row of
    // elementwise.h, shared with the GPU.
    int64_t best = 0;
    total += cross_entropy_row(logits.ptr() + i * c, c, label, mean_over, dlogits ? dlogits->ptr() + i * c : nullptr,
                               &best);
    if (best == label) ++hits;
  }
  if (correct) *correct = hits;
  return total;
}

Optimizer::Optimizer(std::vector<Param*> params, const OptimizerOptions& opt) : m_params(std::move(params)), m_opt(opt) {
  assert(opt.kind == "sgd" || opt.kind == "adam" || opt.kind == "adamw");
  m_opt.adam.decoupled = opt.kind == "adamw";
  m_buf.resize(m_params.size());
}

void Optimizer::set_lr(double lr) {
  if (m_opt.is_sgd())
    m_opt.sgd.lr = lr;
  else
    m_opt.adam.lr = lr;
}

namespace {

// The SGD update of one parameter, specialized on the loop-invariant choices so that each variant
// is a branch-free loop GCC vectorizes at -O2 (with the choices as runtime flags it stays scalar:
// ~8% of an mlp step). The element's arithmetic is sgd_element of elementwise.h (SgdCoeffs there),
// shared with the GPU.
//   w, g, buf: (n,) the parameter, its gradient and its momentum buffer
// Blocks of kLanes: the loop shape GCC vectorizes at -O2.
constexpr int kLanes = 8;
constexpr int64_t kChunk = 16384;  // values per slice of work for the compute threads

template <bool kDecay, bool kMomentum, bool kFirst, bool kNesterov>
void sgd_update(float* __restrict w, const float* __restrict g, float* __restrict buf, int64_t n, SgdCoeffs k) {
  float unused[kLanes];  // stands in for the momentum buffer when there is none
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int j = 0; j < kLanes; ++j)
      sgd_element<kDecay, kMomentum, kFirst, kNesterov>(w[i + j], g[i + j], kMomentum ? buf[i + j] : unused[j], k);
  for (; i < n; ++i) sgd_element<kDecay, kMomentum, kFirst, kNesterov>(w[i], g[i], kMomentum ? buf[i] : unused[0], k);
}

template <bool kDecay>
void sgd_dispatch(bool momentum, bool first, bool nesterov, float* w, const float* g, float* buf, int64_t n,
                  SgdCoeffs k) {
  if (!momentum) return sgd_update<kDecay, false, false, false>(w, g, buf, n, k);
  if (first) {
    if (nesterov) return sgd_update<kDecay, true, true, true>(w, g, buf, n, k);
    return sgd_update<kDecay, true, true, false>(w, g, buf, n, k);
  }
  if (nesterov) return sgd_update<kDecay, true, false, true>(w, g, buf, n, k);
  return sgd_update<kDecay, true, false, false>(w, g, buf, n, k);
}

}  // namespace

void sgd_apply(const SgdOptions& opt, bool first, float* w, const float* g, float* buf, int64_t n) {
  const SgdCoeffs k = sgd_coeffs(opt.lr, opt.momentum, opt.dampening, opt.weight_decay);
  const bool momentum = opt.momentum != 0.0;
  // weight_decay == 0 skips the add entirely (as PyTorch does), so an inf weight stays inf.
  if (opt.weight_decay != 0.0)
    sgd_dispatch<true>(momentum, first, opt.nesterov, w, g, momentum ? buf : nullptr, n, k);
  else
    sgd_dispatch<false>(momentum, first, opt.nesterov, w, g, momentum ? buf : nullptr, n, k);
}

namespace {

// Adam's update, specialized on the variant as sgd_update is.
template <bool kDecoupled, bool kDecay>
void adam_update(float* __restrict w, const float* __restrict g, float* __restrict m, float* __restrict v, int64_t n,
                 AdamCoeffs k) {
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int j = 0; j < kLanes; ++j) adam_element<kDecoupled, kDecay>(w[i + j], g[i + j], m[i + j], v[i + j], k);
  for (; i < n; ++i) adam_element<kDecoupled, kDecay>(w[i], g[i], m[i], v[i], k);
}

}  // namespace

void adam_apply(const AdamOptions& opt, int64_t step, float* w, const float* g, float* m, float* v, int64_t n) {
  const AdamCoeffs k = adam_coeffs(opt.lr, opt.beta1, opt.beta2, opt.eps, opt.weight_decay, step);
  const bool decay = opt.weight_decay != 0.0;
  if (opt.decoupled) {
    if (decay) return adam_update<true, true>(w, g, m, v, n, k);
    return adam_update<true, false>(w, g, m, v, n, k);
  }
  if (decay) return adam_update<false, true>(w, g, m, v, n, k);
  adam_update<false, false>(w, g, m, v, n, k);
}

void Optimizer::step() {
  const bool first = m_steps == 0;
  ++m_steps;
  if (!m_opt.is_sgd()) {
    // Adam: state['step'] += 1, then the update with its bias corrections
    if (first) {
      m_m.resize(m_params.size());
      m_v.resize(m_params.size());
    }
    for (size_t i = 0; i < m_params.size(); ++i) {
      if (!owns(i)) continue;  // another rank's (ZeroRedundancyOptimizer): no state, no step
      Param& p = *m_params[i];
      if (first) {  // exp_avg and exp_avg_sq: zeros like the parameter
        m_m[i] = Tensor(p.value.shape, 0.0f);
        m_v[i] = Tensor(p.value.shape, 0.0f);
      }
      if (m_device && m_device->step_param(i, m_opt, m_steps, {&m_m[i], &m_v[i]}))
        continue;  // stepped where the parameter lives
      const int64_t n = p.value.numel();
      parallel_for((n + kChunk - 1) / kChunk, [&](int64_t c0, int64_t c1, int) {
        const int64_t i0 = c0 * kChunk, len = std::min(n, c1 * kChunk) - i0;
        adam_apply(m_opt.adam, m_steps, p.value.ptr() + i0, p.grad.ptr() + i0, m_m[i].ptr() + i0, m_v[i].ptr() + i0,
                   len);
      });
    }
    return;
  }
  const SgdOptions& so = m_opt.sgd;
  const bool momentum = so.momentum != 0.0;
  for (size_t i = 0; i < m_params.size(); ++i) {
    if (!owns(i)) continue;  // another rank's (ZeroRedundancyOptimizer): no state, no step
    Param& p = *m_params[i];
    if (momentum && first) m_buf[i].resize(p.value.shape);
    if (m_device &&
        m_device->step_param(i, m_opt, m_steps, momentum ? std::vector<Tensor*>{&m_buf[i]} : std::vector<Tensor*>{}))
      continue;  // stepped where the parameter lives
    float* buf = momentum ? m_buf[i].ptr() : nullptr;
    // Elementwise: any split over the compute threads gives the same bits.
    const int64_t n = p.value.numel();
    parallel_for((n + kChunk - 1) / kChunk, [&](int64_t c0, int64_t c1, int) {
      const int64_t i0 = c0 * kChunk, len = std::min(n, c1 * kChunk) - i0;
      sgd_apply(so, first, p.value.ptr() + i0, p.grad.ptr() + i0, buf ? buf + i0 : nullptr, len);
    });
  }
}

void Optimizer::set_params(std::vector<Param*> params) {
  assert(m_steps == 0 && m_owned.empty() && !m_device);
  m_params = std::move(params);
  m_buf.assign(m_params.size(), Tensor());
}

void Optimizer::set_owned(std::vector<bool> owned) {
  assert(m_steps == 0 && (owned.empty() || owned.size() == m_params.size()));
  m_owned = std::move(owned);
}

DeviceStepPlan Optimizer::begin_device_step() {
  assert(m_owned.empty());  // --cuda-graphs steps every parameter (config.cpp refuses other modes)
  const bool first = m_steps == 0;
  ++m_steps;
  DeviceStepPlan plan;
  plan.opt = &m_opt;
  plan.step = m_steps;
  plan.state.resize(m_params.size());
  const bool momentum = m_opt.is_sgd() && m_opt.sgd.momentum != 0.0;
  if (first && !m_opt.is_sgd()) {  // as step(): exp_avg and exp_avg_sq, zeros like the parameter
    m_m.resize(m_params.size());
    m_v.resize(m_params.size());
  }
  for (size_t i = 0; i < m_params.size(); ++i) {
    if (!m_opt.is_sgd()) {
      if (first) m_m[i] = Tensor(m_params[i]->value.shape, 0.0f), m_v[i] = Tensor(m_params[i]->value.shape, 0.0f);
      plan.state[i] = {&m_m[i], &m_v[i]};
    } else if (momentum) {
      if (first) m_buf[i].resize(m_params[i]->value.shape);
      plan.state[i] = {&m_buf[i]};
    }
  }
  return plan;
}

std::vector<std::string> Optimizer::state_names_of(const OptimizerOptions& opt) {
  if (!opt.is_sgd()) return {"exp_avg", "exp_avg_sq"};
  if (opt.sgd.momentum != 0.0) return {"momentum"};
  return {};
}

std::vector<std::string> Optimizer::state_names() const {
  if (m_steps == 0) return {};
  return state_names_of(m_opt);
}

std::vector<Tensor>& Optimizer::state(const std::string& name) {
  if (m_device) m_device->to_host(kStateMomentum);  // a device's mirrors brought current
  if (name == "exp_avg") return m_m;
  if (name == "exp_avg_sq") return m_v;
  assert(name == "momentum");
  return m_buf;
}

void Optimizer::restore_state(std::map<std::string, std::vector<Tensor>> state, int64_t steps) {
  assert(steps > 0);
  m_steps = steps;
  for (const std::string& name : state_names()) {
    auto it = state.find(name);
    assert(it != state.end() && it->second.size() == m_params.size());
    (name == "exp_avg" ? m_m : name == "exp_avg_sq" ? m_v : m_buf) = std::move(it->second);
  }
  if (m_device) m_device->host_changed(kStateMomentum);
}

bool all_finite(const Tensor& t) {
  // NaN and infinity are the floats whose exponent bits are all ones. An OR of integer tests has
  // no dependency chain between elements, so it vectorizes (a float sum of v * 0 would not).
  const float* v = t.ptr();
  const size_t n = t.data.size();
  uint32_t bad = 0;
  for (size_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, v + i, sizeof bits);
    bad |= static_cast<uint32_t>((bits & 0x7f800000u) == 0x7f800000u);
  }
  return bad == 0;
}

int64_t Optimizer::state_bytes() const {
  int64_t b = 0;
  for (const std::vector<Tensor>* set : {&m_buf, &m_m, &m_v})
    for (const Tensor& t : *set) b += t.numel() * 4;
  return b;
}

}  // namespace lab
