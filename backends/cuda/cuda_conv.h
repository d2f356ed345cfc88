// CudnnConv2d: one convolution layer's cuDNN descriptors and chosen algorithms, for nn.Conv2d
// with square kernels, stride 1, zero padding, no dilation or groups (lab/nn/conv2d.h), NCHW float.
//   x: (N, Cin, H, W), w: (Cout, Cin, k, k), y: (N, Cout, Ho, Wo), Ho = H + 2p - k + 1
// The bias is not cuDNN's: cuda_ops.h's bias_add / bias_grad, as the CPU layer adds it separately.
//
// Algorithm choice, per pass, mirrors PyTorch's (aten/src/ATen/native/cudnn/Conv_v7.cpp):
//   default (cudnn.benchmark False): cuDNN's heuristic ranking (cudnnGet*Algorithm_v7), the first
//     candidate that succeeds within the context's workspace limit;
//   cudnn_benchmark: cudnnFind*Algorithm times every candidate on this shape and takes the fastest
//     (so two processes may choose differently: the lesson of non-determinism across runs);
//   cudnn_deterministic: only candidates cuDNN reports as CUDNN_DETERMINISTIC (its header marks
//     BWD_DATA_ALGO_0 and BWD_FILTER_ALGO_0 / _3 as non-deterministic: they add with atomics);
//   forced (ConvAlgoForce): exactly that algorithm, e.g. a non-deterministic one for the lesson.
// Without conv_tf32 the descriptor's math type is CUDNN_FMA_MATH (fp32 FMA kernels only), as
// PyTorch sets it when allow_tf32 is False. Each choice is recorded in the context
// (CudaContext::conv_algorithms) so that a run can report it.
#pragma once

#include <cudnn.h>

#include <string>

#include "cuda_context.h"

namespace lab::cuda {

struct Conv2dShape {
  int n = 0, cin = 0, h = 0, w = 0;  // input (N, Cin, H, W)
  int cout = 0, k = 0, pad = 0;      // weight (Cout, Cin, k, k), zero padding on every side
  int ho() const { return h + 2 * pad - k + 1; }
  int wo() const { return w + 2 * pad - k + 1; }
};

// cuDNN algorithm enum values to use instead of choosing (-1: choose as the context says).
struct ConvAlgoForce {
  int forward = -1;          // cudnnConvolutionFwdAlgo_t
  int backward_data = -1;    // cudnnConvolutionBwdDataAlgo_t
  int backward_filter = -1;  // cudnnConvolutionBwdFilterAlgo_t
};

// "CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1"
std::string cudnn_fwd_algo_name(int algo);
std::string cudnn_bwd_data_algo_name(int algo);
std::string cudnn_bwd_filter_algo_name(int algo);

class CudnnConv2d {
 public:
  // Creates the descriptors and chooses the three algorithms (benchmark mode runs them). Throws
  // DeviceError when cuDNN refuses the shape or no algorithm qualifies.
  CudnnConv2d(CudaContext& ctx, const Conv2dShape& shape, const ConvAlgoForce& force = {});
  ~CudnnConv2d();
  CudnnConv2d(const CudnnConv2d&) = delete;
  CudnnConv2d& operator=(const CudnnConv2d&) = delete;

  const Conv2dShape& shape() const { return m_shape; }
  // x: (N, Cin, H, W), w: (Cout, Cin, k, k) -> y: (N, Cout, Ho, Wo) = conv(x, w)
  void forward(const float* x, const float* w, float* y);
  // w, dy: (N, Cout, Ho, Wo) -> dx: (N, Cin, H, W)
  void backward_data(const float* w, const float* dy, float* dx);
  // x, dy -> dw: (Cout, Cin, k, k) = beta * dw + dL/dw (beta 1: accumulate, as Module::backward)
  void backward_filter(const float* x, const float* dy, float* dw, float beta = 1.0f);

  const ConvAlgoRecord& forward_algo() const { return m_fwd_rec; }
  const ConvAlgoRecord& backward_data_algo() const { return m_bwd_data_rec; }
  const ConvAlgoRecord& backward_filter_algo() const { return m_bwd_filter_rec; }

 private:
  void choose(const ConvAlgoForce& force);
  void release() noexcept;  // destroys the descriptors made so far

  CudaContext& m_ctx;
  Conv2dShape m_shape;
  cudnnTensorDescriptor_t m_x = nullptr, m_y = nullptr;
  cudnnFilterDescriptor_t m_w = nullptr;
  // one convolution descriptor per pass: each carries the math type of its own algorithm
  cudnnConvolutionDescriptor_t m_fwd_conv = nullptr, m_bwd_data_conv = nullptr, m_bwd_filter_conv = nullptr;
  cudnnConvolutionFwdAlgo_t m_fwd_algo{};
  cudnnConvolutionBwdDataAlgo_t m_bwd_data_algo{};
  cudnnConvolutionBwdFilterAlgo_t m_bwd_filter_algo{};
  size_t m_fwd_ws = 0, m_bwd_data_ws = 0, m_bwd_filter_ws = 0;  // workspace bytes per pass
  ConvAlgoRecord m_fwd_rec, m_bwd_data_rec, m_bwd_filter_rec;
};

}  // namespace lab::cuda
