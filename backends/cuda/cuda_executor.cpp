// CudaExecutor: lab::Model on one GPU, host-staged (lab/nn/executor.h states the contract). One
// device layer per module, in the model's order:
//   Flatten    a reshape: its output is its input's memory
//   Linear     cuBLAS sgemm (cuda_gemm.h), bias_add / bias_grad
//   Conv2d     cuDNN (cuda_conv.h), one CudnnConv2d per input (N, H, W): the last batch of an epoch
//              and the eval batches have another N; bias_add / bias_grad
//   BatchNorm  whole on the device: statistics, SyncBN's gather and allreduce on device buffers,
//              running statistics, the affine, the weight and bias gradients; the host's layer
//              decides only what the host knows (BatchNorm::begin_forward: shape checks,
//              num_batches_tracked, the batch-of-one error, with SyncBN from every rank's count)
//   ReLU       relu_forward / relu_backward with a byte mask
//   MaxPool2d  maxpool2x2_forward / _backward (kernel 2 only)
// Copies per training step (Staging counts them): host -> device the input, dlogits and, where
// the gradients are reduced on the host (keep_grads off), every gradient once reduced for the
// optimizer step on the device (step_param); device -> host the logits, with SyncBN every rank's
// count, and every gradient where the host reduces them. The parameters and momentum buffers stay
// on the device (residency, executor.h): taken up only after the host wrote them, brought down
// only when the host asks; so do BatchNorm's running statistics and batch statistics
// (kStateBuffers). A download waits for the stream: the host needs its values at once
// (on_param_ready, SyncBN's counts).
//
// The device's timeline (DeviceTimer): each layer's kernels and each copy are bracketed by a pair
// of CUDA events on the stream; take_device_events turns them into EventKind::Device spans on the
// host's clock, anchored at the last synchronizing download: the host reads the clock the moment
// that copy is known done, and every other span is placed by its device-measured distance from it.
//
// Sections: staging and timing | layers | executor | factory
#include "cuda_executor.h"

#include <array>
#include <cassert>
#include <chrono>
#include <cstring>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "batchnorm.h"
#include "conv2d.h"
#include "cuda_context.h"
#include "cuda_conv.h"
#include "cuda_device.h"
#include "cuda_error.h"
#include "cuda_gemm.h"
#include "cuda_memory.h"
#include "cuda_ops.h"
#include "device_buffer.h"
#include "errors.h"
#include "linear.h"
#include "maxpool2d.h"
#include "model.h"

namespace lab::cuda {

namespace {

using Shape = std::vector<int64_t>;

// Device memory the executor's layers pass along: a layer's output or input gradient, or the
// staged input. Owned by the layer (or the executor) that wrote it; valid until it writes again.
struct DeviceView {
  float* data = nullptr;
  Shape shape;
};

// Product of the dimensions after (N, C): H * W for (N, C, H, W), 1 for (N, C).
int64_t inner_of(const Shape& s) {
  int64_t inner = 1;
  for (size_t i = 2; i < s.size(); ++i) inner *= s[i];
  return inner;
}

// ---- staging and timing ----

// Spans of device work, each a pair of CUDA events recorded on the stream around it.
class DeviceTimer {
 public:
  explicit DeviceTimer(CudaContext& ctx) : m_ctx(ctx) {}
  ~DeviceTimer() {
    for (cudaEvent_t e : m_free) static_cast<void>(cudaEventDestroy(e));
    for (const Span& s : m_spans) {
      static_cast<void>(cudaEventDestroy(s.start));
      if (s.end) static_cast<void>(cudaEventDestroy(s.end));
    }
    if (m_anchor) static_cast<void>(cudaEventDestroy(m_anchor));
  }
  DeviceTimer(const DeviceTimer&) = delete;
  DeviceTimer& operator=(const DeviceTimer&) = delete;

  Phase phase = Phase::None;  // of the spans recorded now (the executor's forward or backward)
  // Off while a CUDA Graph is captured: its work is timed as one span around each replay.
  bool enabled = true;
  static constexpr size_t kNone = ~size_t{0};

  // Returns the span's index for end() (kNone while off); op and what: static strings.
  size_t begin(const char* op, const char* what, int tag, uint64_t bytes = 0) {
    if (!enabled) return kNone;
    Span s{event(), nullptr, phase, op, what, tag, bytes};
    DTLAB_CUDA_CHECK(cudaEventRecord(s.start, m_ctx.stream()));
    m_spans.push_back(s);
    return m_spans.size() - 1;
  }
  void end(size_t i) {
    if (i == kNone) return;
    m_spans[i].end = event();
    DTLAB_CUDA_CHECK(cudaEventRecord(m_spans[i].end, m_ctx.stream()));
  }
  // At the end of a forward or backward: an event after all of its work, waited for, and the
  // host's clock read the moment it is done. Every span is placed by its distance from it.
  void close() {
    if (m_spans.empty()) return;
    if (!m_anchor) DTLAB_CUDA_CHECK(cudaEventCreate(&m_anchor));
    DTLAB_CUDA_CHECK(cudaEventRecord(m_anchor, m_ctx.stream()));
    DTLAB_CUDA_CHECK(cudaEventSynchronize(m_anchor));
    m_anchor_host = now_seconds();
    m_closed = m_spans.size();
  }

  // The spans of the closed passes, on the host's clock (Device events with phase, op, what, tag
  // and bytes set); their events go back to the pool.
  void take(std::vector<Event>& out) {
    for (size_t i = 0; i < m_closed; ++i) {
      const Span& s = m_spans[i];
      float to_anchor_ms = 0, length_ms = 0;
      DTLAB_CUDA_CHECK(cudaEventElapsedTime(&to_anchor_ms, s.end, m_anchor));
      DTLAB_CUDA_CHECK(cudaEventElapsedTime(&length_ms, s.start, s.end));
      Event e;
      e.kind = EventKind::Device;
      e.phase = s.phase;
      e.op = s.op;
      e.what = s.what;
      e.tag = s.tag;
      e.bytes = s.bytes;
      e.t_end = m_anchor_host - static_cast<double>(to_anchor_ms) * 1e-3;
      e.t_start = e.t_end - static_cast<double>(length_ms) * 1e-3;
      out.push_back(e);
    }
    recycle(m_closed);
  }
  size_t pending() const { return m_spans.size(); }
  void drop() { recycle(m_spans.size()); }

 private:
  struct Span {
    cudaEvent_t start, end;
    Phase phase;
    const char* op;
    const char* what;
    int tag;
    uint64_t bytes;
  };
  cudaEvent_t event() {
    if (!m_free.empty()) {
      const cudaEvent_t e = m_free.back();
      m_free.pop_back();
      return e;
    }
    cudaEvent_t e = nullptr;
    DTLAB_CUDA_CHECK(cudaEventCreate(&e));
    return e;
  }
  void recycle(size_t count) {
    for (size_t i = 0; i < count; ++i) {
      m_free.push_back(m_spans[i].start);
      if (m_spans[i].end) m_free.push_back(m_spans[i].end);
    }
    m_spans.erase(m_spans.begin(), m_spans.begin() + static_cast<std::ptrdiff_t>(count));
    m_closed = 0;
  }
  CudaContext& m_ctx;
  std::vector<Span> m_spans;
  std::vector<cudaEvent_t> m_free;
  cudaEvent_t m_anchor = nullptr;
  size_t m_closed = 0;  // m_spans[0, m_closed) ended before the anchor
  double m_anchor_host = 0;
};

// The executor's host <-> device copies on the context's stream, counted (StagingTraffic) and
// timed (DeviceTimer).
class Staging {
 public:
  explicit Staging(CudaContext& ctx) : ctx(ctx), timer(ctx) {}

  // host (count,) -> d, grown to count elements
  template <class T>
  void upload(DeviceBuffer<T>& d, const T* host, size_t count) {
    d.resize(count);
    const size_t span = timer.begin("copy to device", "copy", -1, count * sizeof(T));
    d.upload(host, count, ctx.stream());
    timer.end(span);
    m_traffic.host_to_device_bytes += count * sizeof(T);
  }
  void upload(DeviceBuffer<float>& d, const std::vector<float>& host) { upload(d, host.data(), host.size()); }

  // device (count,) -> host, after the work queued so far; waits until it is there.
  template <class T>
  void download(const T* device, T* host, size_t count) {
    waited_download(count * sizeof(T), [&] {
      DTLAB_CUDA_CHECK(cudaMemcpyAsync(host, device, count * sizeof(T), cudaMemcpyDeviceToHost, ctx.stream()));
    });
  }

  // Every `stride`-th float of device, rows of them starting at the first (a column of a table) ->
  // host (rows,), after the work queued so far; waits until it is there.
  void download_column(const float* device, size_t stride, size_t rows, float* host) {
    waited_download(rows * sizeof(float), [&] {
      DTLAB_CUDA_CHECK(cudaMemcpy2DAsync(host, sizeof(float), device, stride * sizeof(float), sizeof(float), rows,
                                         cudaMemcpyDeviceToHost, ctx.stream()));
    });
  }

  // grads: the gradients of `params` back to back on the device (each Param::grad's size, in
  // order) -> added to the host gradients (+=, as Module::backward accumulates).
  void add_to_host_grads(const DeviceBuffer<float>& grads, const std::vector<Param*>& params) {
    m_host.resize(grads.size());
    download(grads.data(), m_host.data(), grads.size());
    size_t off = 0;
    for (Param* p : params) {
      for (float& g : p->grad.data) g += m_host[off++];
    }
    assert(off == grads.size());
  }

  const StagingTraffic& traffic() const { return m_traffic; }
  // Copies made without upload() and download() (a CUDA Graph's, from and to pinned memory).
  void count_copies(uint64_t up, uint64_t down) {
    m_traffic.host_to_device_bytes += up;
    m_traffic.device_to_host_bytes += down;
  }

 private:
  // A download of `bytes` that copy() queues on the stream: timed as a span, waited for, counted.
  template <class F>
  void waited_download(size_t bytes, F&& copy) {
    if (bytes == 0) return;
    const auto t0 = std::chrono::steady_clock::now();
    const size_t span = timer.begin("copy to host", "copy", -1, bytes);
    copy();
    timer.end(span);
    DTLAB_CUDA_CHECK(cudaStreamSynchronize(ctx.stream()));
    m_traffic.wait_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    m_traffic.device_to_host_bytes += bytes;
  }

 public:

  CudaContext& ctx;
  DeviceTimer timer;
  DeviceMemory* memory = nullptr;  // the collectives' view of this GPU (SyncBN's on device buffers)
  // Residency: the host wrote the parameters since the device last took them up (at first: the
  // device has none); the next forward (or SGD step) uploads them.
  bool params_stale = true;
  // Gradients on the device (executor.h: keep_grads): the layers accumulate their parameters'
  // gradients there; host_grads_stale: the host's Param::grad lags behind (to_host brings it);
  // device_grads_stale: the host wrote them (host_changed), to be taken up before their next use.
  bool keep_grads = false, host_grads_stale = false, device_grads_stale = false;

 private:
  StagingTraffic m_traffic;
  std::vector<float> m_host;  // the last gradient download
};

// ---- layers ----

class DeviceLayer {
 public:
  virtual ~DeviceLayer() = default;
  // x -> y (valid until the next forward); keeps what backward needs.
  virtual DeviceView forward(const DeviceView& x, Mode mode) = 0;
  // dy -> the module's parameter gradients added to the host (+=); dx when want_dx, else an empty
  // view. Follows the forward whose output dy is the gradient of.
  virtual DeviceView backward(const DeviceView& dy, bool want_dx) = 0;
  // Residency (executor.h): the device's copy of the module's p-th parameter, where the device keeps
  // and steps it (Linear, Conv2d, an affine BatchNorm); nullptr where the module has none.
  virtual DeviceBuffer<float>* device_param(int p) {
    (void)p;
    return nullptr;
  }
  // The host's values of those parameters taken up (after the host wrote them).
  virtual void upload_params() {}
  // Their gradients on the device (keep_grads): the buffer of the p-th, the host's taken up, the
  // device's brought down into the host's Param::grad, and zeroed.
  virtual DeviceBuffer<float>* device_grad(int p) {
    (void)p;
    return nullptr;
  }
  virtual void upload_grads() {}
  virtual void download_grads() {}
  virtual void zero_grads() {}
  // BatchNorm's buffers (kStateBuffers): the host's running statistics taken up; the device's
  // brought down into the host's (buffers) and its last training forward's statistics into the
  // host layer's last_stats() (stats).
  virtual void upload_buffers() {}
  virtual void download_buffers(bool buffers, bool stats) { (void)buffers, (void)stats; }
  // --cuda-graphs: why this layer's training forward cannot be captured (nullptr: it can), and
  // the host's side of a replayed one (BatchNorm::begin_forward: num_batches_tracked, the checks).
  virtual const char* graph_obstacle() const { return nullptr; }
  virtual void replay_host() {}
};

// x: (N, d1, d2, ...) -> y: (N, d1*d2*...), the same memory
class FlattenLayer : public DeviceLayer {
 public:
  DeviceView forward(const DeviceView& x, Mode) override {
    m_in_shape = x.shape;
    int64_t features = 1;
    for (size_t i = 1; i < x.shape.size(); ++i) features *= x.shape[i];
    return {x.data, {x.shape.at(0), features}};
  }
  // dy: (N, d1*d2*...) -> dx: (N, d1, d2, ...), the same memory
  DeviceView backward(const DeviceView& dy, bool want_dx) override {
    return want_dx ? DeviceView{dy.data, m_in_shape} : DeviceView{};
  }

 private:
  Shape m_in_shape;
};

// A layer whose weight and optional bias the device keeps and steps (Linear, Conv2d, an affine
// BatchNorm: residency, executor.h): their device copies, and the upload of the host's values after
// the host wrote them. A BatchNorm without affine has neither (weight null).
class WeightBiasLayer : public DeviceLayer {
 public:
  DeviceBuffer<float>* device_param(int p) override {
    return p == 0 && m_weight ? &m_w : p == 1 && m_bias ? &m_b : nullptr;
  }
  void upload_params() override {
    if (m_weight) m_st.upload(m_w, m_weight->value.data);
    if (m_bias) m_st.upload(m_b, m_bias->value.data);
  }
  DeviceBuffer<float>* device_grad(int p) override {
    return p == 0 && m_weight ? &m_gw : p == 1 && m_bias ? &m_gb : nullptr;
  }
  void upload_grads() override {
    if (m_weight) m_st.upload(m_gw, m_weight->grad.data);
    if (m_bias) m_st.upload(m_gb, m_bias->grad.data);
  }
  void download_grads() override {
    if (m_weight) m_st.download(m_gw.data(), m_weight->grad.ptr(), m_gw.size());
    if (m_bias) m_st.download(m_gb.data(), m_bias->grad.ptr(), m_gb.size());
  }
  void zero_grads() override {
    if (m_weight) m_gw.fill_bytes(0, m_st.ctx.stream());
    if (m_bias) m_gb.fill_bytes(0, m_st.ctx.stream());
  }

 protected:
  WeightBiasLayer(Staging& st, Param* weight, Param* bias) : m_st(st), m_weight(weight), m_bias(bias) {}
  // This backward's gradients, [dW | db] back to back from zero, accumulated (+=) where the
  // gradients live: the device's (keep_grads) or the host's.
  void accumulate_grads(const DeviceBuffer<float>& grads, const std::vector<Param*>& params) {
    if (!m_weight) return;
    if (!m_st.keep_grads) return m_st.add_to_host_grads(grads, params);
    const size_t wsize = m_weight->value.data.size();
    add_into(m_st.ctx, m_gw.data(), grads.data(), static_cast<int64_t>(wsize));
    if (m_bias) add_into(m_st.ctx, m_gb.data(), grads.data() + wsize, static_cast<int64_t>(m_gb.size()));
  }
  const float* weight_data() const { return m_weight ? m_w.data() : nullptr; }
  const float* bias_data() const { return m_bias ? m_b.data() : nullptr; }
  Staging& m_st;
  Param* m_weight;                 // nullptr: the module has none (a BatchNorm without affine)
  Param* m_bias;                   // nullptr: the module has none
  DeviceBuffer<float> m_w, m_b;    // the weight and the bias on the device
  DeviceBuffer<float> m_gw, m_gb;  // their gradients, where kept on the device (keep_grads)
};

// y (N, out) = x (N, in) W^T + b; W: (out, in), b: (out,)
class LinearLayer : public WeightBiasLayer {
 public:
  LinearLayer(Staging& st, Linear& m, std::string name)
      : WeightBiasLayer(st, &m.weight(), m.has_bias() ? &m.bias() : nullptr), m_m(m), m_name(std::move(name)) {}

  DeviceView forward(const DeviceView& x, Mode) override {
    const int in = m_m.in_features(), out = m_m.out_features();
    if (x.shape.size() != 2 || x.shape[1] != in)
      throw ConfigError(m_name + " got an input of size " + shape_str(x.shape) + ": expected (N, " +
                        std::to_string(in) + ")");
    const int n = static_cast<int>(x.shape[0]);
    if (m_st.params_stale) upload_params();
    m_y.resize(static_cast<size_t>(n) * out);
    if (n > 0) {
      sgemm(m_st.ctx, false, true, n, out, in, 1.0f, x.data, in, m_w.data(), in, 0.0f, m_y.data(), out);
      if (m_m.has_bias()) bias_add(m_st.ctx, m_y.data(), m_b.data(), n, out, 1);
    }
    m_x = x;
    return {m_y.data(), {n, out}};
  }

  // dy: (N, out) -> dx: (N, in) = dy W
  DeviceView backward(const DeviceView& dy, bool want_dx) override {
    const int in = m_m.in_features(), out = m_m.out_features();
    const int n = static_cast<int>(m_x.shape[0]);
    // [dW (out, in) | db (out,)] from zero, then downloaded in one copy
    const size_t wsize = static_cast<size_t>(out) * in;
    m_grads.resize(wsize + (m_m.has_bias() ? out : 0));
    m_grads.fill_bytes(0, m_st.ctx.stream());
    DeviceView dx;
    if (n > 0) {
      sgemm(m_st.ctx, true, false, out, in, n, 1.0f, dy.data, out, m_x.data, in, 0.0f, m_grads.data(), in);
      if (m_m.has_bias()) bias_grad(m_st.ctx, dy.data, m_grads.data() + wsize, n, out, 1);
    }
    if (want_dx) {
      m_dx.resize(static_cast<size_t>(n) * in);
      if (n > 0) sgemm(m_st.ctx, false, false, n, in, out, 1.0f, dy.data, out, m_w.data(), in, 0.0f, m_dx.data(), in);
      dx = {m_dx.data(), m_x.shape};
    }
    accumulate_grads(m_grads, m_m.params());
    return dx;
  }

 private:
  Linear& m_m;
  std::string m_name;
  DeviceBuffer<float> m_y;       // (N, out)
  DeviceBuffer<float> m_grads;   // (out * in + out,)
  DeviceBuffer<float> m_dx;      // (N, in)
  DeviceView m_x;                // (N, in): the last forward's input
};

// y (N, Cout, Ho, Wo) = conv(x (N, Cin, H, W), W (Cout, Cin, k, k)) + b (Cout,)
class ConvLayer : public WeightBiasLayer {
 public:
  ConvLayer(Staging& st, Conv2d& m, std::string name)
      : WeightBiasLayer(st, &m.weight(), m.has_bias() ? &m.bias() : nullptr), m_m(m), m_name(std::move(name)) {}

  DeviceView forward(const DeviceView& x, Mode) override {
    if (x.shape.size() != 4 || x.shape[1] != m_m.in_channels())
      throw ConfigError(m_name + " got an input of size " + shape_str(x.shape) + ": expected (N, " +
                        std::to_string(m_m.in_channels()) + ", H, W)");
    Conv2dShape s;
    s.n = static_cast<int>(x.shape[0]);
    s.cin = m_m.in_channels();
    s.h = static_cast<int>(x.shape[2]);
    s.w = static_cast<int>(x.shape[3]);
    s.cout = m_m.out_channels();
    s.k = m_m.kernel_size();
    s.pad = m_m.padding();
    if (m_st.params_stale) upload_params();
    const int64_t plane = int64_t{s.ho()} * s.wo();
    m_y.resize(static_cast<size_t>(s.n * s.cout * plane));
    // cuDNN refuses an empty batch: it has no output to compute
    m_conv = s.n > 0 ? &conv_for(s) : nullptr;
    if (m_conv) {
      m_conv->forward(x.data, m_w.data(), m_y.data());
      if (m_m.has_bias()) bias_add(m_st.ctx, m_y.data(), m_b.data(), s.n, s.cout, plane);
    }
    m_x = x;
    return {m_y.data(), {s.n, s.cout, s.ho(), s.wo()}};
  }

  // dy: (N, Cout, Ho, Wo) -> dx: (N, Cin, H, W)
  DeviceView backward(const DeviceView& dy, bool want_dx) override {
    // [dW (Cout, Cin, k, k) | db (Cout,)] from zero, then downloaded in one copy
    const size_t wsize = m_m.weight().value.data.size();
    const int cout = m_m.out_channels();
    m_grads.resize(wsize + (m_m.has_bias() ? cout : 0));
    m_grads.fill_bytes(0, m_st.ctx.stream());
    DeviceView dx;
    if (m_conv) {
      const Conv2dShape& s = m_conv->shape();
      m_conv->backward_filter(m_x.data, dy.data, m_grads.data(), 0.0f);
      if (m_m.has_bias()) bias_grad(m_st.ctx, dy.data, m_grads.data() + wsize, s.n, cout, int64_t{s.ho()} * s.wo());
    }
    if (want_dx) {
      m_dx.resize(static_cast<size_t>(Tensor::numel_of(m_x.shape)));
      if (m_conv) m_conv->backward_data(m_w.data(), dy.data, m_dx.data());
      dx = {m_dx.data(), m_x.shape};
    }
    accumulate_grads(m_grads, m_m.params());
    return dx;
  }

 private:
  CudnnConv2d& conv_for(const Conv2dShape& s) {
    std::unique_ptr<CudnnConv2d>& conv = m_convs[{s.n, s.h, s.w}];
    if (!conv) conv = std::make_unique<CudnnConv2d>(m_st.ctx, s);
    return *conv;
  }

  Conv2d& m_m;
  std::string m_name;
  std::map<std::array<int, 3>, std::unique_ptr<CudnnConv2d>> m_convs;  // per input (N, H, W)
  CudnnConv2d* m_conv = nullptr;  // the last forward's (null: an empty batch)
  DeviceBuffer<float> m_y;        // (N, Cout, Ho, Wo)
  DeviceBuffer<float> m_grads;    // (Cout * Cin * k * k + Cout,)
  DeviceBuffer<float> m_dx;       // (N, Cin, H, W)
  DeviceView m_x;                 // (N, Cin, H, W): the last forward's input
};

// x: (N, C) or (N, C, H, W) -> y = x * alpha + beta per channel, whole on the device (residency,
// executor.h): the host's layer says only what the host decides (BatchNorm::begin_forward: the
// shape checks, num_batches_tracked, the batch-of-one error); the statistics, SyncBN's combination
// of every rank's, the running statistics, the coefficients and the weight and bias gradients are
// kernels on device buffers. SyncBN gathers the rows [mean | var | count] and allreduces the
// gradient sums on this GPU's memory (BnSync::allgather_on, allreduce_sum_on); every rank's count
// comes to the host for the batch-of-one check, the one synchronization PyTorch's SyncBatchNorm
// makes too (it drops the empty ranks' rows).
class BatchNormLayer : public WeightBiasLayer {
 public:
  BatchNormLayer(Staging& st, BatchNorm& bn)
      : WeightBiasLayer(st, bn.options().affine ? &bn.weight() : nullptr, bn.options().affine ? &bn.bias() : nullptr),
        m_bn(bn),
        m_c(bn.options().num_features) {}

  DeviceView forward(const DeviceView& x, Mode mode) override {
    const BatchNorm::ForwardPlan plan = m_bn.begin_forward(x.shape, mode);  // checks before any kernel reads x
    if (m_st.params_stale) upload_params();
    const int64_t n = x.shape[0], c = m_c, inner = inner_of(x.shape);
    const bool train = mode == Mode::Train;
    Stats& s = train ? m_train : m_eval;  // an evaluation between steps keeps the training forward's
    s.size(c);
    m_invstd.resize(static_cast<size_t>(c));
    m_affine.resize(static_cast<size_t>(2 * c));
    int64_t count = plan.n;
    if (plan.batch_stats) {
      bn_batch_stats(m_st.ctx, x.data, n, c, inner, s.local_mean(), s.local_var_sum(), s.local_var());
      if (!plan.sync) {
        s.norm_mean = s.local_mean();
        s.norm_var = s.local_var();
        if (plan.update && plan.n > 0)
          bn_running_update(m_st.ctx, s.local_mean(), s.local_var_sum(), plan.n, static_cast<float>(plan.factor),
                            m_rm.data(), m_rv.data(), c);
      } else {
        BnSync& sync = *m_bn.sync();
        const int world = sync.world_size();
        const int64_t row = 2 * c + 1;
        m_row.resize(static_cast<size_t>(row));
        m_all.resize(static_cast<size_t>(world * row));
        bn_pack_row(m_st.ctx, s.local_mean(), s.local_var(), plan.n, c, m_row.data());
        sync.allgather_on(*m_st.memory, m_row.data(), static_cast<int>(row), m_all.data());
        m_counts.resize(static_cast<size_t>(world));
        m_st.download_column(m_all.data() + 2 * c, static_cast<size_t>(row), static_cast<size_t>(world),
                             m_counts.data());
        double total = 0.0;
        for (const float k : m_counts) total += k;
        count = static_cast<int64_t>(total);
        m_bn.check_global_count(x.shape, count);
        bn_combine_stats(m_st.ctx, m_all.data(), world, c, plan.update, plan.factor, m_rm.data(), m_rv.data(),
                         s.global_mean(), s.global_var());
        s.norm_mean = s.global_mean();
        s.norm_var = s.global_var();
      }
      bn_forward_coefficients(m_st.ctx, s.norm_mean, s.norm_var, weight_data(), bias_data(), m_bn.options().eps, c,
                              m_invstd.data(), m_affine.data(), m_affine.data() + c);
      s.valid = true;
    } else {  // eval with the running statistics
      bn_eval_coefficients(m_st.ctx, m_rm.data(), m_rv.data(), weight_data(), bias_data(),
                           static_cast<float>(m_bn.options().eps), c, s.global_mean(), m_invstd.data(), m_affine.data(),
                           m_affine.data() + c);
      s.norm_mean = s.global_mean();
    }
    m_y.resize(static_cast<size_t>(Tensor::numel_of(x.shape)));
    bn_apply(m_st.ctx, x.data, m_affine.data(), m_affine.data() + c, m_y.data(), n, c, inner);
    if (train) {
      m_x = x;
      m_count = count;
      m_local_count = plan.n;
      m_synced = plan.sync;
    }
    return {m_y.data(), x.shape};
  }

  // dy: like x -> dx: like x
  DeviceView backward(const DeviceView& dy, bool want_dx) override {
    const int64_t n = m_x.shape[0], c = m_c, inner = inner_of(m_x.shape);
    // [sum_dy | sum_dy_xmu] in double, this rank's
    m_sums.resize(static_cast<size_t>(2 * c));
    bn_grad_sums(m_st.ctx, dy.data, m_x.data, m_train.norm_mean, n, c, inner, m_sums.data(), m_sums.data() + c);
    const float* global = nullptr;
    if (m_synced) {  // one allreduce of the float sums, even where this rank needs no dx (every rank calls it)
      m_global.resize(static_cast<size_t>(2 * c));
      bn_sums_to_float(m_st.ctx, m_sums.data(), m_sums.data() + c, c, m_global.data());
      m_bn.sync()->allreduce_sum_on(*m_st.memory, m_global.data(), static_cast<int>(2 * c));
      global = m_global.data();
    }
    // [dweight | dbias] from zero, then added where the gradients live; [grad_mean | k | scale]
    m_grads.resize(static_cast<size_t>(2 * c));
    m_grads.fill_bytes(0, m_st.ctx.stream());
    m_coef.resize(static_cast<size_t>(3 * c));
    bn_backward_coefficients(m_st.ctx, m_sums.data(), m_sums.data() + c, global, m_invstd.data(), weight_data(), m_count,
                             c, m_weight ? m_grads.data() : nullptr, m_bias ? m_grads.data() + c : nullptr,
                             m_coef.data(), m_coef.data() + c, m_coef.data() + 2 * c);
    accumulate_grads(m_grads, m_bn.params());
    if (!want_dx) return {};
    m_dx.resize(static_cast<size_t>(Tensor::numel_of(m_x.shape)));
    bn_input_grad(m_st.ctx, dy.data, m_x.data, m_train.norm_mean, m_coef.data(), m_coef.data() + c,
                  m_coef.data() + 2 * c, m_dx.data(), n, c, inner);
    return {m_dx.data(), m_x.shape};
  }

  const char* graph_obstacle() const override {
    if (m_bn.sync() && m_bn.sync()->world_size() > 1)
      return "SyncBatchNorm brings every rank's count to the host in the middle of the forward";
    if (m_bn.options().track_running_stats && !m_bn.options().momentum)
      return "BatchNorm's cumulative average (momentum=None) weighs each step by 1 / num_batches_tracked";
    return nullptr;
  }
  void replay_host() override { m_bn.begin_forward(m_x.shape, Mode::Train); }

  void upload_buffers() override {
    if (!m_bn.options().track_running_stats) return;
    m_st.upload(m_rm, m_bn.running_mean().value.data);
    m_st.upload(m_rv, m_bn.running_var().value.data);
  }

  void download_buffers(bool buffers, bool stats) override {
    if (buffers && m_bn.options().track_running_stats) {
      m_st.download(m_rm.data(), m_bn.running_mean().value.ptr(), m_rm.size());
      m_st.download(m_rv.data(), m_bn.running_var().value.ptr(), m_rv.size());
    }
    if (!stats || !m_train.valid) return;
    // [mean | var] the normalization's (global with SyncBN) and [local mean | local var], in one copy each
    const size_t cs = static_cast<size_t>(m_c);
    BnBatchStats st;
    st.mean.resize(cs), st.var.resize(cs), st.local_mean.resize(cs), st.local_var.resize(cs);
    m_st.download(m_train.norm_mean, st.mean.data(), cs);
    m_st.download(m_train.norm_var, st.var.data(), cs);
    m_st.download(m_train.local_mean(), st.local_mean.data(), cs);
    m_st.download(m_train.local_var(), st.local_var.data(), cs);
    st.count = m_count;
    st.local_count = m_local_count;
    m_bn.set_last_stats(std::move(st));
  }

 private:
  // A forward's statistics on the device: [local mean | local var_sum | local var | global mean |
  // global var] (5C,), and which of them the forward normalized with.
  struct Stats {
    DeviceBuffer<float> buf;
    const float* norm_mean = nullptr;
    const float* norm_var = nullptr;
    int64_t c = 0;
    bool valid = false;  // a forward with batch statistics wrote them
    void size(int64_t channels) {
      c = channels;
      buf.resize(static_cast<size_t>(5 * c));
    }
    float* local_mean() { return buf.data(); }
    float* local_var_sum() { return buf.data() + c; }
    float* local_var() { return buf.data() + 2 * c; }
    float* global_mean() { return buf.data() + 3 * c; }
    float* global_var() { return buf.data() + 4 * c; }
  };
  BatchNorm& m_bn;
  const int64_t m_c;
  Stats m_train, m_eval;           // the last training forward's (backward, last_stats) and evaluation's
  DeviceBuffer<float> m_rm, m_rv;  // (C,) running mean and variance (track_running_stats)
  DeviceBuffer<float> m_invstd;    // (C,) the last forward's
  DeviceBuffer<float> m_affine;    // (2C,) [alpha | beta]
  DeviceBuffer<float> m_row, m_all;  // SyncBN: this rank's row (2C + 1,), every rank's (world, 2C + 1)
  std::vector<float> m_counts;     // SyncBN: every rank's count, on the host
  DeviceBuffer<double> m_sums;     // (2C,) [sum_dy | sum_dy_xmu]
  DeviceBuffer<float> m_global;    // (2C,) SyncBN: the sums in float, allreduced
  DeviceBuffer<float> m_grads;     // (2C,) [dweight | dbias] of this backward
  DeviceBuffer<float> m_coef;      // (3C,) [grad_mean | k | scale]
  DeviceBuffer<float> m_y, m_dx;   // like x
  DeviceView m_x;                  // the last training forward's input
  int64_t m_count = 0, m_local_count = 0;  // values per channel behind its statistics (global with SyncBN)
  bool m_synced = false;           // it communicated, so backward does too
};

// y = max(x, 0), elementwise on any shape
class ReluLayer : public DeviceLayer {
 public:
  explicit ReluLayer(Staging& st) : m_st(st) {}

  DeviceView forward(const DeviceView& x, Mode) override {
    const int64_t count = Tensor::numel_of(x.shape);
    m_y.resize(static_cast<size_t>(count));
    m_mask.resize(static_cast<size_t>(count));
    relu_forward(m_st.ctx, x.data, m_y.data(), m_mask.data(), count);
    m_shape = x.shape;
    return {m_y.data(), x.shape};
  }

  DeviceView backward(const DeviceView& dy, bool want_dx) override {
    if (!want_dx) return {};
    const int64_t count = Tensor::numel_of(m_shape);
    m_dx.resize(static_cast<size_t>(count));
    relu_backward(m_st.ctx, dy.data, m_mask.data(), m_dx.data(), count);
    return {m_dx.data(), m_shape};
  }

 private:
  Staging& m_st;
  DeviceBuffer<float> m_y, m_dx;  // like x
  DeviceBuffer<uint8_t> m_mask;   // like x: 1 where x passed
  Shape m_shape;                  // x's
};

// x: (N, C, H, W) -> y: (N, C, H/2, W/2), MaxPool2d(2)
class MaxPoolLayer : public DeviceLayer {
 public:
  MaxPoolLayer(Staging& st, std::string name) : m_st(st), m_name(std::move(name)) {}

  DeviceView forward(const DeviceView& x, Mode) override {
    if (x.shape.size() != 4)
      throw ConfigError(m_name + " got an input of size " + shape_str(x.shape) + ": expected (N, C, H, W)");
    const Shape y_shape{x.shape[0], x.shape[1], x.shape[2] / 2, x.shape[3] / 2};
    const size_t count = static_cast<size_t>(Tensor::numel_of(y_shape));
    m_y.resize(count);
    m_argmax.resize(count);
    maxpool2x2_forward(m_st.ctx, x.data, m_y.data(), m_argmax.data(), x.shape[0] * x.shape[1],
                       static_cast<int>(x.shape[2]), static_cast<int>(x.shape[3]));
    m_in_shape = x.shape;
    return {m_y.data(), y_shape};
  }

  // dy: (N, C, H/2, W/2) -> dx: (N, C, H, W), zero except at each window's winner
  DeviceView backward(const DeviceView& dy, bool want_dx) override {
    if (!want_dx) return {};
    m_dx.resize(static_cast<size_t>(Tensor::numel_of(m_in_shape)));
    maxpool2x2_backward(m_st.ctx, dy.data, m_argmax.data(), m_dx.data(), m_in_shape[0] * m_in_shape[1],
                        static_cast<int>(m_in_shape[2]), static_cast<int>(m_in_shape[3]));
    return {m_dx.data(), m_in_shape};
  }

 private:
  Staging& m_st;
  std::string m_name;
  DeviceBuffer<float> m_y;         // (N, C, H/2, W/2)
  DeviceBuffer<int32_t> m_argmax;  // (N, C, H/2, W/2): the winner's index within its input plane
  DeviceBuffer<float> m_dx;        // (N, C, H, W)
  Shape m_in_shape;
};

const char* const kSupported = "the GPU runs Flatten, Linear, Conv2d, BatchNorm1d, BatchNorm2d, ReLU and MaxPool2d(2)";

std::unique_ptr<DeviceLayer> make_layer(Staging& st, Module& m, size_t index) {
  const std::string kind = m.kind();
  const std::string name = "module " + std::to_string(index) + " (" + m.describe() + ")";
  if (kind == "Flatten") return std::make_unique<FlattenLayer>();
  if (kind == "Linear") return std::make_unique<LinearLayer>(st, dynamic_cast<Linear&>(m), name);
  if (kind == "Conv2d") return std::make_unique<ConvLayer>(st, dynamic_cast<Conv2d&>(m), name);
  if (kind == "BatchNorm1d" || kind == "BatchNorm2d")
    return std::make_unique<BatchNormLayer>(st, dynamic_cast<BatchNorm&>(m));
  if (kind == "ReLU") return std::make_unique<ReluLayer>(st);
  if (kind == "MaxPool2d") {
    if (dynamic_cast<MaxPool2d&>(m).kernel_size() != 2)
      throw ConfigError("--device cuda cannot run " + name + ": the GPU's max-pool has a 2x2 window only",
                        std::string(kSupported) + "; run this model with --device cpu");
    return std::make_unique<MaxPoolLayer>(st, name);
  }
  throw ConfigError("--device cuda cannot run " + name + ": the GPU executor has no " + kind + " layer",
                    std::string(kSupported) + "; run this model with --device cpu");
}

// ---- executor ----

class CudaExecutor final : public ModelExecutor {
 public:
  CudaExecutor(Model& model, const CudaContextOptions& options, DeviceSpec spec, std::string gpu_name)
      : m_ctx(options), m_st(m_ctx), m_spec(std::move(spec)), m_gpu_name(std::move(gpu_name)) {
    m_st.memory = &m_memory;
    for (size_t i = 0; i < model.size(); ++i) {
      m_layers.push_back(make_layer(m_st, model.module(i), i));
      m_ops.push_back(device_timeline_op(model.module(i).kind()));
    }
    m_layout = model.param_layout();  // Model::backward's walk
    m_params = model.params();
    for (size_t i = 0; i < model.size(); ++i)
      for (int p = 0; p < m_layout.count[i]; ++p) m_owner.push_back({i, p});
    m_state.resize(m_params.size());
    m_mirror.resize(m_params.size());
    m_state_stale.assign(m_params.size(), 0);
    for (size_t i = 0; i < m_params.size(); ++i)
      if (device_param(i)) m_last_device_param = i;
  }

  ~CudaExecutor() override {
    // The buffers and cuDNN descriptors are freed on this thread: make their device current
    // (errors ignored: a destructor does not throw; the context's destructor runs last).
    static_cast<void>(cudaSetDevice(m_ctx.device()));
  }

  std::string describe() const override { return m_spec.str() + " (" + m_gpu_name + ")"; }

  // x: (N, ...) host -> logits host (N, 10)
  const Tensor& forward(const Tensor& x, Mode mode) override {
    const DeviceView h = run_forward(x, mode);
    m_logits.resize(h.shape);
    m_st.download(h.data, m_logits.ptr(), m_logits.data.size());
    m_st.timer.close();
    m_trained = mode == Mode::Train;
    m_dlogits_view = {};
    return m_logits;
  }

  // The loss on the device (executor.h): the labels up, cross_entropy's kernel, the loss and the
  // hits down in one copy; the logits' gradient stays for backward_loss.
  bool forward_loss(const Tensor& x, const std::vector<int>& labels, float& loss, int& correct) override {
    if (x.ndim() == 0 || x.dim(0) == 0) return false;  // (an empty batch has no mean loss: the host's forward)
    const DeviceView h = run_forward(x, Mode::Train);
    const int64_t n = h.shape.at(0), c = h.shape.at(1);
    m_labels_host.assign(labels.begin(), labels.end());
    m_st.upload(m_labels, m_labels_host.data(), m_labels_host.size());
    m_dlogits.resize(static_cast<size_t>(n * c));
    m_loss.resize(2);  // [loss (float bits) | hits]
    const size_t span = m_st.timer.begin("cross-entropy", "kernels", -1);
    cross_entropy(m_ctx, h.data, m_labels.data(), n, c, reinterpret_cast<float*>(m_loss.data()), m_loss.data() + 1,
                  m_dlogits.data());
    m_st.timer.end(span);
    int32_t out[2];
    m_st.download(m_loss.data(), out, 2);
    m_st.timer.close();
    std::memcpy(&loss, &out[0], sizeof(float));
    correct = out[1];
    m_trained = true;
    m_dlogits_view = {m_dlogits.data(), h.shape};
    return true;
  }

  void backward_loss(const std::function<void(int)>& on_param_ready) override {
    assert(m_trained && m_dlogits_view.data);
    m_ctx.make_current();
    m_st.timer.phase = Phase::Backward;
    run_backward(m_dlogits_view, on_param_ready);
  }

  void poison_loss_grad() override {
    if (!m_dlogits_view.data) return;
    m_ctx.make_current();
    const float nan = std::numeric_limits<float>::quiet_NaN();
    DTLAB_CUDA_CHECK(cudaMemcpyAsync(m_dlogits_view.data, &nan, sizeof(float), cudaMemcpyHostToDevice, m_ctx.stream()));
    DTLAB_CUDA_CHECK(cudaStreamSynchronize(m_ctx.stream()));  // (nan is on this stack)
  }

 private:
  // The layers on x (taken up); the device's logits.
  DeviceView run_forward(const Tensor& x, Mode mode) {
    m_ctx.make_current();
    m_trained = false;
    // Spans wait to be taken after the run's compute phase; an executor whose run never asks (the
    // evaluation copy's) drops them before they pile up.
    if (m_st.timer.pending() > 4096) m_st.timer.drop();
    // Until its optimizer steps here (step_param), the host's parameters are the state: take them
    // up every time, as the host-staged protocol does.
    if (!m_stepping) m_st.params_stale = true;
    m_st.timer.phase = mode == Mode::Train ? Phase::Forward : Phase::Eval;
    if (m_device_buffers_stale) {  // BatchNorm's running statistics: the host's, first or after it wrote them
      for (auto& layer : m_layers) layer->upload_buffers();
      m_device_buffers_stale = false;
    }
    if (mode == Mode::Train) m_host_buffers_stale = m_host_stats_stale = true;  // they move on the device
    m_st.upload(m_x, x.ptr(), x.data.size());
    DeviceView h{m_x.data(), x.shape};
    for (size_t i = 0; i < m_layers.size(); ++i) {
      const size_t span = m_ops[i] ? m_st.timer.begin(m_ops[i], "kernels", static_cast<int>(i)) : 0;
      h = m_layers[i]->forward(h, mode);
      if (m_ops[i]) m_st.timer.end(span);
    }
    m_st.params_stale = false;  // every layer with parameters took them up
    return h;
  }

  // From dy (the logits' gradient on the device) through the layers in reverse.
  void run_backward(DeviceView dy, const std::function<void(int)>& on_param_ready) {
    take_up_grads();
    for (size_t i = m_layers.size(); i-- > m_layout.first_with_params;) {
      const size_t span = m_ops[i] ? m_st.timer.begin(m_ops[i], "kernels", static_cast<int>(i)) : 0;
      dy = m_layers[i]->backward(dy, i > m_layout.first_with_params);
      if (m_ops[i]) m_st.timer.end(span);
      if (on_param_ready)
        for (int p = m_layout.count[i] - 1; p >= 0; --p) on_param_ready(m_layout.first[i] + p);
    }
    if (m_st.keep_grads) m_st.host_grads_stale = true;
    m_st.timer.close();
  }

 public:
  // dlogits: host (N, 10), the gradient of the last Train forward's logits
  void backward(const Tensor& dlogits, const std::function<void(int)>& on_param_ready) override {
    assert(m_trained && dlogits.shape == m_logits.shape);
    m_ctx.make_current();
    m_st.timer.phase = Phase::Backward;
    m_st.upload(m_dlogits, dlogits.ptr(), dlogits.data.size());
    run_backward({m_dlogits.data(), dlogits.shape}, on_param_ready);
  }

  void take_device_events(std::vector<Event>& out) override { m_st.timer.take(out); }

  // ---- residency (executor.h): the Linear, Conv2d and BatchNorm parameters and their momentum
  // buffers, BatchNorm's running statistics and batch statistics ----
  unsigned resident() const override {
    return kStateParams | kStateMomentum | kStateBuffers | (m_st.keep_grads ? kStateGrads : 0u);
  }

  void to_host(unsigned sets) override {
    if ((sets & kStateBuffers) && (m_host_buffers_stale || m_host_stats_stale)) {
      m_ctx.make_current();
      for (auto& layer : m_layers) layer->download_buffers(m_host_buffers_stale, m_host_stats_stale);
      m_host_buffers_stale = m_host_stats_stale = false;
    }
    if ((sets & kStateGrads) && m_st.host_grads_stale) {
      m_ctx.make_current();
      for (auto& layer : m_layers) layer->download_grads();
      m_st.host_grads_stale = false;
    }
    if (!(sets & kStateParams && m_host_params_stale) && !(sets & kStateMomentum && m_host_momentum_stale)) return;
    m_ctx.make_current();
    for (size_t i = 0; i < m_params.size(); ++i) {
      DeviceBuffer<float>* d = device_param(i);
      if (!d) continue;
      if (sets & kStateParams && m_host_params_stale) m_st.download(d->data(), m_params[i]->value.ptr(), d->size());
      if (sets & kStateMomentum && m_host_momentum_stale)
        for (size_t s = 0; s < m_mirror[i].size(); ++s)
          m_st.download(m_state[i][s].data(), m_mirror[i][s]->ptr(), m_state[i][s].size());
    }
    if (sets & kStateParams) m_host_params_stale = false;
    if (sets & kStateMomentum) m_host_momentum_stale = false;
  }

  void host_changed(unsigned sets) override {
    if (sets & kStateBuffers) {  // the buffers; the batch statistics, which the host never writes, stay the device's
      m_device_buffers_stale = true;
      m_host_buffers_stale = false;
    }
    if ((sets & kStateGrads) && m_st.keep_grads) {
      m_st.device_grads_stale = true;
      m_st.host_grads_stale = false;
    }
    if (sets & kStateParams) {
      m_st.params_stale = true;
      m_host_params_stale = false;
    }
    if (sets & kStateMomentum) {
      std::fill(m_state_stale.begin(), m_state_stale.end(), 1);
      m_host_momentum_stale = false;
    }
  }

  bool step_param(size_t index, const OptimizerOptions& opt, int64_t step,
                  const std::vector<Tensor*>& host_state) override {
    if (!device_param(index)) return false;
    m_ctx.make_current();
    m_st.timer.phase = Phase::OptimizerStep;
    const ParamStep ps = prepare_step(index, step, host_state, false);
    launch_step(ps, opt, step);
    if (index == m_last_device_param) m_st.timer.close();  // the step's spans, for the optimizer phase
    return true;
  }

  // ---- a whole training step (--cuda-graphs; executor.h: graph_step) ----
  bool can_graph_step(std::string* why) override {
    const char* obstacle = nullptr;
    for (size_t i = 0; i < m_params.size() && !obstacle; ++i)
      if (!device_param(i)) obstacle = "a parameter the GPU does not step";
    for (const auto& layer : m_layers)
      if (!obstacle) obstacle = layer->graph_obstacle();
    if (obstacle && why) *why = obstacle;
    return !obstacle;
  }

  // The step's work queued in one order, the same whether it runs at once (the first two times a
  // step of this shape and these arguments comes), is captured (the second) or replayed (from the
  // third): the input and the labels up from pinned memory, the layers, the loss, the gradients
  // zeroed, the layers' backward, a flag per gradient (NaN or infinite) and one for any, SGD of
  // every parameter unless that one is set, and [loss | hits | flags] down into pinned memory.
  // Nothing in it waits for the device or allocates: every buffer has its size from the first.
  bool graph_step(const Tensor& x, const std::vector<int>& labels, const DeviceStepPlan& plan,
                  GraphStepOutcome& out) override {
    if (!plan.opt || !plan.opt->is_sgd() || x.ndim() == 0 || x.dim(0) == 0 || !can_graph_step(nullptr)) return false;
    m_ctx.make_current();
    if (m_st.timer.pending() > 4096) m_st.timer.drop();
    keep_grads(true);
    take_up_grads();
    m_st.timer.phase = Phase::OptimizerStep;
    std::vector<ParamStep> steps(m_params.size());
    for (size_t i = 0; i < m_params.size(); ++i) steps[i] = prepare_step(i, plan.step, plan.state[i], true);
    if (m_device_buffers_stale) {  // BatchNorm's running statistics, after the host wrote them
      for (auto& layer : m_layers) layer->upload_buffers();
      m_device_buffers_stale = false;
    }
    const SgdOptions& so = plan.opt->sgd;
    const GraphKey key{x.shape, so.lr, so.momentum, so.dampening, so.weight_decay, so.nesterov, plan.step == 1};
    StepGraph& g = m_graphs[key];
    const size_t nparams = m_params.size();
    if (g.x.empty()) {  // this shape's pinned staging, which its graph reads and writes
      g.x.resize(x.data.size());
      g.labels.resize(labels.size());
      g.out.resize(2 + nparams);
    }
    std::memcpy(g.x.data(), x.ptr(), x.data.size() * sizeof(float));
    for (size_t i = 0; i < labels.size(); ++i) g.labels.data()[i] = labels[i];
    if (g.exec && g.allocations != device_buffer_allocations().load()) g.drop();  // a buffer it uses may have moved
    m_st.timer.phase = Phase::Forward;
    if (g.exec) {
      for (auto& layer : m_layers) layer->replay_host();
      launch(g);
      ++m_graph_replays;
    } else if (g.seen > 0 && !key.first) {
      capture(g, x.shape, steps, plan);
      launch(g);
      ++m_graph_captures;
    } else {
      enqueue_step(g, x.shape, steps, plan);
      ++m_graph_eager;
    }
    ++g.seen;
    DTLAB_CUDA_CHECK(cudaStreamSynchronize(m_ctx.stream()));
    m_st.count_copies((x.data.size() + labels.size()) * 4, (2 + nparams) * 4);
    const int32_t* o = g.out.data();
    std::memcpy(&out.loss, &o[0], sizeof(float));
    out.correct = o[1];
    out.nonfinite = -1;  // the first in backward's ready order (Model::backward's walk)
    for (size_t i = m_layers.size(); i-- > m_layout.first_with_params && out.nonfinite < 0;)
      for (int p = m_layout.count[i] - 1; p >= 0 && out.nonfinite < 0; --p)
        if (o[2 + m_layout.first[i] + p]) out.nonfinite = m_layout.first[i] + p;
    // what the calls it stands for leave behind (forward_loss, backward_loss, step_param)
    m_trained = true;
    m_dlogits_view = {m_dlogits.data(), {x.dim(0), m_classes}};
    m_host_buffers_stale = m_host_stats_stale = true;
    m_st.host_grads_stale = true;
    m_st.timer.close();
    return true;
  }

  StagingTraffic traffic() const override { return m_st.traffic(); }

  DeviceMemory* device_memory() override { return &m_memory; }

  // ---- gradients on the device (executor.h: keep_grads) ----
  bool keep_grads(bool on) override {
    m_ctx.make_current();
    if (on && !m_st.keep_grads) {
      for (auto& layer : m_layers) layer->upload_grads();  // what the host has accumulated so far
      m_st.host_grads_stale = m_st.device_grads_stale = false;
    } else if (!on && m_st.keep_grads) {
      to_host(kStateGrads);
    }
    m_st.keep_grads = on;
    return on;
  }

  float* device_grad(size_t index) override {
    if (!m_st.keep_grads) return nullptr;
    DeviceBuffer<float>* g = m_layers[m_owner[index].first]->device_grad(m_owner[index].second);
    if (!g) return nullptr;
    take_up_grads();
    return g->data();
  }

  void zero_grads() override {
    if (!m_st.keep_grads) return;
    m_ctx.make_current();
    for (auto& layer : m_layers) layer->zero_grads();
    m_st.host_grads_stale = m_st.device_grads_stale = false;  // zero on both sides
  }

  // {"device": "cuda:0", "name": "NVIDIA H100 80GB HBM3", "conv_algorithms": [{"layer", "pass", ...}]}
  std::string report_json() const override {
    nlohmann::json algos = nlohmann::json::array();
    for (const ConvAlgoRecord& r : m_ctx.conv_algorithms())
      algos.push_back({{"layer", r.layer},
                       {"pass", r.pass},
                       {"algo", r.algo},
                       {"how", r.how},
                       {"deterministic", r.deterministic},
                       {"math", r.math},
                       {"workspace", r.workspace},
                       {"time_ms", r.time_ms}});
    nlohmann::json j{{"device", m_spec.str()}, {"name", m_gpu_name}, {"conv_algorithms", algos}};
    if (m_graph_captures + m_graph_replays + m_graph_eager > 0)
      j["cuda_graphs"] = {{"captured", m_graph_captures},
                          {"replayed", m_graph_replays},
                          {"eager", m_graph_eager},
                          {"what", "--cuda-graphs: training steps captured as a CUDA Graph (a step of a new shape or "
                                   "new arguments, the second time it comes), replayed, and run kernel by kernel "
                                   "(the first step, and the first of each new shape or arguments)"}};
    return j.dump();
  }

 private:
  CudaContext m_ctx;  // first: destroyed last, after every buffer and cuDNN descriptor below
  CudaDeviceMemory m_memory{m_ctx};  // the collectives' view of this rank's GPU memory
  Staging m_st;
  DeviceSpec m_spec;
  std::string m_gpu_name;
  std::vector<std::unique_ptr<DeviceLayer>> m_layers;  // one per module
  std::vector<const char*> m_ops;                      // each one's name on the timeline (null: no device work)
  Model::ParamLayout m_layout;                         // where each module's parameters sit in params()
  // residency: per parameter (Model::params() order) its module and index there, the device's
  // momentum buffer and the host's mirror of it
  std::vector<Param*> m_params;
  std::vector<std::pair<size_t, int>> m_owner;
  std::vector<std::vector<DeviceBuffer<float>>> m_state;  // per parameter: momentum, or Adam's moments
  std::vector<std::vector<Tensor*>> m_mirror;            // per parameter: the host's (the optimizer's) copies
  std::vector<char> m_state_stale;  // the host's state is newer (a restored checkpoint)
  size_t m_last_device_param = ~size_t{0};
  bool m_host_params_stale = false, m_host_momentum_stale = false;
  bool m_device_buffers_stale = true, m_host_buffers_stale = false, m_host_stats_stale = false;
  bool m_stepping = false;        // step_param has run: the device's parameters are the state
  DeviceBuffer<float> m_grad;     // the gradient being stepped
  // One parameter's optimizer step on the device: the buffers its kernel takes.
  struct ParamStep {
    size_t index = 0;
    DeviceBuffer<float>* w = nullptr;
    const float* grad = nullptr;
    float* s0 = nullptr;  // momentum, or Adam's exp_avg
    float* s1 = nullptr;  // Adam's exp_avg_sq
  };
  // step_param's host side: the host's newer parameters and state taken up, the state sized (zeros
  // at the first step), the host's tensors made its mirrors, the residency flags set. kept_grad:
  // the gradient is the device's own (keep_grads) without asking device_grad, which would take
  // the host's up (graph_step has zeroed them on the device).
  ParamStep prepare_step(size_t index, int64_t step, const std::vector<Tensor*>& host_state, bool kept_grad) {
    ParamStep ps;
    ps.index = index;
    ps.w = device_param(index);
    const bool first = step == 1;
    m_stepping = true;
    if (m_st.params_stale) {  // the host wrote them after the last forward: its values first
      for (auto& layer : m_layers) layer->upload_params();
      m_st.params_stale = false;
    }
    if (kept_grad) {
      ps.grad = m_layers[m_owner[index].first]->device_grad(m_owner[index].second)->data();
    } else if (float* kept = device_grad(index)) {
      ps.grad = kept;  // reduced where it lives
    } else {
      m_st.upload(m_grad, m_params[index]->grad.data);  // the host's gradient (averaged, accumulated)
      ps.grad = m_grad.data();
    }
    // the optimizer's state of this parameter (momentum; Adam's moments): zeros at the first step,
    // the host's after it wrote them (a restored checkpoint); the host's tensors become mirrors
    std::vector<DeviceBuffer<float>>& st = m_state[index];
    st.resize(host_state.size());
    for (size_t s = 0; s < host_state.size(); ++s) {
      if (st[s].size() != ps.w->size()) {
        st[s].resize(ps.w->size());
        st[s].fill_bytes(0, m_ctx.stream());
      }
      if (m_state_stale[index] && !first) m_st.upload(st[s], host_state[s]->data);
    }
    m_state_stale[index] = 0;
    m_mirror[index] = host_state;
    if (!host_state.empty()) m_host_momentum_stale = true;
    ps.s0 = st.size() > 0 ? st[0].data() : nullptr;
    ps.s1 = st.size() > 1 ? st[1].data() : nullptr;
    m_host_params_stale = true;
    return ps;
  }
  // step_param's kernel.
  void launch_step(const ParamStep& ps, const OptimizerOptions& opt, int64_t step) {
    const int64_t count = static_cast<int64_t>(ps.w->size());
    const size_t span =
        m_st.timer.begin(opt.is_sgd() ? "sgd" : "adam", "kernels", static_cast<int>(m_owner[ps.index].first));
    if (opt.is_sgd())
      sgd_step(m_ctx, ps.w->data(), ps.grad, ps.s0, count, opt.sgd, step == 1);
    else
      adam_step(m_ctx, ps.w->data(), ps.grad, ps.s0, ps.s1, count, opt.adam, step);
    m_st.timer.end(span);
  }

  // The host wrote the gradients (host_changed): the device takes them up before using its own.
  void take_up_grads() {
    if (!m_st.device_grads_stale) return;
    for (auto& layer : m_layers) layer->upload_grads();
    m_st.device_grads_stale = false;
  }
  DeviceBuffer<float>* device_param(size_t index) {
    return m_layers[m_owner[index].first]->device_param(m_owner[index].second);
  }
  // ---- --cuda-graphs ----
  template <class T>
  class Pinned {  // page-locked host memory (cudaMallocHost): what a graph's copies read and write
   public:
    Pinned() = default;
    Pinned(const Pinned&) = delete;
    Pinned& operator=(const Pinned&) = delete;
    ~Pinned() {
      if (m_p) static_cast<void>(cudaFreeHost(m_p));
    }
    void resize(size_t count) {
      assert(!m_p);
      void* p = nullptr;
      DTLAB_CUDA_CHECK(cudaMallocHost(&p, count * sizeof(T) + 1));
      m_p = static_cast<T*>(p);
      m_count = count;
    }
    T* data() { return m_p; }
    bool empty() const { return !m_p; }
    size_t size() const { return m_count; }

   private:
    T* m_p = nullptr;
    size_t m_count = 0;
  };
  // A step's shape and the arguments its kernels take by value: a graph replays only its own.
  struct GraphKey {
    Shape shape;
    double lr, momentum, dampening, weight_decay;
    bool nesterov, first;
    bool operator<(const GraphKey& o) const {
      return std::tie(shape, lr, momentum, dampening, weight_decay, nesterov, first) <
             std::tie(o.shape, o.lr, o.momentum, o.dampening, o.weight_decay, o.nesterov, o.first);
    }
  };
  struct StepGraph {
    cudaGraphExec_t exec = nullptr;
    uint64_t allocations = 0;  // device_buffer_allocations() when captured
    int64_t seen = 0;          // steps of this key so far
    Pinned<float> x;
    Pinned<int32_t> labels, out;  // out: [loss (float bits) | hits | one flag per parameter]
    StepGraph() = default;
    StepGraph(const StepGraph&) = delete;
    StepGraph& operator=(const StepGraph&) = delete;
    ~StepGraph() { drop(); }
    void drop() {
      if (exec) static_cast<void>(cudaGraphExecDestroy(exec));
      exec = nullptr;
    }
  };
  void enqueue_step(StepGraph& g, const Shape& shape, const std::vector<ParamStep>& steps, const DeviceStepPlan& plan) {
    const cudaStream_t s = m_ctx.stream();
    const int64_t n = shape.at(0);
    m_x.resize(g.x.size());
    m_labels.resize(g.labels.size());
    DTLAB_CUDA_CHECK(cudaMemcpyAsync(m_x.data(), g.x.data(), g.x.size() * sizeof(float), cudaMemcpyHostToDevice, s));
    DTLAB_CUDA_CHECK(
        cudaMemcpyAsync(m_labels.data(), g.labels.data(), g.labels.size() * sizeof(int32_t), cudaMemcpyHostToDevice, s));
    DeviceView h{m_x.data(), shape};
    for (size_t i = 0; i < m_layers.size(); ++i) {
      const size_t span = m_ops[i] ? m_st.timer.begin(m_ops[i], "kernels", static_cast<int>(i)) : 0;
      h = m_layers[i]->forward(h, Mode::Train);
      if (m_ops[i]) m_st.timer.end(span);
    }
    m_classes = h.shape.at(1);
    m_dlogits.resize(static_cast<size_t>(n * m_classes));
    m_loss.resize(2);
    const size_t ce = m_st.timer.begin("cross-entropy", "kernels", -1);
    cross_entropy(m_ctx, h.data, m_labels.data(), n, m_classes, reinterpret_cast<float*>(m_loss.data()),
                  m_loss.data() + 1, m_dlogits.data());
    m_st.timer.end(ce);
    m_st.timer.phase = Phase::Backward;
    for (auto& layer : m_layers) layer->zero_grads();
    DeviceView dy{m_dlogits.data(), h.shape};
    for (size_t i = m_layers.size(); i-- > m_layout.first_with_params;) {
      const size_t span = m_ops[i] ? m_st.timer.begin(m_ops[i], "kernels", static_cast<int>(i)) : 0;
      dy = m_layers[i]->backward(dy, i > m_layout.first_with_params);
      if (m_ops[i]) m_st.timer.end(span);
    }
    m_st.timer.phase = Phase::OptimizerStep;
    const size_t nparams = m_params.size();
    m_flags.resize(nparams + 1);
    std::vector<const float*> grads;
    std::vector<float*> weights, momentum;
    std::vector<int64_t> counts;
    for (const ParamStep& ps : steps) {  // (params() order: steps[i].index == i)
      grads.push_back(ps.grad);
      weights.push_back(ps.w->data());
      if (ps.s0) momentum.push_back(ps.s0);
      counts.push_back(static_cast<int64_t>(ps.w->size()));
    }
    // one kernel for every gradient's flag, one for "any", one SGD for every parameter (foreach)
    const size_t span = m_st.timer.begin("sgd", "kernels", -1);
    nonfinite_flags(m_ctx, grads, counts, m_flags.data());
    any_flag(m_ctx, m_flags.data(), static_cast<int64_t>(nparams), m_flags.data() + nparams);
    sgd_step_multi(m_ctx, weights, grads, momentum, counts, plan.opt->sgd, plan.step == 1, m_flags.data() + nparams);
    m_st.timer.end(span);
    DTLAB_CUDA_CHECK(cudaMemcpyAsync(g.out.data(), m_loss.data(), 2 * sizeof(int32_t), cudaMemcpyDeviceToHost, s));
    DTLAB_CUDA_CHECK(
        cudaMemcpyAsync(g.out.data() + 2, m_flags.data(), nparams * sizeof(int32_t), cudaMemcpyDeviceToHost, s));
  }
  void capture(StepGraph& g, const Shape& shape, const std::vector<ParamStep>& steps, const DeviceStepPlan& plan) {
    const uint64_t before = device_buffer_allocations().load();
    cudaGraph_t graph = nullptr;
    m_st.timer.enabled = false;
    DTLAB_CUDA_CHECK(cudaStreamBeginCapture(m_ctx.stream(), cudaStreamCaptureModeThreadLocal));
    std::string failed;
    try {
      enqueue_step(g, shape, steps, plan);
    } catch (const std::exception& e) {
      failed = e.what();
    }
    const cudaError_t end = cudaStreamEndCapture(m_ctx.stream(), &graph);
    m_st.timer.enabled = true;
    if (failed.empty() && end != cudaSuccess) failed = std::string("cudaStreamEndCapture: ") + cudaGetErrorString(end);
    if (failed.empty() && device_buffer_allocations().load() != before)
      failed = "a buffer was allocated during the capture";
    if (failed.empty()) {
      const cudaError_t inst = cudaGraphInstantiate(&g.exec, graph, 0);
      if (inst != cudaSuccess) failed = std::string("cudaGraphInstantiate: ") + cudaGetErrorString(inst);
    }
    if (graph) static_cast<void>(cudaGraphDestroy(graph));
    if (!failed.empty()) {
      static_cast<void>(cudaGetLastError());
      g.exec = nullptr;
      throw DeviceError("--cuda-graphs: capturing the training step failed: " + failed,
                        "run without --cuda-graphs; the step then runs kernel by kernel, with the same results");
    }
    g.allocations = before;
  }
  void launch(StepGraph& g) {
    const size_t span = m_st.timer.begin("cuda graph", "kernels", -1);
    DTLAB_CUDA_CHECK(cudaGraphLaunch(g.exec, m_ctx.stream()));
    m_st.timer.end(span);
  }
  std::map<GraphKey, StepGraph> m_graphs;
  DeviceBuffer<int32_t> m_flags;  // (params + 1): a gradient's "NaN or infinite", then "any"
  int64_t m_classes = 0;
  int64_t m_graph_captures = 0, m_graph_replays = 0, m_graph_eager = 0;

  DeviceBuffer<float> m_x;        // (N, ...): the staged input
  DeviceBuffer<float> m_dlogits;  // (N, 10): uploaded by backward, or forward_loss's gradient
  DeviceView m_dlogits_view;      // forward_loss's gradient (none after a plain forward)
  DeviceBuffer<int32_t> m_labels;  // (N,) forward_loss's labels
  std::vector<int32_t> m_labels_host;
  DeviceBuffer<int32_t> m_loss;   // (2,) [loss (float bits) | hits]
  Tensor m_logits;                // (N, 10) on the host
  bool m_trained = false;         // the last forward was a Train forward: backward may follow
};

}  // namespace

// ---- factory ----

// rank: not used to pick a device: every rank of this process runs on opt.device's GPU.
std::unique_ptr<ModelExecutor> make_cuda_executor(Model& model, const ComputeOptions& opt, int /*rank*/) {
  const DeviceSpec spec = parse_device(opt.device);
  if (spec.kind != "cuda")
    throw ConfigError("--device " + opt.device + " runs on the host: it needs no GPU executor",
                      "choose --device cuda or cuda:N for the GPU");
  const CudaProbe probe = cuda_devices();
  if (!probe.ok()) throw DeviceError("--device " + opt.device + ": " + probe.reason, probe.hint);
  const int count = static_cast<int>(probe.devices.size());
  if (spec.index < 0 || spec.index >= count)
    throw DeviceError("--device " + opt.device + ": GPU " + std::to_string(spec.index) +
                          " does not exist: this process sees " + std::to_string(count) + " GPU" +
                          (count == 1 ? "" : "s"),
                      "choose cuda:0" + (count == 1 ? "" : " to cuda:" + std::to_string(count - 1)) +
                          "; `nvidia-smi` lists the GPUs, CUDA_VISIBLE_DEVICES may hide some");
  CudaContextOptions copt;
  copt.device = spec.index;
  copt.matmul_tf32 = opt.allow_tf32;
  copt.conv_tf32 = opt.allow_tf32;
  copt.cudnn_benchmark = opt.cudnn_benchmark;
  copt.cudnn_deterministic = opt.cudnn_deterministic;
  return std::make_unique<CudaExecutor>(model, copt, spec, probe.devices[static_cast<size_t>(spec.index)].name);
}

}  // namespace lab::cuda
