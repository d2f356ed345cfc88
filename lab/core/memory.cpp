#include "memory.h"

namespace lab {

const char* memory_category_name(int c) {
  static const char* kNames[kMemCategories] = {"parameters",   "gradients",    "optimizer_state",
                                               "activations",  "comm_buffers", "gathered_parameters"};
  return c >= 0 && c < kMemCategories ? kNames[c] : "?";
}

const char* memory_category_short(int c) {
  static const char* kNames[kMemCategories] = {"params", "grads", "optimizer", "activations", "comm", "gathered"};
  return c >= 0 && c < kMemCategories ? kNames[c] : "?";
}

int64_t MemoryBytes::total() const {
  int64_t t = 0;
  for (int64_t b : bytes) t += b;
  return t;
}

void MemoryPeak::offer(int64_t s, const std::vector<MemorySample>& pts) {
  if (pts.empty()) return;
  size_t top = 0;
  for (size_t i = 1; i < pts.size(); ++i)
    if (pts[i].bytes.total() > pts[top].bytes.total()) top = i;
  if (!empty() && pts[top].bytes.total() <= this->top().bytes.total()) return;
  step = s;
  point = top;
  points = pts;
}

void MemoryLedger::begin_step(int64_t step) {
  m_step = step;
  m_points.clear();
}

void MemoryLedger::sample(const std::string& point) {
  if (!m_measure) return;
  m_last = MemorySample{point, m_measure()};
  m_points.push_back(m_last);
  m_peak.offer(m_step, m_points);
}

MemoryBytes ZeroFormula::model_states() const {
  const int64_t n = world < 1 ? 1 : world;
  const int64_t part = (psi + n - 1) / n;  // Psi / N, rounded up
  MemoryBytes b;
  b[kMemParameters] = 4 * (stage >= 3 ? part : psi);
  b[kMemGradients] = 4 * (stage >= 2 ? part : psi);
  b[kMemOptimizerState] = k * (stage >= 1 ? part : psi);
  return b;
}

std::string ZeroFormula::expression() const {
  switch (stage) {
    case 0: return "(8+K)Psi";
    case 1: return "8Psi + K Psi/N";
    case 2: return "4Psi + (4+K)Psi/N";
    default: return "(8+K)Psi/N";
  }
}

int optimizer_bytes_per_parameter(bool adam, double momentum) { return adam ? 8 : momentum != 0 ? 4 : 0; }

}  // namespace lab
