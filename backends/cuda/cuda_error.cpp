#include "cuda_error.h"

#include <cstring>

namespace lab::cuda {

namespace {

// "cudaMalloc(&p, bytes) failed: cudaErrorMemoryAllocation (out of memory) [device_buffer.h:40]"
std::string message(const char* call, const std::string& status, const char* file, int line) {
  const char* slash = std::strrchr(file, '/');
  return std::string(call) + " failed: " + status + " [" + (slash ? slash + 1 : file) + ":" + std::to_string(line) + "]";
}

constexpr const char* kBugHint =
    "an argument is wrong (a null or host pointer, a size or leading dimension past the buffer): a bug in "
    "dtlab, please report it with the command line";
constexpr const char* kKernelHint =
    "a kernel failed and the GPU context is unusable now; run the op tests under compute-sanitizer "
    "(tools/gpu_check.sh) to find the faulty access";
constexpr const char* kMemoryHint =
    "the GPU is out of memory: try a smaller batch, or see with `nvidia-smi` which process holds the memory";

}  // namespace

void throw_cuda(cudaError_t e, const char* call, const char* file, int line) {
  cudaGetLastError();  // a non-sticky error is consumed; a sticky one stays and every later call fails too
  const std::string status = std::string(cudaGetErrorName(e)) + " (" + cudaGetErrorString(e) + ")";
  std::string hint;
  switch (e) {
    case cudaErrorInsufficientDriver:
      hint = "no NVIDIA driver, or one older than this build's CUDA runtime: check `nvidia-smi`";
      break;
    case cudaErrorNoDevice:
    case cudaErrorInvalidDevice:
      hint = "no such GPU: check `nvidia-smi` and CUDA_VISIBLE_DEVICES";
      break;
    case cudaErrorMemoryAllocation:
      hint = kMemoryHint;
      break;
    case cudaErrorNoKernelImageForDevice:
    case cudaErrorUnsupportedPtxVersion:
      hint = "this build has no GPU code for this device: rebuild with -DCMAKE_CUDA_ARCHITECTURES set to its compute "
             "capability (e.g. 90 for an H100; `dtlab version` shows it)";
      break;
    case cudaErrorInvalidValue:
    case cudaErrorInvalidDevicePointer:
    case cudaErrorInvalidMemcpyDirection:
    case cudaErrorInvalidConfiguration:
    case cudaErrorInvalidResourceHandle:
      hint = kBugHint;
      break;
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
    case cudaErrorMisalignedAddress:
    case cudaErrorIllegalInstruction:
    case cudaErrorAssert:
      hint = kKernelHint;
      break;
    default:
      hint = "set CUDA_LAUNCH_BLOCKING=1 to see an asynchronous error at the call that caused it";
  }
  throw DeviceError(message(call, status, file, line), hint);
}

std::string cublas_status_name(cublasStatus_t s) { return cublasGetStatusName(s); }

void throw_cublas(cublasStatus_t s, const char* call, const char* file, int line) {
  const std::string status = cublas_status_name(s) + " (" + cublasGetStatusString(s) + ")";
  std::string hint;
  switch (s) {
    case CUBLAS_STATUS_NOT_INITIALIZED:
      hint = "cuBLAS could not start: no usable GPU, or its libraries (libcublas, libcublasLt) are missing";
      break;
    case CUBLAS_STATUS_ALLOC_FAILED:
      hint = kMemoryHint;
      break;
    case CUBLAS_STATUS_INVALID_VALUE:
      hint = kBugHint;
      break;
    case CUBLAS_STATUS_ARCH_MISMATCH:
    case CUBLAS_STATUS_NOT_SUPPORTED:
      hint = "this GPU does not support the requested cuBLAS mode (TF32 needs compute capability 8.0 or later)";
      break;
    case CUBLAS_STATUS_EXECUTION_FAILED:
      hint = kKernelHint;
      break;
    default:
      hint = "set CUDA_LAUNCH_BLOCKING=1 to see an asynchronous error at the call that caused it";
  }
  throw DeviceError(message(call, status, file, line), hint);
}

void throw_cudnn(cudnnStatus_t s, const char* call, const char* file, int line) {
  std::string status = cudnnGetErrorString(s);
  // cuDNN 9 keeps a longer explanation of the last failure on this thread.
  char detail[512] = {};
  cudnnGetLastErrorString(detail, sizeof detail);
  if (detail[0] != '\0') status += ": " + std::string(detail);
  std::string hint;
  switch (static_cast<int>(s) / 1000) {
    case 1:
      hint = s == CUDNN_STATUS_SUBLIBRARY_LOADING_FAILED || s == CUDNN_STATUS_SUBLIBRARY_VERSION_MISMATCH
                 ? "cuDNN could not load its sub-libraries (libcudnn_*.so.9) of the same version: put their folder on "
                   "LD_LIBRARY_PATH (tools/gpu_check.sh finds PyTorch's nvidia/cudnn/lib)"
                 : "cuDNN could not start: check `nvidia-smi` and that the driver is new enough for this cuDNN";
      break;
    case 2:
      hint = kBugHint;
      break;
    case 3:
      hint = "cuDNN does not support this convolution with the chosen algorithm or math mode on this GPU: try "
             "another algorithm choice (heuristic, benchmark or deterministic)";
      break;
    case 4:
      hint = s == CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED ? kMemoryHint
                                                                         : "an internal cuDNN error: note the versions "
                                                                           "`dtlab version` prints and report it";
      break;
    default:
      hint = kKernelHint;
  }
  throw DeviceError(message(call, status, file, line), hint);
}

void throw_nccl(ncclResult_t r, const char* call, const char* file, int line) {
  std::string status = ncclGetErrorString(r);
  const char* last = ncclGetLastError(nullptr);
  if (last && *last) status += ": " + std::string(last);
  std::string hint;
  switch (r) {
    case ncclUnhandledCudaError:
      hint = kKernelHint;
      break;
    case ncclSystemError:
      hint = "a system call failed (shared memory, sockets): NCCL_DEBUG=INFO says which";
      break;
    case ncclInvalidArgument:
    case ncclInvalidUsage:
      hint = "NCCL refused the call; two ranks of one communicator on the same GPU are refused (\"Duplicate GPU\") "
             "before NCCL 2.30: use one rank per GPU. NCCL_DEBUG=WARN says more";
      break;
    case ncclRemoteError:
      hint = "a peer rank failed or went away";
      break;
    default:
      hint = "NCCL_DEBUG=INFO says more";
  }
  throw DeviceError(message(call, status, file, line), hint);
}

}  // namespace lab::cuda
