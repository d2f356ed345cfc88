// Local SGD with periodic model averaging, as PyTorch 1.13 runs post-local SGD: DDP with the
// post_localSGD_hook (post_local_gradient_allreduce=False) plus
// torch.distributed.algorithms.model_averaging.averagers.PeriodicModelAverager, called after every
// optimizer step:
//  - gradients: iterations 0 .. warmup-1 allreduce them as plain DDP does (the hook's own counter
//    counts backward passes; its allreduce divides the bucket by the world size); from iteration
//    `warmup` on every rank steps on its own gradients;
//  - parameters: the averager counts its own calls from 0 and averages when
//    step >= warmup_steps and (step - warmup_steps) % period == 0, i.e. right after the steps
//    warmup, warmup + period, ...;
//  - averaging: every parameter with a gradient, flattened into one buffer, DIVIDED by the world
//    size first, then allreduce(sum) (utils.average_parameters) - every rank ends bitwise equal;
//  - not averaged: buffers (BatchNorm running statistics follow DDP's broadcast_buffers, applied at
//    every forward by the DDP wrapper) and the optimizer's momentum, which stays per rank.
// Drift: before averaging, the L2 distance between this rank's parameters and the average (in
// double over all parameters) - how far the replicas wandered apart since the last average.
#pragma once

#include <cstdint>
#include <vector>

#include "communicator.h"
#include "model.h"

namespace lab {

// Whether the post-localSGD hook allreduces gradients in iteration `iter` (0-based).
inline bool post_local_sgd_allreduces(int64_t iter, int64_t start_local_sgd_iter) {
  return iter < start_local_sgd_iter;
}

class PeriodicModelAverager {
 public:
  PeriodicModelAverager(int64_t period, int64_t warmup_steps);
  // Whether the next average_parameters() call averages.
  bool averages_now() const {
    return m_step >= m_warmup && (m_step - m_warmup) % m_period == 0;
  }
  // averager.average_parameters(model.parameters()): averages when due, then counts the call.
  // Returns this rank's drift before averaging, or -1 when this call did not average.
  double average_parameters(Model& model, Communicator& comm);
  int64_t step() const { return m_step; }
  void set_step(int64_t step) { m_step = step; }  // from a checkpoint

 private:
  int64_t m_period, m_warmup;
  int64_t m_step = 0;
  std::vector<float> m_flat, m_before;
};

}  // namespace lab
