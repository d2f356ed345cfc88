#include "join.h"

#include <algorithm>
#include <vector>

#include "errors.h"

namespace lab {

DdpJoin::DdpJoin(Model& model, Communicator& comm, DdpReducer& reducer, bool broadcast_buffers)
    : m_model(model), m_comm(comm), m_reducer(reducer), m_broadcast_buffers(broadcast_buffers) {
  // DDP.will_sync_module_buffers also needs buffers to exist (none with track_running_stats off).
  bool any = false;
  for (const StateEntry& e : model.state_dict()) any = any || e.buffer != nullptr;
  m_broadcast_buffers = m_broadcast_buffers && any;
}

int DdpJoin::find_common_rank(bool candidate) {
  const int n = m_comm.world_size();
  const float mine = candidate ? static_cast<float>(m_comm.rank()) : -1.0f;
  std::vector<float> all(static_cast<size_t>(n));
  m_comm.allgather(&mine, 1, all.data(), CollectiveInfo{"join common rank", -1});
  const int common = static_cast<int>(*std::max_element(all.begin(), all.end()));
  if (common < 0)
    throw CommError("BUG! Expected rank_cond to be true for at least one process.",
                    "no rank was a candidate for the authoritative model copy");
  return common;
}

void DdpJoin::before_forward(bool require_forward_param_sync, bool grad_sync) {
  float one = 1.0f;
  m_comm.allreduce_sum(&one, 1, CollectiveInfo{"join notify", -1});
  if (m_broadcast_buffers && require_forward_param_sync) broadcast_buffers(m_model, m_comm, find_common_rank(true));
  float sync = grad_sync ? 1.0f : 0.0f;
  m_comm.allreduce_sum(&sync, 1, CollectiveInfo{"join grad sync", -1});
}

bool DdpJoin::shadow_iteration(bool& require_forward_param_sync) {
  float training = 0.0f;
  m_comm.allreduce_sum(&training, 1, CollectiveInfo{"join notify", -1});
  if (training == 0.0f) return false;
  if (m_broadcast_buffers && require_forward_param_sync) broadcast_buffers(m_model, m_comm, find_common_rank(false));
  float sync = 0.0f;
  m_comm.allreduce_sum(&sync, 1, CollectiveInfo{"join grad sync", -1});
  require_forward_param_sync = sync != 0.0f;
  if (require_forward_param_sync) m_reducer.allreduce_zero_buckets();
  return true;
}

void DdpJoin::sync_final_model(bool is_last_joiner) {
  broadcast_state(m_model, m_comm, find_common_rank(is_last_joiner));
}

}  // namespace lab
