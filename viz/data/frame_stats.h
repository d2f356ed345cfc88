// FrameStats: how long frames take, for --frame-stats and the performance script
// (tools/gui_perf.sh). The figures are over the frames drawn while the ranks train (a live run
// in its Running phase): the frames the performance target is about. Frames drawn while data
// loads, while paused or after the run are cheap and would flatter the figures; all_frame_ms
// gives the percentiles over every drawn frame.
//   frame_ms     the time to produce one drawn frame: from the moment the loop wakes up to the
//                moment the frame is handed to the window system (run news, UI, rendering,
//                swap). With Mesa's software rasterizer most pixels are drawn inside the swap.
//   interval_ms  the time between the starts of two drawn frames: what the eye sees as the frame
//                rate. It includes the wait that paces frames (app.cpp: 15 fps while a run only
//                moves, 60 while the user interacts, less when frames are slow).
//   late_ms      how long after its due time a frame started (the loop asked to wake at time t and
//                woke at t + late): the wait for a CPU while the ranks hold every core. Frames
//                woken by input count 0 (the input's own arrival time is not known).
//   parts        per drawn frame, wall and thread-CPU milliseconds of its parts, in order:
//                news (copying run data), ui (building the ImGui windows), render (GL calls for
//                the damaged rectangles), swap (rasterizing and presenting). wall - cpu is time
//                the GUI thread was ready but not running, or waiting for the X server.
#pragma once

#include <array>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace viz {

struct Percentiles {
  double p50 = 0, p95 = 0, p99 = 0, max = 0;
};

// Nearest-rank percentiles of values (copied and sorted); zeros when empty.
Percentiles percentiles(std::vector<double> values);

// CPU time of the calling thread, in seconds (CLOCK_THREAD_CPUTIME_ID; 0 where unsupported).
double thread_cpu_seconds();

enum class FramePart { News = 0, Ui, Render, Swap };
constexpr int kFrameParts = 4;
const char* frame_part_name(FramePart p);  // "news", "ui", "render", "swap"

// Wall and thread-CPU milliseconds of one part of a frame.
struct FramePartTime {
  double wall_ms = 0, cpu_ms = 0;
};

class FrameStats {
 public:
  using Part = FramePartTime;
  // One drawn frame. interval_ms <= 0: the first frame (no interval). training: drawn while the
  // ranks train (only those count in frame(), interval(), late() and the parts).
  void add(double frame_ms, double interval_ms, double late_ms = 0, const std::array<Part, kFrameParts>& parts = {},
           bool training = true);
  size_t frames() const { return m_frame_ms.size(); }        // drawn while training
  size_t all_frames() const { return m_all_frame_ms.size(); }
  Percentiles all_frame() const { return percentiles(m_all_frame_ms); }
  Percentiles frame() const { return percentiles(m_frame_ms); }
  Percentiles interval() const { return percentiles(m_interval_ms); }
  Percentiles late() const { return percentiles(m_late_ms); }
  // Mean wall and CPU milliseconds of one part over the drawn frames.
  Part part_mean(FramePart p) const;
  // {"frames", "frame_ms": {p50, p95, p99, max}, "interval_ms": {...}, "late_ms": {...},
  //  "parts_mean_ms": {"news": {"wall", "cpu"}, ...}, "all_frames", "all_frame_ms": {...}} merged
  //  with extra.
  nlohmann::json to_json(const nlohmann::json& extra) const;

 private:
  std::vector<double> m_frame_ms, m_interval_ms, m_late_ms, m_all_frame_ms;
  std::array<Part, kFrameParts> m_part_sum{};
};

}  // namespace viz
