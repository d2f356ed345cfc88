// The run's device (--device, lab/nn/executor.h): giving each model its rank's executor, and what
// summary.json says about it. run.cpp calls attach_device for every model that computes and never
// asks which device that is.
#include <nlohmann/json.hpp>

#include "errors.h"
#include "run.h"

namespace lab {

nlohmann::json Run::device_summary() {
  nlohmann::json c = {{"device", m_cfg.compute.device}};
  if (m_device_name.empty()) {
    c["what"] = "the CPU reference: every layer is lab/nn's";
    return c;
  }
  c["name"] = m_device_name;
  c["allow_tf32"] = m_cfg.compute.allow_tf32;
  c["cudnn_benchmark"] = m_cfg.compute.cudnn_benchmark;
  c["cudnn_deterministic"] = m_cfg.compute.cudnn_deterministic;
  StagingTraffic t;
  for (int r : m_local) {
    ModelExecutor* e = m_replicas[static_cast<size_t>(r)]->executor();
    if (!e) continue;
    const StagingTraffic rt = e->traffic();
    t.host_to_device_bytes += rt.host_to_device_bytes;
    t.device_to_host_bytes += rt.device_to_host_bytes;
    t.wait_ms += rt.wait_ms;
  }
  c["staging"] = {{"host_to_device_bytes", t.host_to_device_bytes},
                  {"device_to_host_bytes", t.device_to_host_bytes},
                  {"wait_ms", t.wait_ms},
                  {"what", "the ranks of this process together: inputs, parameters (where the host's are newer) "
                           "and reduced gradients copied to the device, logits and gradients copied back "
                           "(lab/nn/executor.h)"}};
  if (ModelExecutor* e0 = is_local(0) ? m_replicas[0]->executor() : nullptr) {
    const nlohmann::json rep = nlohmann::json::parse(e0->report_json(), nullptr, false);
    if (rep.is_object()) c["rank0"] = rep;
  }
  return c;
}

void Run::attach_device(Model& model, int rank) {
  const std::string described = attach_executor(model, m_cfg.compute, rank, m_cfg.world_size, m_cfg.comm);
  if (m_device_name.empty()) m_device_name = described;
}

}  // namespace lab
