// Module: one layer of a Sequential model, with PyTorch's names for parameters and buffers.
// A module keeps what its backward needs from the last training forward (its "saved tensors").
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tensor.h"

namespace lab {

enum class Mode { Train, Eval };

// torch.autocast("cpu", dtype=torch.bfloat16) for eval-mode forwards (Model::set_autocast). BF16:
// the modules whose op is on PyTorch's CPU lower_precision_fp list (Linear, Conv2d) compute from
// bf16-rounded operands and return bf16 (rounded) outputs; every other module runs in its input's
// dtype, so the model rounds its output to bf16 when its input was bf16.
enum class Autocast { None, BF16 };

// A learnable parameter and its gradient (same shape). name is the local name ("weight", "bias").
struct Param {
  std::string name;
  Tensor value;
  Tensor grad;
};

// A buffer: float ("running_mean") or int64 ("num_batches_tracked", stored in i64).
struct Buffer {
  std::string name;
  Tensor value;          // float buffers
  bool is_int64 = false; // then the value is i64 and `value` is empty
  int64_t i64 = 0;
};

class Module {
 public:
  virtual ~Module() = default;
  // PyTorch's class name, e.g. "Linear", "BatchNorm2d".
  virtual std::string kind() const = 0;
  // Human-readable constructor echo, e.g. "Linear(784, 256)".
  virtual std::string describe() const = 0;
  // y = f(x). In Train mode, saves what backward needs.
  virtual void forward(const Tensor& x, Tensor& y, Mode mode) = 0;
  // Accumulates (+=) parameter gradients from dy; writes dx if dx != nullptr (the first layer
  // of a model needs no dx). Must follow a Train-mode forward with no other forward in between:
  // modules reuse their scratch (im2col columns, argmax indices, masks) in every forward.
  virtual void backward(const Tensor& dy, Tensor* dx) = 0;
  // Parameters and buffers in PyTorch's registration order (state_dict order).
  virtual std::vector<Param*> params() { return {}; }
  virtual std::vector<Buffer*> buffers() { return {}; }
  // Multiply-adds of one sample's forward through the layer's matrix products (Linear, Conv2d;
  // 0 for the elementwise layers), given the input shape of a batch of one: (1, ...).
  virtual int64_t forward_macs(const std::vector<int64_t>& /*in_shape*/) const { return 0; }
  // Autocast (above). A module on the lower_precision_fp list overrides this, uses bf16 operands
  // in its eval-mode forward from now on and returns true: its outputs are bf16. The others keep
  // the default: they ignore it and run in their input's dtype.
  virtual bool set_autocast(Autocast) { return false; }
  // Bytes the last Train forward saved for backward (inputs, masks, indices; memory.h's
  // "activations"), not counting the module's output, which the model keeps.
  virtual int64_t saved_bytes() const { return 0; }
};

}  // namespace lab
