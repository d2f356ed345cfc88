// RunControl: pause, resume and single-step a run at the granularity of one ring step (every rank
// sends one chunk), one iteration, or any gate a front end chooses (run_until), and slow it down
// (set_delay). The ranks meet it at their gates: the Communicator's StepGate before every ring
// step, before_iteration before every iteration. Paused time does not count towards collective
// timeouts (hold_flag). Also the Ctrl-C checkpoint's stop iteration, and the failure-injection
// hook at ring steps.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <vector>

#include "communicator.h"
#include "events.h"

namespace lab {

// Pause / single-step control; the Communicator's StepGate.
class RunControl : public StepGate {
 public:
  explicit RunControl(int world_size);
  void pause();
  void resume();
  // While paused: let every rank pass n more ring steps (or, with no collective ahead, iterations).
  void step_ring(int n = 1);
  // While paused: let every rank complete n more iterations.
  void step_iteration(int n = 1);
  void stop();  // ranks stop at their next gate
  bool stopped() const;
  bool paused() const { return m_paused.load(); }
  const std::atomic<bool>* hold_flag() const { return &m_paused; }

  // While paused: every rank passes its gates until stop(rank, iteration, next) says true (it is
  // asked again whenever the rank is woken, so it must give the same answer for the same gate).
  // next: the ring step about to happen, or nullptr at the gate before iteration `iteration`.
  // Front ends build "one allreduce", "one epoch" and "up to step k" from it. pause() clears it.
  using StopFn = std::function<bool(int rank, int64_t iteration, const Event* next)>;
  void run_until(StopFn stop);
  // Slow motion: every rank waits this long before passing each gate (0: full speed).
  void set_delay(double seconds);
  double delay() const;
  // Per rank: the iteration whose gate it passed or waits at last (-1 before the first).
  std::vector<int64_t> iterations() const;

  void before_step(int rank, const Event& next) override;  // ring-step gate
  void before_iteration(int rank, int64_t step);            // iteration gate
  // Ctrl-C with checkpoints: the first iteration no rank has reached yet becomes the stop; every
  // rank writes a checkpoint there and stops. Returns it (the same on every call).
  int64_t request_checkpoint_stop();
  int64_t checkpoint_stop() const;  // INT64_MAX: none requested
  // The ranks of several processes agreed to stop at `step` (Run's stop vote).
  void set_checkpoint_stop(int64_t step);

  // Failure injection hook (set by the run).
  std::function<void(int rank, const Event&)> on_ring_step;

 private:
  void wait_gate(int rank, const Event* next);
  mutable std::mutex m_mu;
  std::condition_variable m_cv;
  std::atomic<bool> m_paused{false};
  bool m_stop = false;
  std::vector<int> m_ring_tokens, m_iter_tokens;
  StopFn m_until;
  double m_delay = 0;
  std::vector<int64_t> m_iteration;
  int64_t m_checkpoint_stop = INT64_MAX;
};

}  // namespace lab
