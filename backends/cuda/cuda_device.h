// The device probe of the GPU backend: which GPUs this process sees, or why it sees none, and which
// CUDA, cuBLAS, cuDNN and NCCL versions the build was made with and the loader found. Plain C++ (no
// CUDA header), so that front ends can print it; it needs only the CUDA runtime, cuDNN's and
// NCCL's small front libraries (cuBLAS, whose libraries weigh 600 MB, is reported from its header).
//
// Supports: any number of devices, a machine without a driver or without a GPU (the probe never
// throws; it says why). Does not: pick a device for a run (that is CudaContext's job).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace lab::cuda {

struct CudaDeviceInfo {
  int index = 0;
  std::string name;          // "NVIDIA H100 80GB HBM3"
  int cc_major = 0, cc_minor = 0;  // compute capability, e.g. 9.0
  size_t total_memory = 0;   // bytes
  int multiprocessors = 0;
};

struct CudaProbe {
  int runtime_version = 0;  // cudaRuntimeGetVersion: 13000 for 13.0
  int driver_version = 0;   // cudaDriverGetVersion: the newest CUDA the driver supports; 0: no driver
  std::vector<CudaDeviceInfo> devices;
  // Why there are no devices, e.g. "no CUDA driver: cudaGetDeviceCount returned
  // cudaErrorInsufficientDriver (CUDA driver version is insufficient for CUDA runtime version)".
  std::string reason;
  std::string hint;  // what to check, for a typed error built from a failed probe
  bool ok() const { return !devices.empty(); }
};

// Asks the CUDA runtime. Never throws; cheap after the first call in a process (the runtime caches
// its own initialization).
CudaProbe cuda_devices();

// "13.0" from 13000 (CUDA's version encoding, also the driver's).
std::string cuda_version_string(int version);

// Versions of the libraries: built = the headers this build was compiled with, loaded = what the
// loader found at run time (empty where not asked: cuBLAS).
struct CudaLibraryVersions {
  std::string cuda_built, cuda_runtime;  // "13.0"
  std::string cublas_built;              // "13.1.0"
  std::string cudnn_built, cudnn_loaded; // "9.19.0"
  std::string nccl_built, nccl_loaded;   // "2.28.9"
  std::string architectures;             // "sm_80, sm_90": the GPU code compiled into this build
};
CudaLibraryVersions cuda_library_versions();

// What `dtlab version` prints about the GPU backend, one line each:
//   "GPU backend: CUDA 13.0 (sm_80, sm_90), cuBLAS 13.1.0, cuDNN 9.19.0, NCCL 2.28.9"
//   "GPU devices: none (no CUDA driver: cudaGetDeviceCount returned ...)"  or
//   "GPU 0: NVIDIA H100 80GB HBM3 (compute capability 9.0, 79.2 GiB, 132 SMs), driver CUDA 13.0"
std::vector<std::string> cuda_backend_report();

}  // namespace lab::cuda
