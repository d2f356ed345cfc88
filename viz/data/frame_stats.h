// FrameStats: how long frames take, for --frame-stats and the performance script
// (tools/gui_perf.sh). frame_ms is the work of one frame (input, UI, rendering, swap); interval_ms
// is the time between frame starts (it includes the wait that caps the frame rate).
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace viz {

struct Percentiles {
  double p50 = 0, p95 = 0, p99 = 0, max = 0;
};

// Nearest-rank percentiles of values (copied and sorted); zeros when empty.
Percentiles percentiles(std::vector<double> values);

class FrameStats {
 public:
  void add(double frame_ms, double interval_ms);
  size_t frames() const { return m_frame_ms.size(); }
  Percentiles frame() const { return percentiles(m_frame_ms); }
  Percentiles interval() const { return percentiles(m_interval_ms); }
  // {"frames", "frame_ms": {p50, p95, p99, max}, "interval_ms": {...}} merged with extra.
  nlohmann::json to_json(const nlohmann::json& extra) const;

 private:
  std::vector<double> m_frame_ms, m_interval_ms;
};

}  // namespace viz
