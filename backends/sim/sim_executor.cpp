#include "sim_executor.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstring>
#include <limits>

#include <nlohmann/json.hpp>

#include "batchnorm.h"
#include "conv2d.h"
#include "errors.h"
#include "flatten.h"
#include "linear.h"
#include "maxpool2d.h"
#include "optim.h"
#include "relu.h"

namespace lab {

namespace {

const char* const kSupported = "the simulated GPU runs what the GPU runs: Flatten, Linear, Conv2d, BatchNorm1d, "
                               "BatchNorm2d, ReLU and MaxPool2d";

// The device's copy of host module m (nullptr for a host-staged BatchNorm, whose host half
// finishes each step).
std::unique_ptr<Module> device_copy(Module& m, size_t index, bool resident) {
  const std::string kind = m.kind();
  if (kind == "Flatten") return std::make_unique<Flatten>();
  if (kind == "BatchNorm1d" || kind == "BatchNorm2d") {
    const auto* bn = dynamic_cast<BatchNorm*>(&m);
    if (!bn) throw Error("module " + std::to_string(index) + ": a " + kind + " that is not lab::BatchNorm");
    if (!resident) return nullptr;
    return std::make_unique<BatchNorm>(bn->options());
  }
  if (kind == "Linear") {
    const auto& l = dynamic_cast<Linear&>(m);
    return std::make_unique<Linear>(l.in_features(), l.out_features(), l.has_bias());
  }
  if (kind == "Conv2d") {
    const auto& c = dynamic_cast<Conv2d&>(m);
    return std::make_unique<Conv2d>(c.in_channels(), c.out_channels(), c.kernel_size(), c.padding(), c.has_bias());
  }
  if (kind == "ReLU") return std::make_unique<ReLU>();
  if (kind == "MaxPool2d") return std::make_unique<MaxPool2d>(dynamic_cast<MaxPool2d&>(m).kernel_size());
  throw ConfigError("--device sim cannot run module " + std::to_string(index) + " (" + m.describe() + "): the GPU executor has no " +
                        kind + " layer",
                    std::string(kSupported) + "; run this model with --device cpu");
}

int64_t inner_of(const Tensor& x) {
  int64_t inner = 1;
  for (int d = 2; d < x.ndim(); ++d) inner *= x.dim(d);
  return inner;
}

void poison(Tensor& t) { std::fill(t.data.begin(), t.data.end(), std::numeric_limits<float>::quiet_NaN()); }

void poison(std::vector<float>& v) { std::fill(v.begin(), v.end(), std::numeric_limits<float>::quiet_NaN()); }

uint64_t bytes_of(const Tensor& t) { return static_cast<uint64_t>(t.numel()) * sizeof(float); }

constexpr size_t kLossTag = ~size_t{0};  // the loss's span: no module (tag -1)

// BatchNorm's buffers (running statistics, num_batches_tracked) from one copy of the layer to the
// other; the bytes a GPU would copy.
uint64_t copy_buffers(BatchNorm& from, BatchNorm& to) {
  const std::vector<Buffer*> f = from.buffers(), t = to.buffers();
  uint64_t bytes = 0;
  for (size_t b = 0; b < f.size(); ++b) {
    t[b]->value = f[b]->value;
    t[b]->i64 = f[b]->i64;
    bytes += f[b]->is_int64 ? sizeof(int64_t) : bytes_of(f[b]->value);
  }
  return bytes;
}

}  // namespace

// SyncBatchNorm's collectives of a device copy of a BatchNorm: the host layer's BnSync (the run's,
// set after the executor was attached), asked to work on the simulated device's memory.
class SimBnSync final : public BnSync {
 public:
  SimBnSync(SimExecutor& ex, BnSync& host) : m_ex(ex), m_host(&host) {}
  void retarget(BnSync& host) { m_host = &host; }
  int world_size() const override { return m_host->world_size(); }
  void allgather(const float* mine, int n, std::vector<float>& all) override {
    const int world = world_size();
    all.resize(static_cast<size_t>(world) * static_cast<size_t>(n));
    m_host->allgather_on(m_ex.m_memory, mine, n, all.data());
    // every rank's count (the row's last value) to the host: the batch-of-one check and the empty
    // ranks' rows, where PyTorch's SyncBatchNorm synchronizes too
    m_ex.copied(true, static_cast<uint64_t>(world) * sizeof(float), now_seconds());
  }
  void allreduce_sum(float* data, int n) override { m_host->allreduce_sum_on(m_ex.m_memory, data, n); }

 private:
  SimExecutor& m_ex;
  BnSync* m_host;
};

void SimDeviceMemory::copy(void* dst, const void* src, size_t bytes) {
  if (bytes > 0) std::memcpy(dst, src, bytes);
  m_device += bytes;
}

void SimDeviceMemory::add(float* acc, const float* in, size_t count) {
  for (size_t i = 0; i < count; ++i) acc[i] += in[i];
  m_device += count * sizeof(float);
}

void SimDeviceMemory::download(void* host, const void* device, size_t bytes) {
  if (bytes > 0) std::memcpy(host, device, bytes);
  m_down += bytes;
}

void SimDeviceMemory::upload(void* device, const void* host, size_t bytes) {
  if (bytes > 0) std::memcpy(device, host, bytes);
  m_up += bytes;
}

void SimDeviceMemory::scale(float* x, float k, size_t count) {
  for (size_t i = 0; i < count; ++i) x[i] *= k;
  m_device += count * sizeof(float);
}

void SimDeviceMemory::divide(float* x, float d, size_t count) {
  for (size_t i = 0; i < count; ++i) x[i] /= d;
  m_device += count * sizeof(float);
}

bool SimDeviceMemory::all_finite(const float* x, size_t count) {
  m_device += count * sizeof(float);
  m_down += sizeof(int32_t);  // the answer
  ++m_answers;
  for (size_t i = 0; i < count; ++i)
    if (!std::isfinite(x[i])) return false;
  return true;
}

int SimDeviceMemory::first_nonfinite(const std::vector<const float*>& xs, const std::vector<size_t>& counts) {
  if (xs.empty()) return -1;
  m_down += xs.size() * sizeof(int32_t);  // a flag per buffer, in one answer
  ++m_answers;
  int first = -1;
  for (size_t i = 0; i < xs.size(); ++i) {
    m_device += counts[i] * sizeof(float);
    for (size_t k = 0; k < counts[i] && first < 0; ++k)
      if (!std::isfinite(xs[i][k])) first = static_cast<int>(i);
  }
  return first;
}

void* SimDeviceMemory::allocate(size_t bytes) { return ::operator new(bytes > 0 ? bytes : 1); }

void SimDeviceMemory::release(void* p) { ::operator delete(p); }

StagingTraffic SimExecutor::traffic() const {
  StagingTraffic t = m_traffic;
  t.device_to_host_bytes += m_memory.downloaded();
  t.host_to_device_bytes += m_memory.uploaded();
  return t;
}

SimExecutor::SimExecutor(Model& host, bool resident) : m_resident(resident), m_host(host) {
  const size_t n = host.size();
  for (size_t i = 0; i < n; ++i) {
    m_dev.push_back(device_copy(host.module(i), i, resident));
    m_ops.push_back(device_timeline_op(host.module(i).kind()));
    const bool bn = m_dev.back() && dynamic_cast<BatchNorm*>(m_dev.back().get());
    m_host_bn.push_back(bn ? dynamic_cast<BatchNorm*>(&host.module(i)) : nullptr);
    m_dev_bn.push_back(bn ? static_cast<BatchNorm*>(m_dev.back().get()) : nullptr);
  }
  m_bn_sync.resize(n);
  m_layout = host.param_layout();
  m_params = host.params();
  for (size_t i = 0; i < n; ++i) {
    const std::vector<Param*> dp = m_dev[i] ? m_dev[i]->params() : std::vector<Param*>{};
    for (int p = 0; p < m_layout.count[i]; ++p)
    {
      m_dev_params.push_back(dp.empty() ? nullptr : dp.at(static_cast<size_t>(p)));
      m_owner.push_back(i);
    }
  }
  m_in.resize(n);
  m_out.resize(n);
  m_grad.resize(n);
  m_state.resize(m_params.size());
  m_mirror.resize(m_params.size());
  m_state_stale.assign(m_params.size(), 0);
}

void SimExecutor::span(Phase phase, const char* op, size_t module, double t0) {
  Event e;
  e.kind = EventKind::Device;
  e.phase = phase;
  e.op = op;
  e.what = "kernels";
  e.tag = module == kLossTag ? -1 : static_cast<int32_t>(module);
  e.t_start = t0;
  e.t_end = now_seconds();
  m_spans.push_back(e);
}

void SimExecutor::copied(bool to_host, uint64_t bytes, double t0) {
  (to_host ? m_traffic.device_to_host_bytes : m_traffic.host_to_device_bytes) += bytes;
  Event e;
  e.kind = EventKind::Device;
  e.phase = m_phase;
  e.op = to_host ? "copy to host" : "copy to device";
  e.what = "copy";
  e.bytes = bytes;
  e.t_start = t0;
  e.t_end = now_seconds();
  m_spans.push_back(e);
}

void SimExecutor::take_device_events(std::vector<Event>& out) {
  out.insert(out.end(), m_spans.begin(), m_spans.end());
  m_spans.clear();
}

void SimExecutor::upload_params() {
  for (size_t i = 0; i < m_params.size(); ++i) {
    if (!m_dev_params[i]) continue;
    const double t0 = now_seconds();
    m_dev_params[i]->value.data = m_params[i]->value.data;
    m_dev_params[i]->value.shape = m_params[i]->value.shape;
    copied(false, bytes_of(m_params[i]->value), t0);
    ++m_count.params_uploaded;
  }
  m_device_params_stale = false;
}

void SimExecutor::upload_buffers() {
  for (size_t i = 0; i < m_host.size(); ++i) {
    if (!m_dev_bn[i]) continue;
    const double t0 = now_seconds();
    const uint64_t bytes = copy_buffers(*m_host_bn[i], *m_dev_bn[i]);
    if (bytes > 0) {
      copied(false, bytes, t0);
      ++m_count.buffers_uploaded;
    }
  }
  m_device_buffers_stale = false;
}

const Tensor& SimExecutor::forward(const Tensor& x, Mode mode) {
  const Tensor& out = run_forward(x, mode);
  const double tl = now_seconds();
  m_logits = out;
  copied(true, bytes_of(m_logits), tl);
  return m_logits;
}

bool SimExecutor::forward_loss(const Tensor& x, const std::vector<int>& labels, float& loss, int& correct) {
  const Tensor& logits = run_forward(x, Mode::Train);
  const double t0 = now_seconds();
  copied(false, labels.size() * sizeof(int32_t), t0);  // the labels up
  const double tk = now_seconds();
  loss = cross_entropy(logits, labels, &m_dlogits, &correct);  // on the device: the gradient stays there
  span(Phase::Forward, "cross-entropy", kLossTag, tk);
  copied(true, sizeof(float) + sizeof(int32_t), now_seconds());  // the loss and the hits down
  ++m_count.device_losses;
  return true;
}

void SimExecutor::backward_loss(const std::function<void(int)>& on_param_ready) {
  m_phase = Phase::Backward;
  run_backward(on_param_ready);
}

void SimExecutor::poison_loss_grad() {
  if (m_dlogits.numel() > 0) m_dlogits.data[0] = std::numeric_limits<float>::quiet_NaN();
}

const Tensor& SimExecutor::run_forward(const Tensor& x, Mode mode) {
  ++m_count.forwards;
  // Spans wait to be taken after the run's compute phase; an executor whose run never asks (the
  // evaluation copy's) drops them before they pile up, as the GPU's does.
  if (m_spans.size() > 4096) m_spans.clear();
  // Until its optimizer steps here, the host's parameters are the state: taken up every time.
  m_phase = mode == Mode::Train ? Phase::Forward : Phase::Eval;
  if (!m_resident || !m_stepping || m_device_params_stale) upload_params();
  if (m_device_buffers_stale) upload_buffers();
  if (mode == Mode::Train && m_resident) {
    // the device's BatchNorm buffers and statistics move on: the host's are mirrors until to_host
    for (size_t i = 0; i < m_host.size(); ++i) {
      BatchNorm* h = m_host_bn[i];
      if (!h) continue;
      for (Buffer* b : h->buffers()) {
        poison(b->value);
        if (b->is_int64) b->i64 = std::numeric_limits<int64_t>::min();
      }
      BnBatchStats st = h->last_stats();
      poison(st.mean), poison(st.var), poison(st.local_mean), poison(st.local_var);
      st.count = st.local_count = -1;
      h->set_last_stats(std::move(st));
    }
    m_host_buffers_stale = m_host_stats_stale = true;
  }
  const double tx = now_seconds();
  m_x = x;
  copied(false, bytes_of(x), tx);
  const Phase phase = m_phase;
  const Tensor* in = &m_x;
  for (size_t i = 0; i < m_host.size(); ++i) {
    const double t0 = now_seconds();
    m_in[i] = *in;
    if (BatchNorm* dev_bn = m_dev_bn[i]) {  // whole on the device, SyncBN's collectives too
      BnSync* sync = m_host_bn[i]->sync();
      if (sync && !m_bn_sync[i]) m_bn_sync[i] = std::make_unique<SimBnSync>(*this, *sync);
      if (sync) static_cast<SimBnSync&>(*m_bn_sync[i]).retarget(*sync);
      dev_bn->set_sync(sync ? m_bn_sync[i].get() : nullptr);
      dev_bn->set_error_hint(m_host_bn[i]->error_hint());
      dev_bn->forward(*in, m_out[i], mode);
    } else if (auto* bn = dynamic_cast<BatchNorm*>(&m_host.module(i))) {  // staged: the host finishes it
      bn->check_input(in->shape);
      std::vector<float> mean, var_sum;
      if (bn->uses_batch_stats(mode)) bn->local_stats(*in, mean, var_sum);  // on the device; to the host
      copied(true, (mean.size() + var_sum.size()) * sizeof(float), now_seconds());
      bn->prepare_from_local_stats(in->shape, mode, std::move(mean), std::move(var_sum));  // the host's half
      copied(false, (bn->alpha().size() + bn->beta().size()) * sizeof(float), now_seconds());
      m_out[i].resize(in->shape);
      channel_affine(in->ptr(), m_out[i].ptr(), nullptr, in->dim(0), in->dim(1), inner_of(*in), bn->alpha().data(),
                     bn->beta().data());
    } else {
      m_dev[i]->forward(*in, m_out[i], mode);
    }
    if (m_ops[i]) span(phase, m_ops[i], i, t0);
    in = &m_out[i];
  }
  return *in;
}

void SimExecutor::backward(const Tensor& dlogits, const std::function<void(int)>& on_param_ready) {
  m_phase = Phase::Backward;
  const double td = now_seconds();
  m_dlogits = dlogits;
  copied(false, bytes_of(dlogits), td);
  run_backward(on_param_ready);
}

void SimExecutor::run_backward(const std::function<void(int)>& on_param_ready) {
  if (m_keep_grads) take_up_grads();  // the host wrote them since (a restored checkpoint)
  const size_t count = m_host.size();
  for (size_t i = count; i-- > m_layout.first_with_params;) {
    const double t0 = now_seconds();
    const Tensor& dy = i + 1 == count ? m_dlogits : m_grad[i];
    Tensor* dx = i > m_layout.first_with_params ? &m_grad[i - 1] : nullptr;
    BatchNorm* bn = m_dev[i] ? nullptr : dynamic_cast<BatchNorm*>(&m_host.module(i));
    if (bn) {  // host-staged: the host finishes it
      std::vector<double> sum_dy, sum_dy_xmu;
      bn->grad_sums(dy, m_in[i], sum_dy, sum_dy_xmu);  // on the device; to the host
      copied(true, (sum_dy.size() + sum_dy_xmu.size()) * sizeof(float), now_seconds());
      const BatchNorm::InputGradCoefficients* k = bn->finish_backward(sum_dy, sum_dy_xmu, dx != nullptr);  // adds the host's grads
      if (dx) {
        copied(false, k->grad_mean.size() * 3 * sizeof(float), now_seconds());
        const Tensor& x = m_in[i];
        dx->resize(x.shape);
        channel_input_grad(dy.ptr(), x.ptr(), dx->ptr(), x.dim(0), x.dim(1), inner_of(x), k->grad_mean.data(),
                           bn->mean().data(), k->k.data(), k->scale.data());
      }
    } else {
      Module& dev = *m_dev[i];
      for (Param* p : dev.params()) p->grad.zero();
      dev.backward(dy, dx);
      const std::vector<Param*> hp = m_host.module(i).params(), dp = dev.params();
      for (size_t p = 0; p < hp.size(); ++p) {
        const size_t index = static_cast<size_t>(m_layout.first[i]) + p;
        const float* d = dp[p]->grad.ptr();
        if (m_keep_grads && m_dev_params[index]) {  // kept on the device, accumulated there
          float* g = m_dgrad[index].ptr();
          for (int64_t e = 0; e < m_dgrad[index].numel(); ++e) g[e] += d[e];
          poison(hp[p]->grad);  // the host's copy is a mirror now
          m_host_grads_stale = true;
          continue;
        }
        // on the host (the collectives read them there): downloaded and added
        const double tg = now_seconds();
        float* h = hp[p]->grad.ptr();
        for (int64_t e = 0; e < hp[p]->grad.numel(); ++e) h[e] += d[e];
        copied(true, bytes_of(dp[p]->grad), tg);
        m_count.grad_bytes_to_host += bytes_of(dp[p]->grad);
      }
    }
    if (m_ops[i]) span(Phase::Backward, m_ops[i], i, t0);
    if (on_param_ready)
      for (int p = m_layout.count[i] - 1; p >= 0; --p) on_param_ready(m_layout.first[i] + p);
  }
}

void SimExecutor::to_host(unsigned sets) {
  if (!m_resident) return;
  if ((sets & kStateParams) && m_host_params_stale) {
    for (size_t i = 0; i < m_params.size(); ++i)
      if (m_dev_params[i]) {  // stale only once step_param has stepped them
        const double t0 = now_seconds();
        m_params[i]->value.data = m_dev_params[i]->value.data;
        copied(true, bytes_of(m_params[i]->value), t0);
        ++m_count.params_to_host;
      }
    m_host_params_stale = false;
  }
  if ((sets & kStateGrads) && m_host_grads_stale) {
    for (size_t i = 0; i < m_params.size(); ++i)
      if (m_keep_grads && m_dev_params[i]) {
        const double t0 = now_seconds();
        m_params[i]->grad.data = m_dgrad[i].data;
        copied(true, bytes_of(m_dgrad[i]), t0);
      }
    m_host_grads_stale = false;
  }
  if ((sets & kStateBuffers) && (m_host_buffers_stale || m_host_stats_stale)) {
    for (size_t i = 0; i < m_host.size(); ++i) {
      if (!m_dev_bn[i]) continue;
      const double t0 = now_seconds();
      uint64_t bytes = m_host_buffers_stale ? copy_buffers(*m_dev_bn[i], *m_host_bn[i]) : 0;
      if (m_host_stats_stale) {
        const BnBatchStats& st = m_dev_bn[i]->last_stats();
        // (the counts are the host's: it knows every rank's batch, SyncBN's from the gathered rows)
        bytes += (st.mean.size() + st.var.size() + st.local_mean.size() + st.local_var.size()) * sizeof(float);
        m_host_bn[i]->set_last_stats(st);
      }
      copied(true, bytes, t0);
      ++m_count.buffers_to_host;
    }
    m_host_buffers_stale = m_host_stats_stale = false;
  }
  if ((sets & kStateMomentum) && m_host_momentum_stale) {
    for (size_t i = 0; i < m_params.size(); ++i)
      for (size_t s = 0; s < m_mirror[i].size(); ++s) {
        const double t0 = now_seconds();
        m_mirror[i][s]->data = m_state[i][s].data;
        copied(true, bytes_of(m_state[i][s]), t0);
      }
    m_host_momentum_stale = false;
  }
}

void SimExecutor::host_changed(unsigned sets) {
  if (!m_resident) return;
  if (sets & kStateParams) {
    m_device_params_stale = true;
    m_host_params_stale = false;
  }
  if (sets & kStateMomentum) {
    std::fill(m_state_stale.begin(), m_state_stale.end(), 1);
    m_host_momentum_stale = false;
  }
  if ((sets & kStateGrads) && m_keep_grads) {
    m_device_grads_stale = true;
    m_host_grads_stale = false;
  }
  if (sets & kStateBuffers) {  // the buffers; the batch statistics, which the host never writes, stay the device's
    m_device_buffers_stale = true;
    m_host_buffers_stale = false;
  }
}

bool SimExecutor::keep_grads(bool on) {
  if (on && !m_resident) return false;  // host-staged: the gradients are the host's
  if (on && !m_keep_grads) {
    m_dgrad.assign(m_params.size(), Tensor{});
    for (size_t i = 0; i < m_params.size(); ++i)
      if (m_dev_params[i]) m_dgrad[i] = m_params[i]->grad;  // what the host has accumulated so far
    m_host_grads_stale = false;
    m_device_grads_stale = false;
  } else if (!on && m_keep_grads) {
    to_host(kStateGrads);
  }
  m_keep_grads = on;
  return on;
}

void SimExecutor::take_up_grads() {
  if (!m_device_grads_stale) return;
  for (size_t i = 0; i < m_params.size(); ++i)
    if (m_dev_params[i]) {
      const double t0 = now_seconds();
      m_dgrad[i].data = m_params[i]->grad.data;
      copied(false, bytes_of(m_dgrad[i]), t0);
    }
  m_device_grads_stale = false;
}

float* SimExecutor::device_grad(size_t index) {
  if (!m_keep_grads || !m_dev_params[index]) return nullptr;
  take_up_grads();
  return m_dgrad[index].ptr();
}

void SimExecutor::zero_grads() {
  if (!m_keep_grads) return;
  for (size_t i = 0; i < m_params.size(); ++i)
    if (m_dev_params[i]) m_dgrad[i].zero();
  m_device_grads_stale = false;  // zero on both sides
  m_host_grads_stale = false;
}

bool SimExecutor::step_param(size_t index, const OptimizerOptions& opt, int64_t step,
                             const std::vector<Tensor*>& host_state) {
  if (!m_resident || !m_dev_params[index]) return false;
  const bool first = step == 1;
  m_phase = Phase::OptimizerStep;
  if (m_device_params_stale) upload_params();  // the host wrote them after the last forward: its values first
  const double t0 = now_seconds();
  m_stepping = true;
  Param& d = *m_dev_params[index];
  const Tensor* g = &m_params[index]->grad;  // the host's gradient (averaged, accumulated), taken up
  if (m_keep_grads) {
    take_up_grads();
    g = &m_dgrad[index];  // already here
  } else {
    copied(false, bytes_of(*g), now_seconds());
  }
  // the optimizer's state of this parameter on the device: zeros at the first step (SGD's momentum
  // is filled from the gradient there), the host's after it wrote them (a restored checkpoint)
  std::vector<Tensor>& st = m_state[index];
  st.resize(host_state.size());
  for (size_t s = 0; s < host_state.size(); ++s) {
    if (st[s].numel() != d.value.numel()) st[s] = Tensor(d.value.shape, 0.0f);
    if (m_state_stale[index] && !first) {
      const double tb = now_seconds();
      st[s].data = host_state[s]->data;
      copied(false, bytes_of(st[s]), tb);
    }
    // the host's tensor is the device's mirror from now on: poisoned until to_host
    host_state[s]->resize(d.value.shape);
    poison(*host_state[s]);
  }
  m_state_stale[index] = 0;
  m_mirror[index] = host_state;
  if (!host_state.empty()) m_host_momentum_stale = true;
  if (opt.is_sgd())
    sgd_apply(opt.sgd, first, d.value.ptr(), g->ptr(), st.empty() ? nullptr : st[0].ptr(), d.value.numel());
  else
    adam_apply(opt.adam, step, d.value.ptr(), g->ptr(), st[0].ptr(), st[1].ptr(), d.value.numel());
  poison(m_params[index]->value);  // a mirror the device has moved past
  m_host_params_stale = true;
  ++m_count.device_steps;
  span(Phase::OptimizerStep, opt.is_sgd() ? "sgd" : "adam", m_owner[index], t0);
  return true;
}

std::string SimExecutor::report_json() const {
  nlohmann::json algos = nlohmann::json::array();
  for (size_t i = 0; i < m_host.size(); ++i) {
    const auto* c = dynamic_cast<const Conv2d*>(m_dev[i].get());
    if (!c) continue;
    const std::string layer = "conv k" + std::to_string(c->kernel_size()) + " p" + std::to_string(c->padding());
    for (const char* pass : {"forward", "backward data", "backward filter"})
      algos.push_back({{"layer", layer},
                       {"pass", pass},
                       {"algo", "im2col + sgemm"},
                       {"how", "the CPU's"},
                       {"deterministic", true},
                       {"math", "FMA"}});
  }
  return nlohmann::json{{"device", "sim"},
                        {"resident", m_resident},
                        {"conv_algorithms", algos},
                        {"protocol",
                         {{"forwards", m_count.forwards},
                          {"params_uploaded", m_count.params_uploaded},
                          {"params_to_host", m_count.params_to_host},
                          {"buffers_uploaded", m_count.buffers_uploaded},
                          {"buffers_to_host", m_count.buffers_to_host},
                          {"device_losses", m_count.device_losses},
                          {"device_steps", m_count.device_steps},
                          {"grad_bytes_to_host", m_count.grad_bytes_to_host}}}}
      .dump();
}

}  // namespace lab
