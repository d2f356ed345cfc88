// CudaContext: one rank's compute context on one GPU: the device, a stream, a cuBLAS handle and a
// cuDNN handle bound to that stream, and a workspace that grows on demand. One per rank (thread or
// process); nothing in it is shared between ranks. Every op of cuda_ops.h, cuda_gemm.h and
// cuda_conv.h queues its work on the context's stream and returns without waiting.
//
// Numerics, mirroring PyTorch's switches (torch.backends.*):
//   matmul_tf32   (cuda.matmul.allow_tf32, PyTorch's default False): cuBLAS sgemm in IEEE fp32
//                 (CUBLAS_DEFAULT_MATH, or CUBLAS_PEDANTIC_MATH with gemm_pedantic) unless set.
//   conv_tf32     (cudnn.allow_tf32, PyTorch's default True; ours False): cuDNN convolutions with
//                 CUDNN_FMA_MATH (fp32 FMA kernels only) unless set, as PyTorch does when False.
//   cudnn_benchmark / cudnn_deterministic (cudnn.benchmark / cudnn.deterministic): how
//                 convolution algorithms are chosen (cuda_conv.h).
// cuBLAS atomics stay off (CUBLAS_ATOMICS_NOT_ALLOWED): with one stream per handle its results
// are reproducible run to run.
//
// Threads: CUDA's current device is per thread. Construct the context on the thread that uses it,
// or call make_current() first on another thread.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <cstddef>
#include <string>
#include <vector>

#include "device_buffer.h"

namespace lab::cuda {

struct CudaContextOptions {
  int device = 0;
  bool matmul_tf32 = false;
  bool gemm_pedantic = false;   // CUBLAS_PEDANTIC_MATH: no reduced-precision shortcuts at all
  bool conv_tf32 = false;
  bool cudnn_benchmark = false;
  bool cudnn_deterministic = false;
  size_t workspace_limit = size_t{256} << 20;  // bytes a convolution algorithm may use
};

// The convolution algorithms a layer chose (cuda_conv.h), kept for the run's events.
struct ConvAlgoRecord {
  std::string layer;     // "conv (64, 32, 14, 14) k3 p1 -> 64"
  std::string pass;      // "forward", "backward_data", "backward_filter"
  std::string algo;      // "CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM"
  std::string how;       // "heuristic", "benchmark", "forced"
  bool deterministic = true;
  std::string math;      // "FMA" or "TF32"
  size_t workspace = 0;  // bytes
  float time_ms = -1.0f; // measured by cudnnFind (benchmark), else -1
};

class CudaContext {
 public:
  // Selects the device, creates the stream and the handles. Throws DeviceError (no driver, no such
  // device, a library that does not start), with the probe's reason when there is no GPU.
  explicit CudaContext(const CudaContextOptions& options = {});
  ~CudaContext();
  CudaContext(const CudaContext&) = delete;
  CudaContext& operator=(const CudaContext&) = delete;

  const CudaContextOptions& options() const { return m_opt; }
  int device() const { return m_opt.device; }
  cudaStream_t stream() const { return m_stream; }
  cublasHandle_t cublas() const { return m_cublas; }
  cudnnHandle_t cudnn() const { return m_cudnn; }

  // Makes this context's device current on the calling thread.
  void make_current() const;
  // Waits for all work queued on the stream; throws DeviceError for an error in that work.
  void synchronize() const;
  // Scratch of at least `bytes`, valid until the next call (ops on the stream run in order, so one
  // op's workspace is free again when the next op starts).
  void* workspace(size_t bytes);

  // The convolution algorithms chosen so far, in order.
  const std::vector<ConvAlgoRecord>& conv_algorithms() const { return m_conv_algos; }
  void record_conv_algorithm(ConvAlgoRecord r) { m_conv_algos.push_back(std::move(r)); }

 private:
  CudaContextOptions m_opt;
  cudaStream_t m_stream = nullptr;
  cublasHandle_t m_cublas = nullptr;
  cudnnHandle_t m_cudnn = nullptr;
  DeviceBuffer<unsigned char> m_workspace;
  std::vector<ConvAlgoRecord> m_conv_algos;
};

}  // namespace lab::cuda
