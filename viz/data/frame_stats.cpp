#include "frame_stats.h"

#include <time.h>

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

double thread_cpu_seconds() {
  timespec ts{};
  if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) != 0) return 0;
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

const char* frame_part_name(FramePart p) {
  switch (p) {
    case FramePart::News: return "news";
    case FramePart::Ui: return "ui";
    case FramePart::Render: return "render";
    case FramePart::Swap: return "swap";
  }
  return "?";
}

void FrameStats::add(double frame_ms, double interval_ms, double late_ms, const std::array<Part, kFrameParts>& parts,
                     bool training) {
  m_all_frame_ms.push_back(frame_ms);
  if (!training) return;
  m_frame_ms.push_back(frame_ms);
  if (interval_ms > 0) m_interval_ms.push_back(interval_ms);
  m_late_ms.push_back(std::max(0.0, late_ms));
  for (int i = 0; i < kFrameParts; ++i) {
    m_part_sum[static_cast<size_t>(i)].wall_ms += parts[static_cast<size_t>(i)].wall_ms;
    m_part_sum[static_cast<size_t>(i)].cpu_ms += parts[static_cast<size_t>(i)].cpu_ms;
  }
}

FrameStats::Part FrameStats::part_mean(FramePart p) const {
  Part m = m_part_sum[static_cast<size_t>(p)];
  const double n = static_cast<double>(std::max<size_t>(1, frames()));
  m.wall_ms /= n;
  m.cpu_ms /= n;
  return m;
}

nlohmann::json FrameStats::to_json(const nlohmann::json& extra) const {
  auto pj = [](const Percentiles& p) {
    return nlohmann::json{{"p50", p.p50}, {"p95", p.p95}, {"p99", p.p99}, {"max", p.max}};
  };
  nlohmann::json parts = nlohmann::json::object();
  for (int i = 0; i < kFrameParts; ++i) {
    const Part m = part_mean(static_cast<FramePart>(i));
    parts[frame_part_name(static_cast<FramePart>(i))] = {{"wall", m.wall_ms}, {"cpu", m.cpu_ms}};
  }
  nlohmann::json j = {{"frames", frames()},        {"frame_ms", pj(frame())},   {"interval_ms", pj(interval())},
                      {"late_ms", pj(late())},     {"parts_mean_ms", parts},
                      {"all_frames", all_frames()}, {"all_frame_ms", pj(all_frame())}};
  for (auto it = extra.begin(); it != extra.end(); ++it) j[it.key()] = it.value();
  return j;
}

}  // namespace viz
