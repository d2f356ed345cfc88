// Failed CUDA, cuBLAS, cuDNN and NCCL calls become lab::DeviceError (exit code kExitDevice): the
// message names the call, the library's own status name and string and where it was made; the hint
// says what to check. Every call into the four libraries goes through one of these macros:
//
//   DTLAB_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream));
//   -> "cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream) failed: cudaErrorInvalidValue
//       (invalid argument) [device_buffer.h:57]"
//      hint: "an argument is wrong (a null or host pointer, a size past the buffer) ..."
//
// Kernel launches are checked with DTLAB_CUDA_CHECK_LAUNCH() right after the launch (launch
// errors); errors inside a kernel surface at the next synchronizing call, which is checked too
// (CUDA_LAUNCH_BLOCKING=1 makes them surface at the launch).
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>
#include <nccl.h>

#include <string>

#include "errors.h"

namespace lab::cuda {

[[noreturn]] void throw_cuda(cudaError_t e, const char* call, const char* file, int line);
[[noreturn]] void throw_cublas(cublasStatus_t s, const char* call, const char* file, int line);
[[noreturn]] void throw_cudnn(cudnnStatus_t s, const char* call, const char* file, int line);
[[noreturn]] void throw_nccl(ncclResult_t r, const char* call, const char* file, int line);

// "CUBLAS_STATUS_INVALID_VALUE"
std::string cublas_status_name(cublasStatus_t s);

}  // namespace lab::cuda

#define DTLAB_CUDA_CHECK(call)                                                            \
  do {                                                                                    \
    const cudaError_t dtlab_status_ = (call);                                             \
    if (dtlab_status_ != cudaSuccess) ::lab::cuda::throw_cuda(dtlab_status_, #call, __FILE__, __LINE__); \
  } while (0)

#define DTLAB_CUDA_CHECK_LAUNCH() DTLAB_CUDA_CHECK(cudaGetLastError())

#define DTLAB_CUBLAS_CHECK(call)                                                          \
  do {                                                                                    \
    const cublasStatus_t dtlab_status_ = (call);                                          \
    if (dtlab_status_ != CUBLAS_STATUS_SUCCESS)                                           \
      ::lab::cuda::throw_cublas(dtlab_status_, #call, __FILE__, __LINE__);                \
  } while (0)

#define DTLAB_CUDNN_CHECK(call)                                                           \
  do {                                                                                    \
    const cudnnStatus_t dtlab_status_ = (call);                                           \
    if (dtlab_status_ != CUDNN_STATUS_SUCCESS)                                            \
      ::lab::cuda::throw_cudnn(dtlab_status_, #call, __FILE__, __LINE__);                 \
  } while (0)

#define DTLAB_NCCL_CHECK(call)                                                            \
  do {                                                                                    \
    const ncclResult_t dtlab_status_ = (call);                                            \
    if (dtlab_status_ != ncclSuccess) ::lab::cuda::throw_nccl(dtlab_status_, #call, __FILE__, __LINE__); \
  } while (0)
