// --device sim: a simulated GPU. It follows the GPU executor's protocol (lab/nn/executor.h) step for
// step and computes with the CPU's ops, so that every path of a device run except the kernels
// themselves runs on any machine, and a run through it must give the CPU run's bits:
//   * the "device" is memory of its own: a copy of each layer (Linear, Conv2d, ReLU, MaxPool2d)
//     with its own parameters, activations and gradients; the host's model is never computed on;
//   * host-staged until its optimizer's first step, then resident: the Linear, Conv2d and
//     BatchNorm parameters and their momentum buffers live on the device, which steps them
//     (step_param: SGD, Adam, AdamW), and the host's copies are mirrors. A mirror the device has moved past holds NaN
//     until to_host brings it current, so a reader that forgets to ask shows in the run's numbers
//     at once;
//   * BatchNorm, resident, runs whole on the device: a device copy of the layer computes the
//     statistics, updates its running statistics (kStateBuffers: resident from the first forward;
//     the host's BatchNorm holds their poisoned mirrors and its last_stats() is brought down only
//     when asked) and runs SyncBN's collectives on the device's memory (BnSync::allgather_on,
//     allreduce_sum_on). The SyncBN counts of every rank come to the host, as PyTorch's
//     SyncBatchNorm brings them to drop empty ranks' rows (backends/cuda does the same with its
//     kernels). Host-staged (resident = false) it is split at its statistics, the protocol the GPU
//     executor had before residency: the device computes the per-channel sums, the host's
//     BatchNorm finishes them, the device applies the coefficients;
//   * with keep_grads (DDP's buckets in device memory), the gradients of those parameters stay on
//     the device too, reduced there by collectives on its memory (SimDeviceMemory); the host's
//     Param::grad is then their poisoned mirror;
//   * the bytes a GPU would copy each way are counted (StagingTraffic) and each layer's work is a
//     span on the device's timeline (EventKind::Device), timed on the host's clock.
// What it does not simulate: asynchrony (its stream runs each piece of work when it is queued) and
// the GPU's kernels (cuBLAS, cuDNN, the hand-written ones); tests/gpu compares those with the CPU.
// Its convolutions are the CPU's unfused layers: the CPU's cnn fuses BatchNorm2d -> ReLU ->
// MaxPool2d, whose backward adds in another order (bn_relu_pool.h), so a cnn run agrees with the
// CPU's to float rounding, an mlp run bit for bit.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "device_memory.h"
#include "executor.h"
#include "model.h"

namespace lab {

// The simulated GPU's memory as the collectives see it: host memory (the simulated device's
// buffers are the CPU's), its copies memcpy and its adds the CPU's in index order, so a collective
// on it gives the host's bits. It counts what it moved: the transports call it from any rank's
// threads (a rank's communication thread included), so the counts are atomic.
class SimDeviceMemory final : public DeviceMemory {
 public:
  std::string name() const override { return "sim"; }
  void copy(void* dst, const void* src, size_t bytes) override;
  void add(float* acc, const float* in, size_t count) override;
  void download(void* host, const void* device, size_t bytes) override;
  void upload(void* device, const void* host, size_t bytes) override;
  void scale(float* x, float k, size_t count) override;
  void divide(float* x, float d, size_t count) override;
  bool all_finite(const float* x, size_t count) override;
  // a flag per buffer, one answer (as the GPU's: one download of them all)
  int first_nonfinite(const std::vector<const float*>& xs, const std::vector<size_t>& counts) override;
  void* allocate(size_t bytes) override;
  void release(void* p) override;
  uint64_t device_bytes() const { return m_device.load(); }  // copied or added on the device
  uint64_t downloaded() const { return m_down.load(); }
  uint64_t uploaded() const { return m_up.load(); }
  // Finiteness answers brought to the host: each one a wait for the device on a GPU.
  uint64_t finite_answers() const { return m_answers.load(); }

 private:
  std::atomic<uint64_t> m_device{0}, m_down{0}, m_up{0}, m_answers{0};
};

struct SimCounters {
  int forwards = 0;         // forward passes
  int params_uploaded = 0;  // parameters taken up from the host
  int params_to_host = 0;   // parameters brought down into the host's mirrors
  int buffers_uploaded = 0; // BatchNorm layers whose buffers were taken up from the host
  int buffers_to_host = 0;  // BatchNorm layers whose buffers and statistics were brought down
  int device_losses = 0;    // training forwards whose loss was computed on the device (forward_loss)
  int device_steps = 0;     // parameters stepped on the device (step_param)
  uint64_t grad_bytes_to_host = 0;  // gradients a backward brought to the host (none when kept: keep_grads)
};

class SimExecutor : public ModelExecutor {
 public:
  // resident false: host-staged throughout (every forward takes every parameter up; the host's
  // optimizer steps), the GPU executor's protocol before residency, kept as a reference.
  // Throws ConfigError naming a module it cannot run.
  explicit SimExecutor(Model& host, bool resident = true);

  std::string describe() const override { return "sim (a simulated GPU)"; }
  const Tensor& forward(const Tensor& x, Mode mode) override;
  void backward(const Tensor& dlogits, const std::function<void(int)>& on_param_ready) override;
  // the executor's copies and those of collectives on its memory (staged ones)
  StagingTraffic traffic() const override;
  // {"device": "sim", "resident": true, "conv_algorithms": [...], "protocol": {counters}}
  std::string report_json() const override;
  void take_device_events(std::vector<Event>& out) override;

  unsigned resident() const override {
    return m_resident ? kStateParams | kStateMomentum | kStateBuffers | (m_keep_grads ? kStateGrads : 0u) : 0u;
  }
  void to_host(unsigned sets) override;
  void host_changed(unsigned sets) override;
  bool step_param(size_t index, const OptimizerOptions& opt, int64_t step, const std::vector<Tensor*>& host_state) override;

  const SimCounters& counters() const { return m_count; }
  DeviceMemory* device_memory() override { return &m_memory; }
  bool keep_grads(bool on) override;
  float* device_grad(size_t index) override;
  void zero_grads() override;
  // the loss on the device: the labels up, the loss and the hits down; the logits and their
  // gradient stay (the CPU's cross_entropy, so the CPU run's bits)
  bool forward_loss(const Tensor& x, const std::vector<int>& labels, float& loss, int& correct) override;
  void backward_loss(const std::function<void(int)>& on_param_ready) override;
  void poison_loss_grad() override;

 private:
  const Tensor& run_forward(const Tensor& x, Mode mode);  // the layers; the device's logits
  void run_backward(const std::function<void(int)>& on_param_ready);  // from m_dlogits, on the device
  friend class SimBnSync;
  void upload_params();
  void upload_buffers();  // the host's BatchNorm buffers to the device's layers
  void span(Phase phase, const char* op, size_t module, double t0);
  // A copy between the host and the device: counted (StagingTraffic) and a span on the timeline.
  void copied(bool to_host, uint64_t bytes, double t0);

  bool m_resident;
  Model& m_host;
  std::vector<std::unique_ptr<Module>> m_dev;  // per module: its device copy (nullptr: a staged BatchNorm)
  std::vector<BatchNorm*> m_host_bn, m_dev_bn;  // per module: a resident BatchNorm's host layer and device copy
  std::vector<std::unique_ptr<BnSync>> m_bn_sync;  // per module: SyncBN's collectives on the device's memory
  std::vector<const char*> m_ops;              // per module: its name on the timeline (device_timeline_op)
  Model::ParamLayout m_layout;
  std::vector<Param*> m_params;                // the host's, Model::params() order
  std::vector<Param*> m_dev_params;            // the device's copy of each (nullptr: kept on the host)
  std::vector<size_t> m_owner;                 // the module of each
  std::vector<Tensor> m_in, m_out, m_grad;     // per module: its input, output, input gradient
  Tensor m_x, m_logits, m_dlogits;
  // residency
  std::vector<std::vector<Tensor>> m_state;    // per parameter: the device's optimizer state (momentum; Adam's moments)
  std::vector<std::vector<Tensor*>> m_mirror;  // per parameter: the host's (the optimizer's) copies
  std::vector<char> m_state_stale;             // the host's state is newer (a restored checkpoint)
  bool m_stepping = false;                     // step_param has run: the device's parameters are the state
  // gradients on the device (keep_grads): one per device parameter, accumulated by backward
  bool m_keep_grads = false;
  std::vector<Tensor> m_dgrad;
  bool m_device_grads_stale = false, m_host_grads_stale = false;
  void take_up_grads();                        // the host's gradients, after host_changed
  bool m_device_params_stale = true, m_host_params_stale = false, m_host_momentum_stale = false;
  bool m_device_buffers_stale = true, m_host_buffers_stale = false, m_host_stats_stale = false;
  Phase m_phase = Phase::None;  // the pass in progress, for the copies' spans
  StagingTraffic m_traffic;
  SimDeviceMemory m_memory;
  SimCounters m_count;
  std::vector<Event> m_spans;
};

}  // namespace lab
