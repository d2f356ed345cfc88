// RunControl (run_control.h): the gates every rank passes, and what a front end does to them.
#include "run_control.h"

#include <algorithm>
#include <chrono>

#include "faults.h"

namespace lab {

RunControl::RunControl(int world_size) : m_ring_tokens(static_cast<size_t>(world_size), 0),
                                         m_iter_tokens(static_cast<size_t>(world_size), 0),
                                         m_iteration(static_cast<size_t>(world_size), -1) {}

void RunControl::pause() {
  std::lock_guard<std::mutex> lock(m_mu);
  m_paused = true;
  std::fill(m_ring_tokens.begin(), m_ring_tokens.end(), 0);
  std::fill(m_iter_tokens.begin(), m_iter_tokens.end(), 0);
  m_until = nullptr;
}

void RunControl::run_until(StopFn stop) {
  {
    std::lock_guard<std::mutex> lock(m_mu);
    m_until = std::move(stop);
  }
  m_cv.notify_all();
}

void RunControl::set_delay(double seconds) {
  {
    std::lock_guard<std::mutex> lock(m_mu);
    m_delay = seconds > 0 ? seconds : 0;
  }
  m_cv.notify_all();
}

double RunControl::delay() const {
  std::lock_guard<std::mutex> lock(m_mu);
  return m_delay;
}

std::vector<int64_t> RunControl::iterations() const {
  std::lock_guard<std::mutex> lock(m_mu);
  return m_iteration;
}

void RunControl::resume() {
  {
    std::lock_guard<std::mutex> lock(m_mu);
    m_paused = false;
  }
  m_cv.notify_all();
}

void RunControl::step_ring(int n) {
  {
    std::lock_guard<std::mutex> lock(m_mu);
    for (int& t : m_ring_tokens) t += n;
  }
  m_cv.notify_all();
}

void RunControl::step_iteration(int n) {
  {
    std::lock_guard<std::mutex> lock(m_mu);
    for (int& t : m_iter_tokens) t += n;
  }
  m_cv.notify_all();
}

void RunControl::stop() {
  {
    std::lock_guard<std::mutex> lock(m_mu);
    m_stop = true;
  }
  m_cv.notify_all();
}

bool RunControl::stopped() const {
  std::lock_guard<std::mutex> lock(m_mu);
  return m_stop;
}

// A paused rank blocks at every gate. A ring token lets it pass one ring gate (and any iteration
// gates on the way to it); an iteration token lets it pass one iteration gate (and the ring gates
// inside that iteration); a run_until predicate lets it pass every gate it does not stop at.
// A rank that passes waits the slow-motion delay first (interrupted only by stop()).
void RunControl::wait_gate(int rank, const Event* next) {
  std::unique_lock<std::mutex> lock(m_mu);
  const size_t r = static_cast<size_t>(rank);
  const bool ring = next != nullptr;
  for (;;) {
    if (m_stop) throw StopRequested{};
    if (!m_paused) break;
    if (m_until && !m_until(rank, m_iteration[r], next)) break;
    if (ring) {
      if (m_ring_tokens[r] > 0) {
        --m_ring_tokens[r];
        break;
      }
      if (m_iter_tokens[r] > 0) break;
    } else {
      if (m_iter_tokens[r] > 0) {
        --m_iter_tokens[r];
        break;
      }
      if (m_ring_tokens[r] > 0) break;
    }
    m_cv.wait(lock);
  }
  if (m_delay > 0) {
    m_cv.wait_for(lock, std::chrono::duration<double>(m_delay), [&] { return m_stop; });
    if (m_stop) throw StopRequested{};
  }
}

void RunControl::before_step(int rank, const Event& next) {
  if (on_ring_step) on_ring_step(rank, next);
  wait_gate(rank, &next);
}

int64_t RunControl::request_checkpoint_stop() {
  std::lock_guard<std::mutex> lock(m_mu);
  if (m_checkpoint_stop == INT64_MAX) {
    // Under the lock the gates update m_iteration with: no rank can be past the stop.
    int64_t at = -1;
    for (int64_t i : m_iteration) at = std::max(at, i);
    m_checkpoint_stop = at + 1;
  }
  return m_checkpoint_stop;
}

void RunControl::set_checkpoint_stop(int64_t step) {
  std::lock_guard<std::mutex> lock(m_mu);
  m_checkpoint_stop = std::min(m_checkpoint_stop, step);
}

int64_t RunControl::checkpoint_stop() const {
  std::lock_guard<std::mutex> lock(m_mu);
  return m_checkpoint_stop;
}

void RunControl::before_iteration(int rank, int64_t step) {
  {
    std::lock_guard<std::mutex> lock(m_mu);
    m_iteration[static_cast<size_t>(rank)] = step;
  }
  wait_gate(rank, nullptr);
}

}  // namespace lab
