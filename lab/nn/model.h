// Model: a Sequential of modules with PyTorch's state_dict names ("1.weight", "2.running_mean").
// build_model("mlp"|"cnn") gives the reference models of tools/torch/dtlab_models.py, initialized
// like `torch.manual_seed(seed); model = mlp()` (bit for bit, via TorchGenerator).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "batchnorm.h"
#include "bn_relu_pool.h"
#include "executor.h"
#include "module.h"

namespace lab {

// One entry of the state dict: exactly one of param / buffer is set.
struct StateEntry {
  std::string name;  // "1.weight"
  Param* param = nullptr;
  Buffer* buffer = nullptr;
};

class Optimizer;

// Calls around each module's forward and backward on the CPU (Model::set_hooks): FullyShardedDataParallel
// gathers a unit's parameters before its first module's forward and frees them after its last,
// as PyTorch's FSDP does from its module hooks. A fused BatchNorm -> ReLU -> MaxPool2d run calls
// before_* for each of its modules, then computes, then after_* for each (backward: in reverse).
struct ModuleHooks {
  std::function<void(size_t module)> before_forward, after_forward, before_backward, after_backward;
};

class Model {
 public:
  Model() = default;
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  void add(std::unique_ptr<Module> m) {
    m_lower_precision.push_back(m->set_autocast(m_autocast) ? 1 : 0);
    m_modules.push_back(std::move(m));
  }
  size_t size() const { return m_modules.size(); }
  Module& module(size_t i) { return *m_modules[i]; }

  // logits = model(x). x: (N, 1, 28, 28); logits: (N, 10). Throws ConfigError for a Train-mode
  // forward under autocast.
  const Tensor& forward(const Tensor& x, Mode mode);
  // A pipeline stage's part of forward (pipeline.h): modules [begin, end) on x, the input of module
  // `begin` (the previous stage's output, or the batch). forward(x, mode) is forward_range(0, size()).
  // A fused BatchNorm -> ReLU -> MaxPool2d run is fused only where all three lie in the range.
  const Tensor& forward_range(size_t begin, size_t end, const Tensor& x, Mode mode);
  // Backpropagates dy (the gradient of module end - 1's output) through the last Train
  // forward_range, accumulating parameter gradients as backward() does. Returns the gradient of
  // the range's input (what the previous stage needs), or nullptr when the range starts at or
  // before the model's first module with parameters (nothing below needs one).
  const Tensor* backward_range(const Tensor& dy);
  // The input module i had in the last forward (within its range): the range's input or module
  // i - 1's output (a pipeline's deferred BatchNorm tracks its statistics).
  const Tensor& module_input(size_t i) const {
    return i == m_begin ? *m_input : m_acts[i - 1];
  }
  // Backpropagates dlogits (N, 10) through the last Train forward. Parameter gradients are
  // accumulated (+=). on_param_ready(i) is called for parameter index i (params() order) as soon
  // as its gradient is final for this backward, which happens in reverse order: the hook DDP's
  // bucketing uses to start an allreduce during backward.
  void backward(const Tensor& dlogits, const std::function<void(int)>& on_param_ready = {});
  // Training's forward and loss in one: a Train forward of x, then nn.CrossEntropyLoss (mean) over
  // labels, whose gradient the model keeps for backward_from_loss. On a device that computes the
  // loss itself (executor.h: forward_loss) only the loss and the count of correct argmaxes come to
  // the host; the logits stay there. Returns the loss; correct: the hits.
  float forward_loss(const Tensor& x, const std::vector<int>& labels, int* correct);
  // backward(d loss / d logits of the last forward_loss, on_param_ready), wherever it lives.
  void backward_from_loss(const std::function<void(int)>& on_param_ready = {});
  // --fail-at nan: the first value of that gradient becomes NaN, so a NaN enters backward.
  void poison_loss_grad();
  // --cuda-graphs: DDP's training step of one rank in one call: forward_loss on x and labels, the
  // gradients zeroed, backward_from_loss, every gradient checked for NaN and infinity in
  // on_param_ready's order, and opt.step() unless one is not finite (outcome.nonfinite names it).
  // On a device that captures the step (executor.h: graph_step) it is queued there as one piece of
  // work; elsewhere (the CPU, the simulated GPU, an empty batch) the calls are made one by one: the
  // reference the captured step is tested against, bit for bit.
  GraphStepOutcome graph_step(const Tensor& x, const std::vector<int>& labels, Optimizer& opt);

  std::vector<Param*> params();          // registration order
  // Where each module's parameters sit in params(): first[i] the index of module i's first, count[i]
  // how many it has, first_with_params the first module with any (size() when none): backward
  // starts there, and that module needs no dx. An executor walks its layers with the same layout.
  struct ParamLayout {
    std::vector<int> first, count;
    size_t first_with_params = 0;
  };
  ParamLayout param_layout();
  std::vector<StateEntry> state_dict();  // params and buffers, PyTorch's order and names
  std::vector<BatchNorm*> batchnorms();
  std::vector<int> batchnorm_module_index();  // module index of each BatchNorm ("2" in "2.weight")
  void zero_grad();
  // The hooks of train-mode forwards and backwards from now on (nullptr: none). The CPU's modules
  // only: with an executor they are not called.
  void set_hooks(const ModuleHooks* hooks) { m_hooks = hooks; }
  // Bytes the last Train forward saved for backward (memory.h's "activations": every module's
  // output and what it saved, the loss's gradient), from that forward until its backward has
  // run; 0 otherwise, and on an executor (its activations live on its device).
  int64_t activation_bytes() const;
  std::string describe() const;          // "Sequential(Flatten(), Linear(784, 256), ...)"
  // BatchNorm2d -> ReLU -> MaxPool2d(2) runs as one fused layer (bn_relu_pool.h) when on (the
  // default); off runs the three modules, the reference the fused path is tested against.
  void set_fusion(bool on) { m_fusion = on; }
  // torch.autocast("cpu", dtype=torch.bfloat16) around eval-mode forwards, emulated in float32
  // storage. What PyTorch 1.13 does for these models (its AutocastCPU dispatch table: conv2d,
  // linear and addmm are lower_precision_fp ops; batch_norm, relu, max_pool2d and flatten have no
  // autocast entry and run in their input's dtype), and what is emulated:
  //   Linear, Conv2d: input and weight (and bias) rounded to bf16, products summed in float32,
  //     the bias added in float32, the output rounded to bf16 (gemm_bf16.h);
  //   BatchNorm (eval), ReLU, MaxPool2d, Flatten on a bf16 input: computed in float32 from the
  //     bf16 values, as PyTorch's bf16 kernels do (BatchNorm: x * alpha + beta with float32
  //     alpha and beta from the float32 running statistics), the output rounded to bf16 (an
  //     identity for ReLU, max-pool and Flatten, whose outputs are input values);
  //   the logits are bf16; the loss (cross_entropy is an fp32 autocast op) and softmax are
  //     computed from them in float32 / double, as without autocast.
  // Not emulated: the order in which PyTorch's bf16 kernels (oneDNN) add the products inside a
  // matrix product, and their treatment of subnormal values (gemm_bf16.h's kernel flushes them),
  // so a layer output may differ from PyTorch's by one bf16 step (0.02-0.04% of them on random
  // data at the models' shapes, measured against torch 1.13); whether PyTorch's bf16 BatchNorm
  // fuses x * alpha + beta into one rounding (no difference seen). On the trained models of
  // tools/torch/autocast_reference.py every top-1 prediction of the 10000 test samples is
  // PyTorch's. Backward is not emulated: Train-mode forwards throw while autocast is on.
  // None (the default) is the float32 model, bit for bit as without this setting.
  void set_autocast(Autocast a);
  Autocast autocast() const { return m_autocast; }
  // Floating-point operations of one training step per sample in the matrix products (forward,
  // weight gradients, and input gradients except for the first layer with parameters, which
  // needs none): 2 x multiply-adds, the usual count for a roofline. sample_shape: (1, 28, 28).
  // Runs one eval-mode forward of a zero sample (no buffer changes) to learn every layer's input.
  int64_t train_flops_per_sample(const std::vector<int64_t>& sample_shape);
  // Each module's forward multiply-adds for one sample (Module::forward_macs), by the same walk.
  std::vector<int64_t> module_macs(const std::vector<int64_t>& sample_shape);
  // Each module's output shape for one sample, without the batch dimension, by the same walk
  // (fusion off for it, so that every module's own output is seen).
  std::vector<std::vector<int64_t>> module_output_shapes(const std::vector<int64_t>& sample_shape);
  // Runs forward and backward on a device from now on (executor.h): the modules keep the state
  // (parameters, gradients, buffers) on the host, the executor computes. nullptr: the CPU modules
  // again. Autocast is the CPU's emulation: it cannot be combined with an executor.
  void set_executor(std::unique_ptr<ModelExecutor> exec);
  ModelExecutor* executor() { return m_exec.get(); }
  // Residency (executor.h): the host's copies of `sets` (StateSet) up to date before the host reads
  // them; host_changed after it wrote them. Without a resident executor both do nothing.
  void to_host(unsigned sets) {
    if (m_exec) m_exec->to_host(sets);
  }
  void host_changed(unsigned sets) {
    if (m_exec) m_exec->host_changed(sets);
  }
  // Whether the host's copies are the state of every one of `sets` (no executor keeps any of them
  // on its device): a reader that only wants them when they cost no copy asks this first.
  bool host_holds(unsigned sets) const { return !m_exec || (m_exec->resident() & sets) == 0; }
  // Gradients on the device (executor.h: keep_grads): parameter i's there, or nullptr where the
  // host's Param::grad holds it.
  float* device_grad(size_t i) { return m_exec ? m_exec->device_grad(i) : nullptr; }
  // Whether parameter i's gradient is finite, wherever it lives.
  bool grad_finite(size_t i);
  // The first of `order` (parameter indices) whose gradient is NaN or infinite, wherever they
  // live, those on the device answered in one piece (DeviceMemory::first_nonfinite); -1 when
  // every one is finite.
  int first_nonfinite_grad(const std::vector<int>& order);

 private:
  std::vector<std::unique_ptr<Module>> m_modules;
  // The fused BatchNorm2d -> ReLU -> MaxPool2d at module i (the BatchNorm) when module i + 2 is
  // the end of a run computed by it in the last forward (m_fused_end[i + 2] == i).
  // (within the last forward's range: the run ends before m_end)
  bool fused_at(size_t i) const;
  // Runs module i on `in`, or the fused run that starts there; returns the index of the last
  // module computed, whose output is m_acts[last].
  size_t forward_step(size_t i, const Tensor& in, Mode mode);
  // backward()'s walk from module m_end - 1 down to `stop` (dy: the gradient of that module's output).
  void backward_modules(const Tensor& dy, const ParamLayout& layout, size_t stop,
                        const std::function<void(int)>& on_param_ready);
  size_t m_begin = 0, m_end = 0;  // the last forward's module range
  bool m_fusion = true;
  Autocast m_autocast = Autocast::None;
  std::vector<char> m_lower_precision;  // per module: on the lower_precision_fp list (Linear, Conv2d)
  std::vector<std::unique_ptr<BnReluPool>> m_fused;  // per module index, created on first use
  std::vector<int> m_fused_end;                      // per module index: -1 or the run's first module
  std::vector<Tensor> m_acts;  // m_acts[i] = output of module i (unset inside a fused run)
  std::vector<Tensor> m_grads;
  Tensor m_dloss;                 // forward_loss's gradient on the host (none when the device keeps it)
  bool m_loss_on_device = false;  // the last forward_loss ran on the executor
  const Tensor* m_input = nullptr;
  std::unique_ptr<ModelExecutor> m_exec;
  const ModuleHooks* m_hooks = nullptr;
  // Modules below this one still hold what the last Train forward saved for backward (backward
  // releases them as it goes, as autograd frees a node's saved tensors once it has run): the
  // module count after a Train forward, 0 once backward is done or after an Eval forward.
  size_t m_saved_upto = 0;
};

struct ModelOptions {
  std::string name = "cnn";  // "mlp" | "cnn"
  BatchNormOptions bn;       // eps / momentum / track_running_stats for every BN layer
  // Where the architecture has a BatchNorm layer (features, 0 for 1d or 2 for 2d): when given,
  // the module this returns instead (nullptr: none there). `bench train --batchnorm frozen|none`
  // measures the same architecture with its BatchNorm frozen or left out. BatchNorm draws nothing
  // from the generator, so every other layer's initial weights stay the same.
  std::function<std::unique_ptr<Module>(int features, int spatial_dims)> make_batchnorm;
};

// The model named opt.name, initialized as PyTorch does after torch.manual_seed(seed).
// Throws ConfigError for an unknown name.
std::unique_ptr<Model> build_model(const ModelOptions& opt, uint64_t seed);
// Copies values of every parameter and buffer (not gradients) from src into dst (same model).
void copy_state(Model& src, Model& dst);

// Parameter names in params() order (state_dict's names: "1.weight").
std::vector<std::string> param_names(Model& model);
// The state_dict names of `params` (some of model's parameters), each after `prefix` ("tp.").
std::vector<std::string> param_names(Model& model, const std::vector<Param*>& params, const std::string& prefix);
// Elements of every parameter, in params() order.
std::vector<int64_t> param_numels(Model& model);

}  // namespace lab
