// Linear: nn.Linear(in_features, out_features, bias). y = x W^T + b.
//   x: (N, in), y: (N, out), weight: (out, in), bias: (out,)
#pragma once

#include "module.h"
#include "torch_rng.h"

namespace lab {

class Linear : public Module {
 public:
  Linear(int in_features, int out_features, bool bias = true);
  std::string kind() const override { return "Linear"; }
  std::string describe() const override;
  // x: (N, in) -> y: (N, out)
  void forward(const Tensor& x, Tensor& y, Mode mode) override;
  // dy: (N, out) -> dx: (N, in)
  void backward(const Tensor& dy, Tensor* dx) override;
  std::vector<Param*> params() override;
  int64_t forward_macs(const std::vector<int64_t>&) const override { return int64_t{m_in} * m_out; }
  // Autocast BF16 (eval forwards only): y = bf16(bf16(x) bf16(W)^T + bf16(b)), the products summed
  // and the bias added in float32 (PyTorch's bf16 addmm; gemm_bf16.h).
  bool set_autocast(Autocast a) override {
    m_autocast = a;
    return true;
  }

  // nn.Linear.reset_parameters: kaiming_uniform_(weight) then the bias, drawing from g in that
  // order, so a model built module by module consumes the generator exactly like PyTorch.
  void reset_parameters(TorchGenerator& g);
  Param& weight() { return m_weight; }
  Param& bias() { return m_bias; }
  int in_features() const { return m_in; }
  int out_features() const { return m_out; }
  bool has_bias() const { return m_has_bias; }
  int64_t saved_bytes() const override { return m_x.numel() * 4; }

 private:
  int m_in, m_out;
  bool m_has_bias;
  Autocast m_autocast = Autocast::None;
  Param m_weight, m_bias;
  Tensor m_x;  // (N, in): the last Train-mode input, for the weight gradient
  std::vector<double> m_bias_acc;  // (out,) scratch for the bias gradient's column sums
  // --nondeterministic (parallel.h: arrival_order): the weight and bias gradients as partial sums
  // over blocks of samples, added in a drawn order.
  void param_grads_in_drawn_order(const Tensor& dy);
  Tensor m_partial_w;  // (out, in): one block's weight gradient
  std::vector<float> m_partial_b;  // (out,): one block's bias gradient
  std::vector<int64_t> m_order;
};

}  // namespace lab
