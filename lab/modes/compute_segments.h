// ComputeSegments: a compute phase (forward, backward) recorded as the timeline's compute events,
// cut where a collective runs on the rank's own thread between modules (FSDP's all-gathers and
// reduce-scatters, tensor parallelism's allreduces): a collective inside a compute event would be
// counted as hidden behind backward, where it is not. pause() before such a collective, resume()
// after; an exception records nothing of the segment it interrupts.
#pragma once

#include <cstdint>

#include "communicator.h"
#include "events.h"

namespace lab {

class ComputeSegments {
 public:
  ComputeSegments(Communicator& comm, int rank) : m_comm(comm), m_rank(rank) {}
  void begin(Phase phase, const char* op, int64_t step) {
    m_phase = phase;
    m_op = op;
    m_step = step;
    m_t0 = now_seconds();
  }
  void end() {
    pause();
    m_op = nullptr;
  }
  void pause() {
    if (!m_op || m_t0 < 0) return;
    Event e;
    e.kind = EventKind::Compute;
    e.rank = m_rank;
    e.train_step = m_step;
    e.phase = m_phase;
    e.op = m_op;
    e.t_start = m_t0;
    e.t_end = now_seconds();
    m_comm.record(e);
    m_t0 = -1;
  }
  void resume() {
    if (m_op) m_t0 = now_seconds();
  }

 private:
  Communicator& m_comm;
  const int m_rank;
  Phase m_phase = Phase::Forward;  // the phase being timed, while m_op is set
  const char* m_op = nullptr;
  int64_t m_step = -1;
  double m_t0 = -1;                // the current segment's start (-1: paused)
};

}  // namespace lab
