// Timeline: what every rank did over the last fraction of a second, compute on one lane and
// communication on the other. Gaps are waiting: for a gate (paused, slow motion), for a slower
// peer, or for the GUI's nothing (it never blocks the ranks). Only events inside the window are
// visited (binary search on their end time, which grows along each rank's log).
#include <algorithm>
#include <cstring>
#include <vector>

#include "draw.h"
#include "panels.h"

namespace viz {

namespace {

// single chunk transfers: thin white bars (their length includes waiting for the peer)
constexpr ImU32 kChunkColor = IM_COL32(250, 250, 250, 230);
constexpr ImU32 kAllreduceColor = IM_COL32(230, 159, 0, 255);
constexpr ImU32 kBroadcastColor = IM_COL32(204, 121, 167, 255);
constexpr ImU32 kAllgatherColor = IM_COL32(240, 228, 66, 255);
constexpr ImU32 kReduceColor = IM_COL32(213, 94, 0, 255);
constexpr ImU32 kReduceScatterColor = IM_COL32(160, 110, 230, 255);  // FSDP's gradients

// what the device did (--device): its kernels a darker shade of the phase's colour, copies grey
constexpr ImU32 kDeviceCopyColor = IM_COL32(120, 120, 120, 255);

ImU32 event_color(const lab::Event& e) {
  if (e.kind == lab::EventKind::Device) {
    if (std::strcmp(e.what, "copy") == 0) return kDeviceCopyColor;
    switch (e.phase) {
      case lab::Phase::Forward: return IM_COL32(43, 110, 150, 255);
      case lab::Phase::Backward: return IM_COL32(20, 70, 140, 255);
      case lab::Phase::OptimizerStep: return IM_COL32(0, 100, 72, 255);
      default: return IM_COL32(90, 90, 90, 255);
    }
  }
  if (e.kind == lab::EventKind::Compute) {
    switch (e.phase) {
      case lab::Phase::Forward: return IM_COL32(86, 180, 233, 255);
      case lab::Phase::Backward: return IM_COL32(40, 130, 220, 255);
      case lab::Phase::OptimizerStep: return IM_COL32(0, 158, 115, 255);
      default: return IM_COL32(150, 150, 150, 255);
    }
  }
  if (std::strcmp(e.op, "allreduce") == 0) return kAllreduceColor;
  // DataParallel's replicate is a broadcast of device 0's parameters and buffers
  if (std::strcmp(e.op, "broadcast") == 0 || std::strcmp(e.op, "replicate") == 0) return kBroadcastColor;
  if (std::strcmp(e.op, "reduce") == 0) return kReduceColor;
  if (std::strcmp(e.op, "reduce_scatter") == 0) return kReduceScatterColor;
  if (std::strcmp(e.op, "pull") == 0) return kBroadcastColor;  // --mode async: weights from the server
  if (std::strcmp(e.op, "push") == 0) return kReduceColor;     // ... a gradient to it
  return kAllgatherColor;  // allgather; DataParallel's scatter and gather
}

std::string describe(const lab::Event& e) {
  std::string s;
  if (e.kind == lab::EventKind::Compute) s = e.op;
  else if (e.kind == lab::EventKind::Device)
    s = fmt("on the device, %s: %s%s%s", lab::phase_name(e.phase), e.op, e.tag >= 0 ? fmt(" (module %d)", e.tag).c_str() : "",
            e.bytes ? (", " + fmt_bytes(static_cast<double>(e.bytes))).c_str() : "");
  else if (e.kind == lab::EventKind::Collective)
    s = std::strcmp(e.op, "push") == 0
            ? fmt("push of iteration %lld's gradient, %s, staleness %d (updates the server applied since this "
                  "worker's pull)",
                  static_cast<long long>(e.train_step), fmt_bytes(static_cast<double>(e.bytes)).c_str(), e.tag)
            : fmt("%s #%llu %s%s, %s", e.op, static_cast<unsigned long long>(e.op_seq), e.what,
                  e.tag >= 0 ? fmt(" %d", e.tag).c_str() : "", fmt_bytes(static_cast<double>(e.bytes)).c_str());
  else
    s = fmt("%s chunk %d -> rank %d, %s (%s step %d)", e.op, e.chunk, e.dst, fmt_bytes(static_cast<double>(e.bytes)).c_str(),
            lab::phase_name(e.phase), e.ring_step);
  s += fmt("\n%.3f ms", (e.t_end - e.t_start) * 1e3);
  if (e.train_step >= 0) s += fmt(", iteration %lld", static_cast<long long>(e.train_step));
  return s;
}

}  // namespace

void draw_timeline_panel(const RunData& d, TimelineState& st) {
  const float fs = ImGui::GetFontSize();
  double t_last = 0;
  for (const auto& log : d.events)
    if (!log.empty()) t_last = std::max(t_last, log.back().t_end);
  ImGui::SetNextItemWidth(fs * 9);
  ImGui::SliderFloat("window", &st.window_s, 0.01f, 20.0f, "%.2f s", ImGuiSliderFlags_Logarithmic);
  tooltip("Seconds of the run shown, ending at the newest event.");
  ImGui::SameLine();
  ImGui::Checkbox("follow", &st.follow);
  tooltip("Keep the newest events at the right edge; off: drag the window to look back.");
  ImGui::SameLine();
  struct Entry {
    const char* name;
    ImU32 c;
  };
  const std::vector<Entry> compute = {{"forward", IM_COL32(86, 180, 233, 255)},
                                      {"backward", IM_COL32(40, 130, 220, 255)},
                                      {"optimizer", IM_COL32(0, 158, 115, 255)},
                                      {"eval", IM_COL32(150, 150, 150, 255)}};
  std::vector<Entry> legend = compute;
  const bool on_device = d.cfg.compute.device != "cpu";  // the device's own timeline under the host's
  if (on_device)
    legend.insert(legend.end(), {{"on the device: kernels", IM_COL32(43, 110, 150, 255)}, {"copies", kDeviceCopyColor}});
  if (d.caps().parameter_server)
    legend.insert(legend.end(), {{"pull (weights from the server)", kBroadcastColor},
                                 {"push (a gradient; tooltip: its staleness)", kReduceColor}});
  else if (d.caps().master_device)
    legend.insert(legend.end(), {{"replicate", kBroadcastColor},
                                 {"scatter / gather", kAllgatherColor},
                                 {"reduce", kReduceColor},
                                 {"one transfer (incl. waiting)", kChunkColor}});
  else if (d.caps().sharded_collectives)  // FSDP: the gradients reduce-scattered, the parameters gathered
    legend.insert(legend.end(), {{"reduce-scatter (gradients)", kReduceScatterColor},
                                 {"allgather (parameters)", kAllgatherColor},
                                 {"allreduce (no_shard)", kAllreduceColor},
                                 {"one chunk (incl. waiting)", kChunkColor}});
  else
    legend.insert(legend.end(), {{d.caps().averages_parameters ? "allreduce (and average)" : "allreduce", kAllreduceColor},
                                 {"broadcast", kBroadcastColor},
                                 {"allgather", kAllgatherColor},
                                 {"one chunk (incl. waiting)", kChunkColor}});
  ImDrawList* dl = ImGui::GetWindowDrawList();
  for (const auto& l : legend) {
    // wrap the legend when the next entry would not fit
    const float need = fs * 0.75f + ImGui::CalcTextSize(l.name).x + ImGui::GetStyle().ItemSpacing.x * 2;
    if (ImGui::GetCursorScreenPos().x + need > ImGui::GetWindowPos().x + ImGui::GetWindowContentRegionMax().x) ImGui::NewLine();
    const ImVec2 p = ImGui::GetCursorScreenPos();
    dl->AddRectFilled(ImVec2(p.x, p.y + fs * 0.25f), ImVec2(p.x + fs * 0.7f, p.y + fs * 0.85f), l.c);
    ImGui::Dummy(ImVec2(fs * 0.75f, fs));
    ImGui::SameLine();
    ImGui::TextUnformatted(l.name);
    ImGui::SameLine();
  }
  ImGui::NewLine();
  if (t_last <= 0) {
    const std::string none = nothing_recorded(d, "events", "");
    text_wrapped_colored(col::kDim, none);
    return;
  }
  if (st.follow) st.t_end = t_last;
  const double t1 = st.t_end, t0 = t1 - st.window_s;
  const int w = static_cast<int>(d.events.size());
  const ImVec2 size(ImGui::GetContentRegionAvail().x, std::max(fs * 2, ImGui::GetContentRegionAvail().y));
  const ImVec2 p0 = ImGui::GetCursorScreenPos();
  ImGui::InvisibleButton("timeline", size);
  const bool hovered = ImGui::IsItemHovered();
  if (ImGui::IsItemActive() && ImGui::IsMouseDragging(ImGuiMouseButton_Left)) {
    st.follow = false;
    st.t_end -= ImGui::GetIO().MouseDelta.x / size.x * st.window_s;
  }
  const float label_w = fs * 3.4f;
  const float lane_h = std::clamp((size.y - fs) / static_cast<float>(std::max(1, w)), fs * 0.6f, fs * 2.4f);
  auto X = [&](double t) { return p0.x + label_w + static_cast<float>((t - t0) / (t1 - t0)) * (size.x - label_w); };
  dl->AddRect(p0, ImVec2(p0.x + size.x, p0.y + size.y), col::kGrid);
  const ImVec2 mouse = ImGui::GetIO().MousePos;
  const lab::Event* hit = nullptr;
  dl->PushClipRect(p0, ImVec2(p0.x + size.x, p0.y + size.y), true);
  for (int r = 0; r < w; ++r) {
    const float y = p0.y + lane_h * static_cast<float>(r);
    dl->AddText(ImVec2(p0.x + 4, y + (lane_h - fs) / 2), rank_color(r), d.member(r).c_str());
    dl->AddLine(ImVec2(p0.x, y + lane_h), ImVec2(p0.x + size.x, y + lane_h), col::kGrid);
    const auto& log = d.events[static_cast<size_t>(r)];
    // Neighbouring bars of one colour in one band are drawn as one rectangle: at full speed
    // thousands of events fall within a few pixels, and Mesa's software renderer pays per
    // triangle. Touching or overlapping bars only, so the picture is the same.
    struct Bar {
      float xa = 0, xb = -1, ya = 0, yb = 0;
      ImU32 c = 0;
    } bars[4];
    auto flush = [&](Bar& b) {
      if (b.xb >= b.xa) dl->AddRectFilled(ImVec2(b.xa, b.ya), ImVec2(b.xb, b.yb), b.c);
      b.xb = b.xa - 1;
    };
    auto first = std::partition_point(log.begin(), log.end(), [&](const lab::Event& e) { return e.t_end < t0; });
    for (auto it = first; it != log.end(); ++it) {
      const lab::Event& e = *it;
      if (e.t_start > t1) continue;
      // compute: upper half (on a device: the host's view above, the device's own below it); whole
      // collectives: lower half; single chunks: thin ticks in the lower half
      float ya = y + 2, yb = y + lane_h * (on_device ? 0.28f : 0.5f) - 1;
      if (e.kind == lab::EventKind::Device) {
        ya = y + lane_h * 0.28f;
        yb = y + lane_h * 0.5f - 1;
      } else if (e.kind == lab::EventKind::Collective) {
        ya = y + lane_h * 0.5f + 1;
        yb = y + lane_h - 2;
      } else if (e.kind == lab::EventKind::Chunk) {
        ya = y + lane_h * 0.86f;
        yb = y + lane_h - 2;
      }
      const float xa = std::max(X(e.t_start), p0.x + label_w), xb = std::max(X(e.t_end), xa + 1);
      if (e.kind == lab::EventKind::Chunk && xb - xa < 2) continue;
      const ImU32 c = e.kind == lab::EventKind::Chunk ? kChunkColor : event_color(e);
      Bar& bar = bars[e.kind == lab::EventKind::Compute     ? 0
                      : e.kind == lab::EventKind::Collective ? 1
                      : e.kind == lab::EventKind::Chunk      ? 2
                                                             : 3];
      if (bar.xb >= bar.xa && bar.c == c && xa <= bar.xb && xb >= bar.xa) {
        bar.xa = std::min(bar.xa, xa);
        bar.xb = std::max(bar.xb, xb);
      } else {
        flush(bar);
        bar = {xa, xb, ya, yb, c};
      }
      if (hovered && mouse.x >= xa && mouse.x <= xb && mouse.y >= ya && mouse.y <= yb) hit = &e;
    }
    for (Bar& b : bars) flush(b);
  }
  dl->PopClipRect();
  if (hit) {
    ImGui::BeginTooltip();
    ImGui::Text("%s: %s", d.member(hit->rank).c_str(), describe(*hit).c_str());
    ImGui::EndTooltip();
  } else if (hovered) {
    tooltip(on_device ? "Upper half of a lane: compute as the host saw it (forward, backward, optimizer step), and "
                        "below it what the device did, timed by the device (each layer's kernels, the copies in grey). "
                        "Lower half: collectives; white ticks: single chunk transfers. Drag to look back."
                      : "Upper half of a lane: compute (forward, backward, optimizer step, evaluation). Lower half: "
                        "collectives; white ticks: single chunk transfers. DDP starts a bucket's allreduce during "
                        "backward, so they overlap. Drag to look back.");
  }
}

}  // namespace viz
