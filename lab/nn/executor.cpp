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

const char* device_timeline_op(const std::string& kind) {
  if (kind == "Linear") return "linear";
  if (kind == "Conv2d") return "conv2d";
  if (kind == "BatchNorm1d") return "batchnorm1d";
  if (kind == "BatchNorm2d") return "batchnorm2d";
  if (kind == "ReLU") return "relu";
  if (kind == "MaxPool2d") return "max-pool";
  return nullptr;
}

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
  const DeviceSpec spec = parse_device(opt.device);
  if (gpu != spec.index) opt.device = spec.kind + ":" + std::to_string(gpu);  // else as the user wrote it
  std::unique_ptr<ModelExecutor> exec = make(model, opt, rank);
  std::string described = exec->describe();
  model.set_executor(std::move(exec));
  return described;
}

}  // namespace lab
