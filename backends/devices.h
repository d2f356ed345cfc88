// The device backends of this build for lab/nn/executor.h: the dtlab executable's main() calls
// lab::set_executor_factory(lab::make_executor) once, so that --device cuda reaches the GPU
// backend (backends/cuda) when the build has one, and says clearly why not when it does not.
// With the GPU backend built, the executor lives in libdtlab_cuda_exec.so next to the executable,
// loaded (dlopen) the first time a run asks for the GPU: a CPU run never maps cuBLAS and cuDNN
// (about 600 MB of libraries, 50 ms and 200 MB of resident pages at every start).
#pragma once

#include <memory>

#include "executor.h"

namespace lab {

// The executor of `model` for rank `rank` on opt.device (never "cpu": the CPU needs none): the
// simulated GPU (backends/sim) for "sim", in every build.
// Throws DeviceError: a build without the GPU backend (naming why it was left out), no driver or
// no GPU (the probe's reason), a device index the machine does not have.
std::unique_ptr<ModelExecutor> make_executor(Model& model, const ComputeOptions& opt, int rank);

}  // namespace lab
