#include "cuda_device.h"

#include <cuda_runtime.h>
#include <cublas_api.h>  // CUBLAS_VER_*: the header only; the probe does not load cuBLAS
#include <cudnn.h>
#include <nccl.h>

#include <cstdio>
#include <cstdlib>

namespace lab::cuda {

namespace {

std::string three_part(int major, int minor, int patch) {
  return std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(patch);
}

// cuDNN 9 encodes major * 10000 + minor * 100 + patch; NCCL >= 2.9 the same.
std::string decode_10000(int v) { return three_part(v / 10000, (v / 100) % 100, v % 100); }

std::string cuda_error_text(cudaError_t e) {
  return std::string(cudaGetErrorName(e)) + " (" + cudaGetErrorString(e) + ")";
}

std::string gib(size_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f GiB", static_cast<double>(bytes) / (1024.0 * 1024.0 * 1024.0));
  return buf;
}

}  // namespace

std::string cuda_version_string(int version) {
  if (version <= 0) return "none";
  return std::to_string(version / 1000) + "." + std::to_string((version % 1000) / 10);
}

CudaProbe cuda_devices() {
  CudaProbe p;
  cudaRuntimeGetVersion(&p.runtime_version);
  if (cudaDriverGetVersion(&p.driver_version) != cudaSuccess) p.driver_version = 0;
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    count = 0;
    const std::string what = "cudaGetDeviceCount returned " + cuda_error_text(e);
    if (e == cudaErrorInsufficientDriver && p.driver_version == 0) {
      p.reason = "no CUDA driver: " + what;
      p.hint = "this machine has no NVIDIA driver (libcuda.so.1); on a GPU machine, install the driver and check "
               "that `nvidia-smi` lists the GPU";
    } else if (e == cudaErrorInsufficientDriver) {
      p.reason = "the CUDA driver supports CUDA " + cuda_version_string(p.driver_version) + ", older than this build's "
                 "runtime " + cuda_version_string(p.runtime_version) + ": " + what;
      p.hint = "update the NVIDIA driver, or build dtlab with a CUDA toolkit the driver supports";
    } else if (e == cudaErrorNoDevice) {
      const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
      p.reason = "no GPU: " + what + (visible ? " (CUDA_VISIBLE_DEVICES=" + std::string(visible) + ")" : "");
      p.hint = "check `nvidia-smi` and CUDA_VISIBLE_DEVICES";
    } else {
      p.reason = "the CUDA runtime cannot start: " + what;
      p.hint = "check `nvidia-smi`; a driver/kernel-module mismatch needs a reboot";
    }
    cudaGetLastError();  // reset the runtime's last error, so that later calls start clean
    return p;
  }
  if (count == 0) {
    p.reason = "no GPU: cudaGetDeviceCount found 0 devices";
    p.hint = "check `nvidia-smi` and CUDA_VISIBLE_DEVICES";
    return p;
  }
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp prop{};
    const cudaError_t pe = cudaGetDeviceProperties(&prop, i);
    if (pe != cudaSuccess) {
      p.devices.clear();
      p.reason = "cudaGetDeviceProperties(" + std::to_string(i) + ") returned " + cuda_error_text(pe);
      p.hint = "check `nvidia-smi`";
      cudaGetLastError();
      return p;
    }
    CudaDeviceInfo d;
    d.index = i;
    d.name = prop.name;
    d.cc_major = prop.major;
    d.cc_minor = prop.minor;
    d.total_memory = prop.totalGlobalMem;
    d.multiprocessors = prop.multiProcessorCount;
    p.devices.push_back(d);
  }
  return p;
}

CudaLibraryVersions cuda_library_versions() {
  CudaLibraryVersions v;
  v.cuda_built = cuda_version_string(CUDART_VERSION);
  int rt = 0;
  cudaRuntimeGetVersion(&rt);
  v.cuda_runtime = cuda_version_string(rt);
  v.cublas_built = three_part(CUBLAS_VER_MAJOR, CUBLAS_VER_MINOR, CUBLAS_VER_PATCH);
  v.cudnn_built = three_part(CUDNN_MAJOR, CUDNN_MINOR, CUDNN_PATCHLEVEL);
  v.cudnn_loaded = decode_10000(static_cast<int>(cudnnGetVersion()));
  v.nccl_built = three_part(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH);
  int nccl = 0;
  if (ncclGetVersion(&nccl) == ncclSuccess) v.nccl_loaded = decode_10000(nccl);
#ifdef DTLAB_CUDA_ARCHITECTURES
  v.architectures = DTLAB_CUDA_ARCHITECTURES;  // "sm_80, sm_90", from CMAKE_CUDA_ARCHITECTURES
#endif
  return v;
}

std::vector<std::string> cuda_backend_report() {
  const CudaLibraryVersions v = cuda_library_versions();
  auto with_loaded = [](const std::string& built, const std::string& loaded) {
    return loaded.empty() || loaded == built ? built : built + " (loaded " + loaded + ")";
  };
  std::vector<std::string> lines;
  lines.push_back("GPU backend: CUDA " + with_loaded(v.cuda_built, v.cuda_runtime) +
                  (v.architectures.empty() ? "" : " (" + v.architectures + ")") + ", cuBLAS " + v.cublas_built +
                  ", cuDNN " + with_loaded(v.cudnn_built, v.cudnn_loaded) + ", NCCL " +
                  with_loaded(v.nccl_built, v.nccl_loaded));
  const CudaProbe p = cuda_devices();
  if (!p.ok()) {
    lines.push_back("GPU devices: none (" + p.reason + ")");
    return lines;
  }
  for (const CudaDeviceInfo& d : p.devices) {
    lines.push_back("GPU " + std::to_string(d.index) + ": " + d.name + " (compute capability " +
                    std::to_string(d.cc_major) + "." + std::to_string(d.cc_minor) + ", " + gib(d.total_memory) + ", " +
                    std::to_string(d.multiprocessors) + " SMs), driver CUDA " + cuda_version_string(p.driver_version));
  }
  return lines;
}

}  // namespace lab::cuda
