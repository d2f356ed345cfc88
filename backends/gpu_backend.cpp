// The GPU backend as the registry reports it (backends.h). With CUDA the probe lives in
// backends/cuda (dtlab_cuda_probe); without it this file says why there is none.
#include "backends.h"

#ifdef DTLAB_HAVE_CUDA
#include "cuda/cuda_device.h"
#endif

namespace lab {

std::vector<std::string> gpu_backend_report() {
#ifdef DTLAB_HAVE_CUDA
  return cuda::cuda_backend_report();
#else
#ifndef DTLAB_CUDA_OFF_REASON
#define DTLAB_CUDA_OFF_REASON "this build has no CUDA"
#endif
  return {std::string("GPU backend: not built (") + DTLAB_CUDA_OFF_REASON + ")"};
#endif
}

}  // namespace lab
