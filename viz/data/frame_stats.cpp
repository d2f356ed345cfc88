#include "frame_stats.h"

#include <algorithm>
#include <cmath>

namespace viz {

Percentiles percentiles(std::vector<double> v) {
  Percentiles p;
  if (v.empty()) return p;
  std::sort(v.begin(), v.end());
  auto at = [&](double q) {
    // nearest rank: the smallest value with at least q of the values at or below it
    size_t k = static_cast<size_t>(std::ceil(q * static_cast<double>(v.size())));
    k = std::min(std::max<size_t>(k, 1), v.size());
    return v[k - 1];
  };
  p.p50 = at(0.50);
  p.p95 = at(0.95);
  p.p99 = at(0.99);
  p.max = v.back();
  return p;
}

void FrameStats::add(double frame_ms, double interval_ms) {
  m_frame_ms.push_back(frame_ms);
  if (interval_ms > 0) m_interval_ms.push_back(interval_ms);
}

nlohmann::json FrameStats::to_json(const nlohmann::json& extra) const {
  auto pj = [](const Percentiles& p) {
    return nlohmann::json{{"p50", p.p50}, {"p95", p.p95}, {"p99", p.p99}, {"max", p.max}};
  };
  nlohmann::json j = {{"frames", frames()}, {"frame_ms", pj(frame())}, {"interval_ms", pj(interval())}};
  for (auto it = extra.begin(); it != extra.end(); ++it) j[it.key()] = it.value();
  return j;
}

}  // namespace viz
