// The entry point of libdtlab_cuda_exec.so, the module backends/devices.cpp loads for --device cuda
// (CMakeLists.txt says why it is a module). One C symbol, so that dlsym finds it by name; C++
// exceptions (DeviceError, ConfigError) pass through it to the caller, which shares their types.
#include "cuda_executor.h"

extern "C" __attribute__((visibility("default"))) lab::ModelExecutor* dtlab_cuda_new_executor(
    lab::Model* model, const lab::ComputeOptions* opt, int rank) {
  return lab::cuda::make_cuda_executor(*model, *opt, rank).release();
}
