#include "events.h"

#include <chrono>

namespace lab {

const char* phase_name(Phase p) {
  switch (p) {
    case Phase::None: return "none";
    case Phase::ReduceScatter: return "reduce-scatter";
    case Phase::Allgather: return "allgather";
    case Phase::Broadcast: return "broadcast";
    case Phase::Gather: return "gather";
    case Phase::Forward: return "forward";
    case Phase::Backward: return "backward";
    case Phase::OptimizerStep: return "optimizer-step";
    case Phase::Eval: return "eval";
    case Phase::Scatter: return "scatter";
    case Phase::Reduce: return "reduce";
    case Phase::Send: return "send";
  }
  return "?";
}

double now_seconds() {
  static const auto origin = std::chrono::steady_clock::now();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - origin).count();
}

}  // namespace lab
