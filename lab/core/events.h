// Events: what the run records instead of printing. Every chunk transfer of a collective and
// every compute phase becomes one Event; sinks (trace file, metrics, the GUI snapshot, console)
// read them. Each rank appends to its own EventLog, so recording never contends across ranks.
#pragma once

#include <cstdint>
#include <mutex>
#include <vector>

namespace lab {

enum class EventKind : uint8_t {
  Chunk,       // one point-to-point transfer of a collective (recorded by the sender)
  Collective,  // one whole collective call on one rank (allreduce, broadcast, allgather)
  Compute,     // forward, backward, optimizer step, evaluation (the host's time around them)
  Device,      // work a device did within a compute phase (a layer's kernels, a copy), timed by the
               // device itself (CUDA events) and placed on the host's clock; op names the work
  kLastKind = Device,  // keep last: files and messages that carry kinds check against it
};

enum class Phase : uint8_t {
  None,
  ReduceScatter,
  Allgather,
  Broadcast,
  Gather,
  Forward,
  Backward,
  OptimizerStep,
  Eval,
  Scatter,  // DataParallel: device 0 sends a slice of a batch (inputs, output gradients) to a device
  Reduce,   // DataParallel: a device sends its gradients to device 0, which adds them up
  Send,     // pipeline: a stage sends a micro-batch's activations to the next stage, or their gradient
            // to the previous one (point to point, no collective)
  kLast = Send,  // keep last: files and messages that carry phases check against it
};

const char* phase_name(Phase p);  // "reduce-scatter", "allgather", "forward", ...

struct Event {
  EventKind kind = EventKind::Compute;
  Phase phase = Phase::None;
  const char* op = "";     // static string: "allreduce", "allgather", "broadcast", "forward", ...
  const char* what = "";   // static string: "grad bucket", "bn stats", "bn grad sums", "buffers", ...;
                           // Device: "kernels" or "copy"
  int32_t tag = -1;        // bucket index or module index, -1 if none
  int32_t rank = 0;        // the rank that recorded the event
  int32_t src = -1;        // Chunk: sender
  int32_t dst = -1;        // Chunk: receiver
  int32_t chunk = -1;      // Chunk: chunk index within the buffer
  int32_t ring_step = -1;  // Chunk: step within its phase (0 .. N-2 for a ring)
  uint64_t op_seq = 0;     // sequence number of the collective, identical on every rank (of its group)
  const char* group = "";  // static string: the process group that ran it ("dp", "pp", "tp"; "": the world)
  int64_t train_step = -1; // training iteration (global step counter), -1 outside training
  uint64_t bytes = 0;      // Chunk: payload bytes; Collective: buffer bytes; Device copy: bytes copied
  double t_start = 0, t_end = 0;  // seconds since the run's clock origin (now_seconds())
};

// Seconds since the process's clock origin (steady clock).
double now_seconds();

// One rank's log. The owning rank appends; readers copy under a short lock.
class EventLog {
 public:
  void record(const Event& e) {
    std::lock_guard<std::mutex> lock(m_mu);
    m_events.push_back(e);
  }
  // Events with index >= from, appended to out; returns the new total count.
  size_t copy_since(size_t from, std::vector<Event>& out) const {
    std::lock_guard<std::mutex> lock(m_mu);
    for (size_t i = from; i < m_events.size(); ++i) out.push_back(m_events[i]);
    return m_events.size();
  }
  size_t size() const {
    std::lock_guard<std::mutex> lock(m_mu);
    return m_events.size();
  }
  // Drops events before index `keep_from` is not supported: logs only grow during a run.

 private:
  mutable std::mutex m_mu;
  std::vector<Event> m_events;
};

}  // namespace lab
