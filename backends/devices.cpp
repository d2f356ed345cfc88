#include "devices.h"

#include "errors.h"
#include "sim/sim_executor.h"

#ifdef DTLAB_HAVE_CUDA
#include <dlfcn.h>
#include <unistd.h>

#include <climits>
#include <mutex>
#include <string>
#endif

namespace lab {

#ifdef DTLAB_HAVE_CUDA
namespace {

using NewExecutor = ModelExecutor* (*)(Model*, const ComputeOptions*, int);

// libdtlab_cuda_exec.so from the executable's folder, loaded once (it stays loaded).
NewExecutor cuda_module(const std::string& device) {
  static std::once_flag once;
  static NewExecutor fn = nullptr;
  static std::string error;
  std::call_once(once, [] {
    char exe[PATH_MAX] = {};
    const ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    std::string dir = n > 0 ? std::string(exe, static_cast<size_t>(n)) : std::string();
    dir = dir.substr(0, dir.rfind('/') + 1);
    const std::string path = dir + "libdtlab_cuda_exec.so";
    void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!h) {
      error = "cannot load the GPU backend module " + path + ": " + dlerror();
      return;
    }
    fn = reinterpret_cast<NewExecutor>(dlsym(h, "dtlab_cuda_new_executor"));
    if (!fn) error = path + " has no dtlab_cuda_new_executor (a module from another build?)";
  });
  if (!fn)
    throw DeviceError("--device " + device + ": " + error,
                      "the module is built with the dtlab executable (cmake --build <dir> --target dtlab) and must "
                      "stay next to it; cuBLAS and cuDNN must be on the library path");
  return fn;
}

}  // namespace
#endif

std::unique_ptr<ModelExecutor> make_executor(Model& model, const ComputeOptions& opt, int rank) {
  const DeviceSpec d = parse_device(opt.device);
  if (d.is_cpu()) throw Error("make_executor: the CPU runs the model's own modules, it has no executor");
  if (d.kind == "sim") return std::make_unique<SimExecutor>(model, /*resident=*/true);
#ifdef DTLAB_HAVE_CUDA
  return std::unique_ptr<ModelExecutor>(cuda_module(opt.device)(&model, &opt, rank));
#else
  (void)model;
  (void)rank;
#ifndef DTLAB_CUDA_OFF_REASON
#define DTLAB_CUDA_OFF_REASON "this build has no CUDA"
#endif
  throw DeviceError("--device " + opt.device + ": this dtlab was built without the GPU backend (" +
                        DTLAB_CUDA_OFF_REASON + ")",
                    "rebuild where the CUDA toolkit, cuDNN 9 and NCCL are installed (see `dtlab version`), or "
                    "use --device cpu");
#endif
}

}  // namespace lab
