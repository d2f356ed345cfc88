// The device seam: where a model computes (--device) and the interface a device backend implements
// to run a Model's forward and backward. lab/ knows no device API: a front end passes a factory
// (backends/backends.h: make_executor) to lab::Run, as it passes the transport's World.
//
// "cpu" is the reference and needs no executor: Model runs its own modules (lab/nn). Any other
// device runs the model through a ModelExecutor attached with Model::set_executor:
//
//   * The Model's host tensors are the state of record between steps, or its mirrors where the
//     device keeps it (residency, below): parameters (Param::value), gradients (Param::grad),
//     buffers (running statistics, num_batches_tracked). Everything else of the run (DDP's buckets
//     and every allreduce, local SGD's averaging, the broadcasts, checkpoints, the BatchNorm
//     statistics the app shows) reads and writes them, so run.cpp does not know which device
//     computes.
//   * forward(x, mode) uploads x, and the parameters where the host's are newer (host-staged:
//     always; resident: only after host_changed), runs the layers on the device and downloads the
//     logits. Training's forward_loss (Model::forward_loss) computes the loss there too: only the
//     loss and the count of hits come down, and backward_loss starts from the gradient it kept.
//   * BatchNorm, host-staged, is split at its statistics: the device computes this rank's
//     per-channel mean and sum of squared deviations, the host BatchNorm finishes the step from
//     them (BatchNorm::prepare_from_local_stats: SyncBN's collectives, the running statistics, the
//     batch-of-one error, the coefficients alpha and beta), and the device applies the
//     coefficients. Backward likewise: the device's per-channel sums go to
//     BatchNorm::finish_backward (weight and bias gradients, SyncBN's allreduce) and its input
//     gradient coefficients come back. Resident (below), BatchNorm runs whole on the device, its
//     SyncBN collectives on the device's buffers (BnSync::allgather_on, allreduce_sum_on).
//   * backward(dlogits, on_param_ready) walks the layers in reverse as Model::backward does,
//     computes each layer's parameter gradients on the device, adds them to the host gradients
//     (+=, so no_sync's accumulation works unchanged) and calls on_param_ready for each parameter
//     in the same order as Model::backward: DDP's buckets start as they do on the CPU.
//
// Host-staged, a step copies the parameters each way (host -> device before the forward, gradients
// device -> host during backward); an executor counts those bytes (StagingTraffic) and the run
// reports them.
//
// Residency: an executor may keep state on the device between steps instead (resident() says
// which): the parameters its own optimizer step updates (step_param: the Linear, Conv2d and
// BatchNorm weights and biases, with their momentum buffers) and, where BatchNorm runs whole on the
// device, its buffers and batch statistics (kStateBuffers), from its first step on (before it, and
// for a model whose optimizer steps on the host, it stays host-staged). A step then copies the
// gradients down and, once reduced, up for the step: no parameter travels. The host's copies are
// mirrors:
//   * Model::to_host(sets) brings them up to date before the host reads them (a checkpoint, the
//     final weights, a broadcast, local SGD's average, an evaluation on another model, the
//     BatchNorm statistics of a step bn_stats.bin records);
//   * Model::host_changed(sets) after the host wrote them (a broadcast, a checkpoint restored,
//     an average): the device takes them up before it next uses them.
// The central readers and writers do it (model_tensors, load_model_tensors, copy_state: the whole
// state_dict, kStateModel); code that touches Param::value or a Buffer directly says so itself.
// Model::host_holds(sets) tells a reader that only wants the host's copies when they are free
// (the live BatchNorm records of every step) whether they are.
//
// Gradients: on the host by default (the collectives read them there). DDP, when its allreduce can
// work in the device's memory (device_memory(); lab/comm/device_memory.h), asks the executor to
// keep those parameters' gradients on the device (keep_grads): its buckets are then device memory,
// the ring moves and adds chunks between the ranks' buckets there, and the optimizer steps from the
// reduced gradient where it is: a DDP step copies only the input up and the logits (and
// BatchNorm's per-channel sums) down. Host readers of those gradients (a checkpoint of no_sync's
// accumulation, the message naming a non-finite one) go through to_host(kStateGrads).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "device.h"
#include "events.h"
#include "module.h"

namespace lab {

class DeviceMemory;
class Model;
struct OptimizerOptions;

// The optimizer's step as graph_step takes it (Optimizer::begin_device_step): step_param's
// arguments for every parameter.
struct DeviceStepPlan {
  const OptimizerOptions* opt = nullptr;
  int64_t step = 0;                         // 1: the first
  std::vector<std::vector<Tensor*>> state;  // per parameter (Model::params() order): step_param's host_state
};

// What a whole training step (Model::graph_step) reports to the host.
struct GraphStepOutcome {
  float loss = 0.0f;
  int correct = 0;
  // The first parameter, in backward's ready order (on_param_ready's), whose gradient is NaN or
  // infinite: then no parameter was stepped. -1: every gradient finite, every parameter stepped.
  int nonfinite = -1;
};

// What a device can keep between steps (ModelExecutor::resident, Model::to_host, host_changed).
enum StateSet : unsigned {
  kStateParams = 1u,    // parameter values
  kStateMomentum = 2u,  // the optimizer's state (SGD's momentum, Adam's moments) of the parameters it steps there
  kStateGrads = 4u,     // the gradients of those parameters, where kept on the device (keep_grads)
  kStateBuffers = 8u,   // BatchNorm's buffers (running statistics, num_batches_tracked) and the
                        // batch statistics of its last training forward (BatchNorm::last_stats)
  kStateModel = kStateParams | kStateBuffers,  // everything in the state_dict
  kStateAll = 15u,
};

// Bytes the host-staged executor moved, and the time it spent waiting for those copies.
struct StagingTraffic {
  uint64_t host_to_device_bytes = 0;
  uint64_t device_to_host_bytes = 0;
  double wait_ms = 0.0;  // host time spent in synchronous copies (includes the device work queued before them)
};

class ModelExecutor {
 public:
  virtual ~ModelExecutor() = default;
  // "cuda:0 (NVIDIA H100 80GB HBM3)"
  virtual std::string describe() const = 0;
  // logits = model(x), computed on the device. x: host (N, 1, 28, 28); the returned host tensor
  // (N, 10) stays valid until the next forward. Same contract as Model::forward (Train saves what
  // backward needs; BatchNorm updates the host's running statistics).
  virtual const Tensor& forward(const Tensor& x, Mode mode) = 0;
  // Model::backward's contract: dlogits host (N, 10); host gradients accumulate (+=);
  // on_param_ready(i) in Model::backward's order.
  virtual void backward(const Tensor& dlogits, const std::function<void(int)>& on_param_ready) = 0;
  virtual StagingTraffic traffic() const = 0;
  // What the device chose, for summary.json: a JSON object as text, e.g. the cuDNN algorithm of
  // each convolution pass ({"conv_algorithms": [...]}). "{}" when there is nothing to say.
  virtual std::string report_json() const { return "{}"; }
  // The device's own timeline: what it did since the last call (each layer's kernels of a forward
  // or backward, the copies), as EventKind::Device events timed by the device and placed on
  // now_seconds()'s clock, with phase, op, what, tag (the module index) and bytes set; the caller
  // sets rank and train_step. The run calls it after each compute phase (Communicator::timed), so
  // the app's timeline and trace.json show the device beside the host's view of the same phase.
  // A device that cannot time itself appends nothing.
  virtual void take_device_events(std::vector<Event>& out) { (void)out; }

  // ---- residency (above) ----
  // The sets the device holds between steps (0: host-staged, the host's tensors are the state).
  virtual unsigned resident() const { return 0; }
  // Bring the host's copies of `sets` up to date (a copy only where the device changed them).
  virtual void to_host(unsigned sets) { (void)sets; }
  // The host wrote `sets`: the device's copies are stale until it takes the host's up again.
  virtual void host_changed(unsigned sets) { (void)sets; }
  // One optimizer update of parameter `index` (Model::params() order) on the device, with its
  // gradient, as Optimizer::step does it (optim.h): SGD (sgd_apply) or Adam / AdamW (adam_apply)
  // at step `step` (1: the first). `host_state`: the parameter's optimizer state on the host, in
  // Optimizer::state_names_of(opt) order (SGD with momentum: the momentum buffer; Adam: exp_avg,
  // exp_avg_sq), sized; they become the device's mirrors (to_host(kStateMomentum) fills them; a
  // restored state is taken up after host_changed). Returns false for a parameter the device does
  // not step (the host then does).
  virtual bool step_param(size_t index, const OptimizerOptions& opt, int64_t step, const std::vector<Tensor*>& host_state) {
    (void)index, (void)opt, (void)step, (void)host_state;
    return false;
  }
  // The device's memory as collectives see it (lab/comm/device_memory.h): for an allreduce of
  // buffers that live there. nullptr: none (the collectives work on the host's copies).
  virtual DeviceMemory* device_memory() { return nullptr; }

  // ---- gradients on the device ----
  // on: from the next backward, the gradients of the parameters the device steps (step_param's)
  // stay on the device, accumulated there (+=, as the host's), instead of being added into the
  // host's Param::grad, which becomes their mirror (kStateGrads: to_host before the host reads
  // them, host_changed after it wrote them). A caller that reduces them on the device asks (DDP's
  // buckets in device memory). Returns whether the device keeps them (false: the host does, as
  // before).
  virtual bool keep_grads(bool on) {
    (void)on;
    return false;
  }
  // Parameter `index`'s gradient on the device (Model::params() order), the host's newer values
  // taken up first; nullptr where the host keeps it. Valid until the executor is destroyed.
  virtual float* device_grad(size_t index) {
    (void)index;
    return nullptr;
  }
  // Model::zero_grad: the device's gradients to zero.
  virtual void zero_grads() {}

  // ---- the loss on the device ----
  // Model::forward_loss: a Train forward of x (host (N, 1, 28, 28)) and nn.CrossEntropyLoss (mean)
  // over labels (host, N) on the device, the logits and the loss's gradient kept there. Returns
  // true with loss and correct (argmax hits) set, the only values that come to the host; false
  // where the device cannot (the model then takes the logits to the host, as forward does).
  virtual bool forward_loss(const Tensor& x, const std::vector<int>& labels, float& loss, int& correct) {
    (void)x, (void)labels, (void)loss, (void)correct;
    return false;
  }
  // backward's contract, from the gradient the last forward_loss kept on the device.
  virtual void backward_loss(const std::function<void(int)>& on_param_ready) { (void)on_param_ready; }
  // --fail-at nan: the first value of that gradient becomes NaN.
  virtual void poison_loss_grad() {}

  // ---- a whole training step in one call (--cuda-graphs) ----
  // Model::graph_step's work on a device that captures it: forward_loss, the gradients zeroed,
  // backward_loss (kept on the device), a finiteness check of every gradient, and step_param of
  // every parameter with plan's arguments unless a gradient is NaN or infinite, queued as one
  // piece of work (the GPU: a CUDA Graph, captured the second time a step of this shape and these
  // arguments comes, replayed from the third on). The host's side of each piece is the calls':
  // BatchNorm::begin_forward, the residency bookkeeping. Returns false where the device has no
  // such step: the model then makes those calls one by one. can_graph_step says beforehand whether
  // it will take the step (false with the reason in why).
  virtual bool can_graph_step(std::string* why) {
    if (why) *why = "this device has no captured step";
    return false;
  }
  virtual bool graph_step(const Tensor& x, const std::vector<int>& labels, const DeviceStepPlan& plan,
                          GraphStepOutcome& out) {
    (void)x, (void)labels, (void)plan, (void)out;
    return false;
  }
};

// A module's kernels on a device's timeline (Event::op of its EventKind::Device spans): "linear",
// "conv2d", "batchnorm1d", "batchnorm2d", "relu", "max-pool"; nullptr for Flatten (a reshape: no
// device work) and for a kind no device runs. One list for every device backend.
const char* device_timeline_op(const std::string& module_kind);

// Builds the executor of `model` (already built, on the host) for rank `rank` on opt.device.
// Throws DeviceError when the device cannot be used (no driver, no GPU, a build without the
// backend), ConfigError for a model the device cannot run.
using ExecutorFactory =
    std::function<std::unique_ptr<ModelExecutor>(Model& model, const ComputeOptions& opt, int rank)>;

// The program's factory for devices other than the CPU, set once by its main() (the dtlab
// executable sets backends/devices.h's make_executor), so that the libraries that start runs (the
// CLI, the app, the lesson runner) need not link a device backend. Without one, a run on a device
// fails with a DeviceError saying so.
void set_executor_factory(ExecutorFactory f);
const ExecutorFactory& executor_factory();

// Gives `model` the executor of compute.device for `rank` of `world_size` ranks communicating over
// `comm`, on the GPU rank_device_map gives it (--rank-devices, one per NCCL rank, or --device's);
// on the CPU it does nothing. Returns the executor's description ("" on the CPU). The one place a
// model gets its device (dtlab run, bench train, eval). Throws DeviceError without a factory, and
// what the factory throws.
std::string attach_executor(Model& model, const ComputeOptions& compute, int rank, int world_size,
                            const std::string& comm);

}  // namespace lab
