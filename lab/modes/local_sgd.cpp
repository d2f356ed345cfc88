#include "local_sgd.h"

#include <cassert>
#include <cmath>
#include <cstring>

#include "mutation.h"

namespace lab {

PeriodicModelAverager::PeriodicModelAverager(int64_t period, int64_t warmup_steps)
    : m_period(period), m_warmup(warmup_steps) {
  assert(period >= 1 && warmup_steps >= 0);  // validated with PyTorch's wording in config.cpp
}

double PeriodicModelAverager::average_parameters(Model& model, Communicator& comm) {
  // (a lesson's mutation test, mutation.h: averaging after iterations K - 1, 2K - 1, ... instead of 0, K, 2K)
  const bool average = mutated("local-sgd-averages-late")
                           ? m_step >= m_warmup && (m_step - m_warmup + 1) % m_period == 0
                           : averages_now();
  ++m_step;
  if (!average) return -1.0;
  // flat_params = torch.cat([p.data.reshape(-1) for p in params]); flat_params /= world_size
  const std::vector<Param*> params = model.params();
  model.to_host(kStateParams);  // a device's parameters (executor.h: residency)
  m_before.clear();
  for (const Param* p : params) m_before.insert(m_before.end(), p->value.data.begin(), p->value.data.end());
  const float world = static_cast<float>(comm.world_size());
  m_flat.resize(m_before.size());
  for (size_t i = 0; i < m_flat.size(); ++i) m_flat[i] = m_before[i] / world;
  comm.allreduce_sum(m_flat.data(), m_flat.size(), CollectiveInfo{"param average", -1});
  double sq = 0;
  for (size_t i = 0; i < m_flat.size(); ++i) {
    const double d = static_cast<double>(m_before[i]) - static_cast<double>(m_flat[i]);
    sq += d * d;
  }
  if (mutated("local-sgd-keeps-own-params")) return std::sqrt(sq);  // (mutation.h: the average is not taken)
  size_t off = 0;
  for (Param* p : params) {
    std::memcpy(p->value.data.data(), m_flat.data() + off, p->value.data.size() * sizeof(float));
    off += p->value.data.size();
  }
  model.host_changed(kStateParams);
  return std::sqrt(sq);
}

}  // namespace lab
