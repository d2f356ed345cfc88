// StagedCpuExecutor: a CPU executor that follows the GPU executor's protocol (lab/nn/executor.h):
// the host-staged one (parameters copied to its own "device" modules at every forward, BatchNorm
// split at its statistics and gradient sums, gradients copied back and added, on_param_ready in
// Model::backward's order) and, with `resident`, the residency protocol. It computes with the
// CPU's ops, so a whole lab::Run through it must give the CPU run's bits. StagedBackend registers
// it as the program's device backend (--device cuda) for the length of a test.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "batchnorm.h"
#include "elementwise.h"
#include "executor.h"
#include "model.h"
#include "optim.h"

namespace testutil {

// ---- a CPU executor with the GPU's protocol ----

// resident: the residency protocol (executor.h), as the GPU's executor follows it: the Linear and
// Conv2d parameters and their momentum buffers stay on the "device" between steps, where
// sgd_param steps them; the host's copies are mirrors, and every mirror the device has moved
// past is poisoned (NaN) until to_host brings it current, so a reader that forgets to ask shows
// in the run's numbers.
class StagedCpuExecutor : public lab::ModelExecutor {
 public:
  StagedCpuExecutor(lab::Model& host, const lab::ModelOptions& mopt, bool resident = false)
      : m_resident(resident), m_host(host), m_dev(lab::build_model(mopt, 0)) {
    m_dev->set_fusion(false);
    const size_t n = host.size();
    m_in.resize(n);
    m_out.resize(n);
    m_grad.resize(n);
    const lab::Model::ParamLayout layout = host.param_layout();
    for (size_t i = 0; i < n; ++i)
      for (int p = 0; p < layout.count[i]; ++p) {
        const std::string kind = host.module(i).kind();
        m_on_device.push_back(m_resident && (kind == "Linear" || kind == "Conv2d"));
      }
    m_momentum.resize(m_on_device.size());
    m_momentum_mirror.assign(m_on_device.size(), nullptr);
  }

  ~StagedCpuExecutor() override;

  unsigned resident() const override { return m_resident ? lab::kStateAll : 0u; }
  void to_host(unsigned sets) override {
    if (!m_resident) return;
    const std::vector<lab::Param*> hp = m_host.params(), dp = m_dev->params();
    if ((sets & lab::kStateParams) && m_host_params_stale) {
      for (size_t i = 0; i < hp.size(); ++i)
        if (m_on_device[i]) {
          hp[i]->value.data = dp[i]->value.data;
          m_traffic.device_to_host_bytes += static_cast<uint64_t>(hp[i]->value.numel()) * 4;
          ++params_to_host;
        }
      m_host_params_stale = false;
    }
    if ((sets & lab::kStateMomentum) && m_host_momentum_stale) {
      for (size_t i = 0; i < hp.size(); ++i)
        if (m_momentum_mirror[i]) *m_momentum_mirror[i] = m_momentum[i];
      m_host_momentum_stale = false;
    }
  }
  void host_changed(unsigned sets) override {
    if (!m_resident) return;
    if (sets & lab::kStateParams) {
      m_device_params_stale = true;
      m_host_params_stale = false;
    }
    if (sets & lab::kStateMomentum) {
      m_device_momentum_stale = true;
      m_host_momentum_stale = false;
    }
  }
  bool sgd_param(size_t index, const lab::SgdOptions& opt, bool first, lab::Tensor& host_buffer) override {
    if (!m_on_device[index]) return false;
    const lab::SgdCoeffs k = lab::sgd_coeffs(opt.lr, opt.momentum, opt.dampening, opt.weight_decay);
    const bool wd = opt.weight_decay != 0.0, momentum = opt.momentum != 0.0, nesterov = opt.nesterov;
    if (m_device_params_stale) upload_params();
    lab::Param& d = *m_dev->params()[index];
    const lab::Tensor& g = m_host.params()[index]->grad;  // the host's (averaged) gradient, "uploaded"
    m_traffic.host_to_device_bytes += static_cast<uint64_t>(g.numel()) * 4;
    lab::Tensor& buf = m_momentum[index];
    if (momentum && (first || buf.numel() != d.value.numel())) buf.resize(d.value.shape);
    if (momentum && m_device_momentum_stale && !first) buf = host_buffer;  // a restored checkpoint's
    for (int64_t e = 0; e < d.value.numel(); ++e) {
      float& w = d.value.data[e];
      float& b = momentum ? buf.data[e] : w;
      const float ge = g.data[e];
      if (!momentum) wd ? lab::sgd_element<true, false, false, false>(w, ge, b, k) : lab::sgd_element<false, false, false, false>(w, ge, b, k);
      else if (first && nesterov) wd ? lab::sgd_element<true, true, true, true>(w, ge, b, k) : lab::sgd_element<false, true, true, true>(w, ge, b, k);
      else if (first) wd ? lab::sgd_element<true, true, true, false>(w, ge, b, k) : lab::sgd_element<false, true, true, false>(w, ge, b, k);
      else if (nesterov) wd ? lab::sgd_element<true, true, false, true>(w, ge, b, k) : lab::sgd_element<false, true, false, true>(w, ge, b, k);
      else wd ? lab::sgd_element<true, true, false, false>(w, ge, b, k) : lab::sgd_element<false, true, false, false>(w, ge, b, k);
    }
    // the host's copies are mirrors now: poisoned until to_host
    std::fill(m_host.params()[index]->value.data.begin(), m_host.params()[index]->value.data.end(), std::nanf(""));
    m_host_params_stale = true;
    if (momentum) {
      host_buffer.resize(d.value.shape);
      std::fill(host_buffer.data.begin(), host_buffer.data.end(), std::nanf(""));
      m_momentum_mirror[index] = &host_buffer;
      m_host_momentum_stale = true;
    }
    if (index + 1 == m_on_device.size() || std::find(m_on_device.begin() + static_cast<std::ptrdiff_t>(index) + 1,
                                                     m_on_device.end(), true) == m_on_device.end())
      m_device_momentum_stale = false;  // every device parameter has taken the host's buffers up
    ++device_steps;
    return true;
  }
  int params_to_host = 0, device_steps = 0;
  std::string describe() const override { return "staged-cpu (test)"; }
  lab::StagingTraffic traffic() const override { return m_traffic; }
  std::string report_json() const override {
    return R"({"conv_algorithms": [{"layer": "conv k3 p1", "pass": "forward", "algo": "im2col + sgemm",
               "how": "the only one", "deterministic": true, "math": "FMA"}]})";
  }

  const lab::Tensor& forward(const lab::Tensor& x, lab::Mode mode) override {
    ++forwards;
    if (m_spans.size() > 4096) m_spans.clear();  // a copy whose run never takes them (as the GPU's)
    // host-staged, or resident before its first step here: the host's parameters, every forward
    if (!m_resident || device_steps == 0 || m_device_params_stale) upload_params();
    const lab::Tensor* in = &x;
    for (size_t i = 0; i < m_host.size(); ++i) {
      const Timed span(*this, mode == lab::Mode::Train ? lab::Phase::Forward : lab::Phase::Eval, i);
      m_in[i] = *in;
      if (auto* bn = dynamic_cast<lab::BatchNorm*>(&m_host.module(i))) {
        std::vector<float> mean, var_sum;
        if (bn->uses_batch_stats(mode)) bn->local_stats(*in, mean, var_sum);  // "on the device"
        bn->prepare_from_local_stats(in->shape, mode, mean, var_sum);         // the host's half
        apply(*bn, *in, m_out[i]);
      } else {
        m_dev->module(i).forward(*in, m_out[i], mode);
      }
      in = &m_out[i];
    }
    m_logits = *in;
    m_traffic.device_to_host_bytes += static_cast<uint64_t>(m_logits.numel()) * 4;
    return m_logits;
  }

  void backward(const lab::Tensor& dlogits, const std::function<void(int)>& on_param_ready) override {
    const size_t count = m_host.size();
    const lab::Model::ParamLayout layout = m_host.param_layout();
    const size_t first_with_params = layout.first_with_params;
    for (size_t i = count; i-- > first_with_params;) {
      const Timed span(*this, lab::Phase::Backward, i);
      const lab::Tensor& dy = i + 1 == count ? dlogits : m_grad[i];
      lab::Tensor* dx = i > first_with_params ? &m_grad[i - 1] : nullptr;
      if (auto* bn = dynamic_cast<lab::BatchNorm*>(&m_host.module(i))) {
        std::vector<double> sum_dy, sum_dy_xmu;
        bn->grad_sums(dy, m_in[i], sum_dy, sum_dy_xmu);
        const auto* k = bn->finish_backward(sum_dy, sum_dy_xmu, dx != nullptr);  // adds the host grads
        if (dx) input_grad(*bn, *k, dy, m_in[i], *dx);
      } else {
        lab::Module& dev = m_dev->module(i);
        for (lab::Param* p : dev.params()) p->grad.zero();
        dev.backward(dy, dx);
        const std::vector<lab::Param*> hp = m_host.module(i).params(), dp = dev.params();
        for (size_t p = 0; p < hp.size(); ++p) {  // download and add
          for (int64_t e = 0; e < hp[p]->grad.numel(); ++e) hp[p]->grad.data[e] += dp[p]->grad.data[e];
          m_traffic.device_to_host_bytes += static_cast<uint64_t>(dp[p]->grad.numel()) * 4;
        }
      }
      if (on_param_ready)
        for (int p = layout.count[i] - 1; p >= 0; --p) on_param_ready(layout.first[i] + p);
    }
  }

  // The "device's" timeline: each layer's work timed on the host's clock, as the GPU's executor
  // times its kernels with CUDA events.
  void take_device_events(std::vector<lab::Event>& out) override {
    out.insert(out.end(), m_spans.begin(), m_spans.end());
    m_spans.clear();
  }

  int forwards = 0;

 private:
  struct Timed {
    Timed(StagedCpuExecutor& x, lab::Phase phase, size_t module) : x(x) {
      e.kind = lab::EventKind::Device;
      e.phase = phase;
      e.what = "kernels";
      e.tag = static_cast<int32_t>(module);
      const std::string kind = x.m_host.module(module).kind();
      e.op = kind == "Linear" ? "linear" : kind == "Conv2d" ? "conv2d" : kind.rfind("BatchNorm", 0) == 0 ? "batchnorm" : "other";
      e.t_start = lab::now_seconds();
    }
    ~Timed() {
      e.t_end = lab::now_seconds();
      x.m_spans.push_back(e);
    }
    StagedCpuExecutor& x;
    lab::Event e;
  };
  std::vector<lab::Event> m_spans;

  void upload_params() {
    for (size_t i = 0; i < m_host.size(); ++i) {
      const std::vector<lab::Param*> hp = m_host.module(i).params(), dp = m_dev->module(i).params();
      for (size_t p = 0; p < hp.size(); ++p) {
        dp[p]->value.data = hp[p]->value.data;
        m_traffic.host_to_device_bytes += static_cast<uint64_t>(hp[p]->value.numel()) * 4;
        ++params_uploaded;
      }
    }
    m_device_params_stale = false;
  }
 public:
  int params_uploaded = 0;

 private:
  bool m_resident = false;
  std::vector<bool> m_on_device;                // per parameter: kept and stepped on the "device"
  std::vector<lab::Tensor> m_momentum;          // the device's momentum buffers
  std::vector<lab::Tensor*> m_momentum_mirror;  // the host's (the optimizer's) copies
  bool m_device_params_stale = true, m_host_params_stale = false;
  bool m_device_momentum_stale = false, m_host_momentum_stale = false;
  static int64_t inner_of(const lab::Tensor& x) {
    int64_t inner = 1;
    for (int d = 2; d < x.ndim(); ++d) inner *= x.dim(d);
    return inner;
  }
  static void apply(const lab::BatchNorm& bn, const lab::Tensor& x, lab::Tensor& y) {
    y.resize(x.shape);
    const int64_t c = x.dim(1), inner = inner_of(x);
    for (int64_t i = 0; i < x.numel(); ++i) {
      const int64_t ch = (i / inner) % c;
      y.data[i] = lab::bn_affine(x.data[i], bn.alpha()[ch], bn.beta()[ch]);
    }
  }
  static void input_grad(const lab::BatchNorm& bn, const lab::BatchNorm::InputGradCoefficients& k, const lab::Tensor& dy,
                         const lab::Tensor& x, lab::Tensor& dx) {
    dx.resize(x.shape);
    const int64_t c = x.dim(1), inner = inner_of(x);
    for (int64_t i = 0; i < x.numel(); ++i) {
      const int64_t ch = (i / inner) % c;
      dx.data[i] = lab::bn_input_grad(dy.data[i], x.data[i], k.grad_mean[ch], bn.mean()[ch], k.k[ch], k.scale[ch]);
    }
  }

  lab::Model& m_host;
  std::unique_ptr<lab::Model> m_dev;  // the "device": same modules, parameters copied in
  std::vector<lab::Tensor> m_in, m_out, m_grad;
  lab::Tensor m_logits;
  lab::StagingTraffic m_traffic;
};

inline int g_executors = 0;
// the executors the backend made, in order (nullptr once destroyed: a run's evaluation copies go early)
inline std::vector<StagedCpuExecutor*> g_staged;
inline StagedCpuExecutor::~StagedCpuExecutor() { std::replace(g_staged.begin(), g_staged.end(), this, static_cast<StagedCpuExecutor*>(nullptr)); }

// Registers the staged executor as the program's device backend for the length of a test.
struct StagedBackend {
  explicit StagedBackend(bool resident = false) {
    g_executors = 0;
    g_staged.clear();
    lab::set_executor_factory([resident](lab::Model& m, const lab::ComputeOptions& opt, int) {
      EXPECT_EQ(opt.device, "cuda");
      ++g_executors;
      lab::ModelOptions mo;
      mo.name = m.describe().find("Conv2d") != std::string::npos ? "cnn" : "mlp";
      auto e = std::make_unique<StagedCpuExecutor>(m, mo, resident);
      g_staged.push_back(e.get());
      return e;
    });
  }
  ~StagedBackend() { lab::set_executor_factory({}); }
};

}  // namespace testutil
