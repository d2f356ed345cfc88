// Model: a Sequential of modules with PyTorch's state_dict names ("1.weight", "2.running_mean").
// build_model("mlp"|"cnn") gives the reference models of shared/peers/torch_peer.py, initialized
// like `torch.manual_seed(seed); model = mlp()` (bit for bit, via TorchGenerator).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "batchnorm.h"
#include "bn_relu_pool.h"
#include "module.h"

namespace lab {

// One entry of the state dict: exactly one of param / buffer is set.
struct StateEntry {
  std::string name;  // "1.weight"
  Param* param = nullptr;
  Buffer* buffer = nullptr;
};

class Model {
 public:
  Model() = default;
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  void add(std::unique_ptr<Module> m) { m_modules.push_back(std::move(m)); }
  size_t size() const { return m_modules.size(); }
  Module& module(size_t i) { return *m_modules[i]; }

  // logits = model(x). x: (N, 1, 28, 28); logits: (N, 10).
  const Tensor& forward(const Tensor& x, Mode mode);
  // Backpropagates dlogits (N, 10) through the last Train forward. Parameter gradients are
  // accumulated (+=). on_param_ready(i) is called for parameter index i (params() order) as soon
  // as its gradient is final for this backward, which happens in reverse order: the hook DDP's
  // bucketing uses to start an allreduce during backward.
  void backward(const Tensor& dlogits, const std::function<void(int)>& on_param_ready = {});

  std::vector<Param*> params();          // registration order
  std::vector<StateEntry> state_dict();  // params and buffers, PyTorch's order and names
  std::vector<BatchNorm*> batchnorms();
  std::vector<int> batchnorm_module_index();  // module index of each BatchNorm ("2" in "2.weight")
  void zero_grad();
  std::string describe() const;          // "Sequential(Flatten(), Linear(784, 256), ...)"
  // BatchNorm2d -> ReLU -> MaxPool2d(2) runs as one fused layer (bn_relu_pool.h) when on (the
  // default); off runs the three modules, the reference the fused path is tested against.
  void set_fusion(bool on) { m_fusion = on; }
  // Floating-point operations of one training step per sample in the matrix products (forward,
  // weight gradients, and input gradients except for the first layer with parameters, which
  // needs none): 2 x multiply-adds, the usual count for a roofline. sample_shape: (1, 28, 28).
  // Runs one eval-mode forward of a zero sample (no buffer changes) to learn every layer's input.
  int64_t train_flops_per_sample(const std::vector<int64_t>& sample_shape);

 private:
  std::vector<std::unique_ptr<Module>> m_modules;
  // The fused BatchNorm2d -> ReLU -> MaxPool2d at module i (the BatchNorm) when module i + 2 is
  // the end of a run computed by it in the last forward (m_fused_end[i + 2] == i).
  bool fused_at(size_t i) const;
  bool m_fusion = true;
  std::vector<std::unique_ptr<BnReluPool>> m_fused;  // per module index, created on first use
  std::vector<int> m_fused_end;                      // per module index: -1 or the run's first module
  std::vector<Tensor> m_acts;  // m_acts[i] = output of module i (unset inside a fused run)
  std::vector<Tensor> m_grads;
  const Tensor* m_input = nullptr;
};

struct ModelOptions {
  std::string name = "cnn";  // "mlp" | "cnn"
  BatchNormOptions bn;       // eps / momentum / track_running_stats for every BN layer
};

// The model named opt.name, initialized as PyTorch does after torch.manual_seed(seed).
// Throws ConfigError for an unknown name.
std::unique_ptr<Model> build_model(const ModelOptions& opt, uint64_t seed);
// Copies values of every parameter and buffer (not gradients) from src into dst (same model).
void copy_state(Model& src, Model& dst);

}  // namespace lab
