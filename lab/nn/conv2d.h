// Conv2d: nn.Conv2d(cin, cout, k, stride=1, padding=p, bias) over NCHW, via im2col + sgemm.
//   x: (N, Cin, H, W) -> y: (N, Cout, Ho, Wo), Ho = H + 2p - k + 1, Wo = W + 2p - k + 1
//   weight: (Cout, Cin, k, k), bias: (Cout,)
// Supports: square kernels, stride 1, zero padding, no dilation or groups (what the lab's models
// use). The whole batch is unfolded into one column matrix so that each layer is one large gemm
// per pass instead of N small ones; scratch tensors are members and only grow.
#pragma once

#include "module.h"
#include "torch_rng.h"

namespace lab {

class Conv2d : public Module {
 public:
  Conv2d(int in_channels, int out_channels, int kernel_size, int padding = 0, bool bias = true);
  std::string kind() const override { return "Conv2d"; }
  std::string describe() const override;
  // x: (N, Cin, H, W) -> y: (N, Cout, Ho, Wo)
  void forward(const Tensor& x, Tensor& y, Mode mode) override;
  // dy: (N, Cout, Ho, Wo) -> dx: (N, Cin, H, W)
  void backward(const Tensor& dy, Tensor* dx) override;
  int64_t saved_bytes() const override { return m_x.numel() * 4; }
  std::vector<Param*> params() override;
  // Cout * Cin * k * k per output pixel
  int64_t forward_macs(const std::vector<int64_t>& in_shape) const override;
  // Autocast BF16 (eval forwards only): y = bf16(conv(bf16(x), bf16(W)) + bf16(b)), the products
  // summed and the bias added in float32 (PyTorch's bf16 convolution; gemm_bf16.h).
  bool set_autocast(Autocast a) override {
    m_autocast = a;
    return true;
  }

  // nn.Conv2d.reset_parameters: kaiming_uniform_ with fan_in = Cin*k*k, then the bias.
  void reset_parameters(TorchGenerator& g);
  Param& weight() { return m_weight; }
  Param& bias() { return m_bias; }
  int in_channels() const { return m_cin; }
  int out_channels() const { return m_cout; }
  int kernel_size() const { return m_k; }
  int padding() const { return m_pad; }
  bool has_bias() const { return m_has_bias; }

 private:
  int m_cin, m_cout, m_k, m_pad;
  bool m_has_bias;
  Autocast m_autocast = Autocast::None;
  Param m_weight, m_bias;
  // Samples whose weight gradients are summed together before the blocks are added in order.
  static constexpr int kSamplesPerBlock = 8;
  std::vector<int64_t> m_in_shape;  // (N, Cin, H, W) of the last forward
  Tensor m_x;          // (N, Cin, H, W): the last forward's input, unfolded again by backward
  struct Scratch {
    Tensor cols;   // (Cin*k*k, Ho*Wo): one sample's unfolded input
    Tensor dcols;  // (Cin*k*k, Ho*Wo): its gradient, folded back into dx
    Tensor dw;     // (Cout, Cin*k*k): --nondeterministic: one partial's weight gradient
    std::vector<double> db;  // (Cout,): ... and its bias gradient
  };
  std::vector<Scratch> m_scratch;  // one per compute thread (parallel.h)
  Tensor m_dw_blocks;  // (blocks, Cout, Cin*k*k): weight gradient of each block of samples
  // --nondeterministic (parallel.h: arrival_order): backward with the parameter gradients added
  // partial by partial, in a drawn order (atomically with several compute threads).
  void backward_in_arrival_order(const Tensor& dy, Tensor* dx);
  std::vector<int64_t> m_order;
};

// The plain 7-loop convolution, the readable reference the im2col path is tested against.
//   x: (N, Cin, H, W), weight: (Cout, Cin, k, k), bias: (Cout,) or nullptr -> y: (N, Cout, Ho, Wo)
void conv2d_forward_naive(const Tensor& x, const Tensor& weight, const float* bias, int padding, Tensor& y);

}  // namespace lab
