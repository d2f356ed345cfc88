#include "executor.h"

#include <utility>

#include "errors.h"
#include "model.h"

namespace lab {

namespace {
ExecutorFactory& factory_slot() {
  static ExecutorFactory f;
  return f;
}
}  // namespace

void set_executor_factory(ExecutorFactory f) { factory_slot() = std::move(f); }
const ExecutorFactory& executor_factory() { return factory_slot(); }

std::string attach_executor(Model& model, const ComputeOptions& compute, int rank, int world_size,
                            const std::string& comm) {
  if (parse_device(compute.device).is_cpu()) return "";
  const ExecutorFactory& make = executor_factory();
  if (!make)
    throw DeviceError("--device " + compute.device + ": this program has no device backend",
                      "run it through the dtlab executable, which registers the GPU backend of its build");
  ComputeOptions opt = compute;
  const std::vector<int> map = rank_device_map(opt, world_size, comm);
  const int gpu = map.at(static_cast<size_t>(rank));
  if (gpu != parse_device(opt.device).index) opt.device = "cuda:" + std::to_string(gpu);  // else as the user wrote it
  std::unique_ptr<ModelExecutor> exec = make(model, opt, rank);
  std::string described = exec->describe();
  model.set_executor(std::move(exec));
  return described;
}

}  // namespace lab
