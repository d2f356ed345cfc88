// View 2, BatchNorm statistics. For one layer and channel: each rank's batch mean and variance next
// to the global ones (the statistics of all ranks' samples together, which SyncBatchNorm uses and
// local BatchNorm does not), and each rank's running statistics over time, with the DDP buffer
// broadcast from rank 0 marked. A twin run with the other BN mode (same seed, same data order)
// shows local and sync side by side.
//
// Sections: 1. series cache  2. one iteration's statistics  3. running statistics over time
//           4. the view
#include <algorithm>
#include <cmath>
#include <cstring>

#include "bn_stats.h"
#include "draw.h"
#include "panels.h"

namespace viz {

namespace {

// Per-rank statistics of one channel at one iteration.
struct ChannelStats {
  bool valid = false;
  std::vector<float> mean, var;       // the rank's own batch (local)
  std::vector<float> used_mean;       // what it normalized with
  std::vector<double> count;          // values per channel on the rank
  double global_mean = 0, global_var = 0, global_count = 0;
};

// The statistics of the concatenated global batch, from the ranks' own: count-weighted mean,
// and var = E[v_r + m_r^2] - mean^2 (biased, as BatchNorm normalizes with).
ChannelStats channel_stats(const RunData& d, int64_t step, int layer, int ch) {
  ChannelStats s;
  const int w = d.world();
  double total_bs = 0;
  for (int r = 0; r < w; ++r)
    if (const lab::StepRecord* rec = d.record(step, r)) total_bs += static_cast<double>(rec->batch_size);
  for (int r = 0; r < w; ++r) {
    const lab::StepRecord* rec = d.record(step, r);
    if (!rec || layer >= static_cast<int>(rec->bn.size())) return ChannelStats{};
    const lab::BnLayerRecord& b = rec->bn[static_cast<size_t>(layer)];
    // RunData keeps the rank's own statistics only where they differ from those used (SyncBN)
    const std::vector<float>& own_mean = b.local_mean.empty() ? b.batch_mean : b.local_mean;
    const std::vector<float>& own_var = b.local_var.empty() ? b.batch_var : b.local_var;
    if (ch >= static_cast<int>(own_mean.size()) || ch >= static_cast<int>(own_var.size())) return ChannelStats{};
    s.mean.push_back(own_mean[static_cast<size_t>(ch)]);
    s.var.push_back(own_var[static_cast<size_t>(ch)]);
    s.used_mean.push_back(b.batch_mean[static_cast<size_t>(ch)]);
    // With SyncBN `count` is the global count: this rank's share is proportional to its samples.
    const double n = d.cfg.bn == "sync" && total_bs > 0
                         ? static_cast<double>(b.count) * static_cast<double>(rec->batch_size) / total_bs
                         : static_cast<double>(b.count);
    s.count.push_back(n);
  }
  double sum_n = 0, sum_m = 0, sum_sq = 0;
  for (int r = 0; r < w; ++r) {
    sum_n += s.count[static_cast<size_t>(r)];
    sum_m += s.count[static_cast<size_t>(r)] * s.mean[static_cast<size_t>(r)];
    sum_sq += s.count[static_cast<size_t>(r)] *
              (s.var[static_cast<size_t>(r)] + static_cast<double>(s.mean[static_cast<size_t>(r)]) * s.mean[static_cast<size_t>(r)]);
  }
  if (sum_n <= 0) return ChannelStats{};
  s.global_count = sum_n;
  s.global_mean = sum_m / sum_n;
  s.global_var = sum_sq / sum_n - s.global_mean * s.global_mean;
  s.valid = true;
  return s;
}

// ---- 1. series cache: running statistics per rank over iterations, appended as steps arrive ----

void update_series(const RunData& d, int layer, int ch, BnViewState::Series& c) {
  const int w = d.world();
  if (c.layer != layer || c.channel != ch || c.world != w || c.built > d.by_step.size()) {
    c = BnViewState::Series{};
    c.layer = layer;
    c.channel = ch;
    c.world = w;
    c.running_mean.assign(static_cast<size_t>(w), {});
    c.running_var.assign(static_cast<size_t>(w), {});
    c.local_mean.assign(static_cast<size_t>(w), {});
    c.global_mean.assign(1, {});
  }
  // only complete steps (every rank recorded), so the arrays stay aligned
  const int64_t last = d.last_complete_step();
  for (int64_t s = static_cast<int64_t>(c.built); s <= last; ++s) {
    const lab::StepRecord* r0 = d.record(s, 0);
    c.built = static_cast<size_t>(s + 1);
    if (!r0 || layer >= static_cast<int>(r0->bn.size()) || r0->bn[static_cast<size_t>(layer)].running_mean.empty())
      continue;  // thinned or untracked
    const ChannelStats cs = channel_stats(d, s, layer, ch);
    if (!cs.valid) continue;
    c.x.push_back(static_cast<float>(s));
    for (int r = 0; r < w; ++r) {
      const lab::BnLayerRecord& b = d.record(s, r)->bn[static_cast<size_t>(layer)];
      c.running_mean[static_cast<size_t>(r)].push_back(b.running_mean[static_cast<size_t>(ch)]);
      c.running_var[static_cast<size_t>(r)].push_back(b.running_var[static_cast<size_t>(ch)]);
      c.local_mean[static_cast<size_t>(r)].push_back(cs.mean[static_cast<size_t>(r)]);
    }
    c.global_mean[0].push_back(static_cast<float>(cs.global_mean));
  }
}

// ---- 2. one iteration: a number line per statistic, a row per rank ----

// The value range a number line shows: the same for both columns when a twin is shown, so
// their spreads compare at a glance.
struct Range {
  float lo = 0, hi = 0;
  bool valid = false;
  void add(double v) {
    const float f = static_cast<float>(v);
    lo = valid ? std::min(lo, f) : f;
    hi = valid ? std::max(hi, f) : f;
    valid = true;
  }
};

void number_line(const RunData& d, const char* id, const char* what, const std::vector<float>& local, double global,
                 bool sync, int world, const std::string& explain, Range range) {
  ImDrawList* dl = ImGui::GetWindowDrawList();
  const float fs = ImGui::GetFontSize();
  const float row = fs * 1.15f;
  const ImVec2 size(ImGui::GetContentRegionAvail().x, row * static_cast<float>(world) + fs * 2.6f);
  const ImVec2 p0 = ImGui::GetCursorScreenPos();
  ImGui::InvisibleButton(id, size);
  const bool hovered = ImGui::IsItemHovered();
  dl->AddRect(p0, ImVec2(p0.x + size.x, p0.y + size.y), col::kGrid, 3);
  for (float v : local) range.add(v);
  range.add(global);
  float lo = range.lo, hi = range.hi;
  const float pad = std::max((hi - lo) * 0.15f, std::fabs(hi) * 1e-3f + 1e-6f);
  lo -= pad;
  hi += pad;
  const float left = p0.x + fs * 4.2f, right = p0.x + size.x - fs * 0.8f;
  auto X = [&](double v) { return left + static_cast<float>((v - lo) / (hi - lo)) * (right - left); };
  dl->AddText(ImVec2(p0.x + 4, p0.y + 2), col::kDim, what);
  ImFont* small = font(FontId::Small);
  const std::string lo_s = fmt("%.4g", lo), hi_s = fmt("%.4g", hi);
  const float axis_y = p0.y + fs * 1.3f + row * static_cast<float>(world);
  dl->AddLine(ImVec2(left, axis_y), ImVec2(right, axis_y), col::kGrid);
  dl->AddText(small, small->FontSize, ImVec2(left, axis_y), col::kDim, lo_s.c_str());
  const ImVec2 hs = small->CalcTextSizeA(small->FontSize, FLT_MAX, 0, hi_s.c_str());
  dl->AddText(small, small->FontSize, ImVec2(right - hs.x, axis_y), col::kDim, hi_s.c_str());
  const float gx = X(global);
  dl->AddLine(ImVec2(gx, p0.y + fs * 1.2f), ImVec2(gx, axis_y), col::kGlobal, 2.0f);
  dl->AddText(small, small->FontSize, ImVec2(gx + 3, p0.y + 2), col::kGlobal, "global");
  for (int r = 0; r < world && r < static_cast<int>(local.size()); ++r) {
    const float y = p0.y + fs * 1.25f + row * (static_cast<float>(r) + 0.5f);
    dl->AddText(small, small->FontSize, ImVec2(p0.x + 4, y - small->FontSize / 2), rank_color(r), d.member(r).c_str());
    const float x = X(local[static_cast<size_t>(r)]);
    dl->AddLine(ImVec2(left, y), ImVec2(right, y), IM_COL32(60, 60, 66, 255));
    if (sync) {
      // SyncBN: the rank's own statistic (hollow) is not used; it normalizes with the global one
      dl->AddCircle(ImVec2(x, y), row * 0.32f, rank_color(r), 0, 2.0f);
      dl->AddLine(ImVec2(x, y), ImVec2(gx, y), rank_color(r, 0.6f), 1.5f);
      dl->AddCircleFilled(ImVec2(gx, y), row * 0.3f, rank_color(r));
    } else {
      dl->AddCircleFilled(ImVec2(x, y), row * 0.34f, rank_color(r));
    }
  }
  if (hovered) {
    ImGui::BeginTooltip();
    ImGui::PushTextWrapPos(fs * 30);
    ImGui::TextUnformatted(explain.c_str());
    for (int r = 0; r < world && r < static_cast<int>(local.size()); ++r)
      ImGui::TextColored(rank_color_vec(r), "%s: %.6g  (global - own = %+.3g)", d.member(r).c_str(), local[static_cast<size_t>(r)],
                         global - local[static_cast<size_t>(r)]);
    ImGui::Text("global: %.6g", global);
    ImGui::PopTextWrapPos();
    ImGui::EndTooltip();
  }
}

void draw_iteration(const RunData& d, const ChannelStats& cs, int64_t step, int ch, const char* id, Range mean_range,
                    Range var_range) {
  const bool sync = d.cfg.bn == "sync" && d.world() > 1;
  const int w = d.world();
  std::string cnt;
  for (int r = 0; r < w; ++r) cnt += fmt("%s%.0f", r ? " + " : "", cs.count[static_cast<size_t>(r)]);
  number_line(d, fmt("%s_mean", id).c_str(), "batch mean", cs.mean, cs.global_mean, sync, w,
              fmt("Dots: each rank's own batch mean of channel %d at iteration %lld. White line: the global mean, "
                  "count-weighted over the ranks: sum(n_r x mean_r) / sum(n_r), n = %s = %.0f values.\n%s",
                  ch, static_cast<long long>(step), cnt.c_str(), cs.global_count,
                  sync ? "SyncBN normalizes every rank with the global statistics (filled dots on the line); the "
                         "rank's own (hollow) only goes into the global one."
                       : "Local BN: every rank normalizes with its own batch's statistics, so the same input gets a "
                         "different output on each rank."),
              mean_range);
  number_line(d, fmt("%s_var", id).c_str(), "batch variance (biased)", cs.var, cs.global_var, sync, w,
              fmt("Each rank's biased batch variance (divide by n) and the global one: sum(n_r x (var_r + mean_r^2)) / "
                  "sum(n_r) - global_mean^2 = %.6g.",
                  cs.global_var),
              var_range);
}

// ---- 3. running statistics over time ----

void draw_running(const RunData& d, BnViewState& st, BnViewState::Series& c, const char* id, float height) {
  std::vector<ChartSeries> series;
  const auto& data = st.show_var ? c.running_var : c.running_mean;
  for (int r = 0; r < c.world && r < static_cast<int>(data.size()); ++r) {
    ChartSeries s;
    s.name = d.member(r);
    s.color = rank_color(r);
    s.x = c.x.data();
    s.y = data[static_cast<size_t>(r)].data();
    s.n = static_cast<int>(c.x.size());
    s.markers = rank_color_is_repeat(r);
    series.push_back(s);
  }
  ChartOptions o;
  o.id = id;
  o.size = ImVec2(0, height);
  o.value_fmt = "%.6g";
  o.legend = c.world <= 8;
  // DDP's buffer broadcasts from rank 0: ticks where they happened (when few enough to see)
  int64_t broadcasts = 0;
  if (!d.events.empty()) {
    for (const lab::Event& e : d.events[0])
      if (e.kind == lab::EventKind::Collective && std::strcmp(e.what, "buffers") == 0 && e.train_step >= 0) {
        ++broadcasts;
        if (o.x_marks.size() < 200) o.x_marks.push_back(static_cast<float>(e.train_step));
      }
  }
  // only when they are far enough apart to tell (with broadcast_buffers there is one per iteration)
  const float span = c.x.empty() ? 1.0f : std::max(1.0f, c.x.back() - c.x.front());
  if (o.x_marks.size() >= 200 || ImGui::GetContentRegionAvail().x * 0.9f / span < 30) o.x_marks.clear();
  o.marks_label = "pink ticks: rank 0's buffers broadcast before that iteration's forward";
  o.hover_note = st.show_var ? "running_var = (1 - m) running_var + m x var_unbiased (m = BatchNorm momentum, 0.1)"
                             : "running_mean = (1 - m) running_mean + m x batch mean (m = BatchNorm momentum, 0.1). "
                               "Recorded after each rank's forward.";
  line_chart(o, series);
  // are all ranks' curves the same (SyncBN)? then only the top one is visible
  bool same = c.world > 1;
  for (int r = 1; same && r < c.world; ++r) same = data[static_cast<size_t>(r)] == data[0];
  std::string note;
  if (same) note = "All ranks hold the same running statistics (the lines coincide). ";
  if (d.caps().averages_parameters && d.world() > 1) note += "Local SGD averages the parameters, not these buffers. ";
  if (d.caps().master_device && d.world() > 1)
    note += "DataParallel: before each forward, replicate copies device 0's parameters and buffers to every device; "
            "each device updates its copy with its own chunk's statistics, and only device 0's survives (it is the "
            "module itself), so the others restart from it every iteration.";
  else if (d.cfg.broadcast_buffers && d.world() > 1)
    note += fmt("broadcast_buffers on: before each forward rank 0's buffers overwrite the others' (%lld broadcasts "
                "recorded); then every rank updates them with its own batch statistics.",
                static_cast<long long>(broadcasts));
  else if (d.world() > 1)
    note += "broadcast_buffers off: every rank keeps its own running statistics.";
  ImGui::PushStyleColor(ImGuiCol_Text, ImGui::GetStyleColorVec4(ImGuiCol_TextDisabled));
  ImGui::TextWrapped("%s", note.c_str());
  ImGui::PopStyleColor();
}

// A flash when rank 0's buffers were broadcast moments ago (live runs: event time is the run's
// clock, lab::now_seconds()).
void broadcast_flash(const RunData& d) {
  if (!d.live || d.events.empty() || d.world() < 2) return;
  for (auto it = d.events[0].rbegin(); it != d.events[0].rend(); ++it) {
    if (it->kind != lab::EventKind::Collective || std::strcmp(it->what, "buffers") != 0) continue;
    const double age = lab::now_seconds() - it->t_end;
    if (age < 1.5 && (d.phase == RunPhase::Paused || d.gate_delay_s > 0.05)) {
      ImGui::SameLine();
      ImGui::TextColored(ImGui::ColorConvertU32ToFloat4(IM_COL32(204, 121, 167, 255)),
                         "rank 0 -> all: buffers broadcast before iteration %lld", static_cast<long long>(it->train_step));
      tooltip("DDP broadcast_buffers: rank 0's running_mean, running_var and num_batches_tracked overwrite every "
              "rank's before the forward pass.");
    }
    return;
  }
}

// --record-bn in words: which iterations the charts have points for.
std::string recorded_steps(const std::string& policy) {
  if (policy == "all") return "every iteration recorded";
  if (policy == "off") return "not recorded: --record-bn off";
  if (policy == "auto")
    return fmt("every iteration of epoch 1 recorded, then every %lld-th", static_cast<long long>(lab::kBnAutoEvery));
  return "every " + policy + "-th iteration recorded";
}

void draw_run_column(const RunData& d, BnViewState& st, BnViewState::Series& cache, int64_t step, const char* id,
                     float chart_h, Range mean_range, Range var_range) {
  const bool sync = d.cfg.bn == "sync" && d.world() > 1;
  heading(fmt("bn=%s%s", d.cfg.bn.c_str(), d.world() == 1 ? " (one rank)" : "").c_str());
  ImGui::SameLine();
  ImGui::TextDisabled(sync                   ? "every rank normalizes with the global statistics"
                      : d.caps().master_device ? "every device normalizes with its own chunk's statistics (DataParallel)"
                                           : "every rank normalizes with its own batch's statistics");
  broadcast_flash(d);
  const ChannelStats cs = channel_stats(d, step, st.layer, st.channel);
  if (!cs.valid) ImGui::TextDisabled("no statistics for iteration %lld", static_cast<long long>(step));
  else draw_iteration(d, cs, step, st.channel, id, mean_range, var_range);
  update_series(d, st.layer, st.channel, cache);
  ImGui::TextUnformatted(st.show_var ? "running_var over iterations" : "running_mean over iterations");
  ImGui::SameLine();
  ImGui::TextDisabled("(%s)", recorded_steps(d.cfg.record_bn).c_str());
  tooltip("Which iterations keep their BatchNorm statistics in the run directory (--record-bn): the chart joins "
          "the recorded ones. The statistics move fastest in the first epoch.");
  draw_running(d, st, cache, fmt("%s_run", id).c_str(), chart_h);
}

}  // namespace

// ---- 4. the view ----

void draw_batchnorm_view(const RunData& d, const RunData* twin, BnViewState& st, Commands& cmd) {
  const int64_t last = d.bn_step_at_or_before(d.last_complete_step());
  const lab::StepRecord* rec = d.record(std::max<int64_t>(last, 0), 0);
  if (last < 0 || !rec || rec->bn.empty()) {
    ImGui::PushStyleColor(ImGuiCol_Text, ImGui::GetStyleColorVec4(ImGuiCol_TextDisabled));
    ImGui::TextWrapped(
        "This view shows what BatchNorm computes on every rank: for one channel of one layer, each rank's batch mean "
        "and variance next to the global ones (all ranks' samples together), and each rank's running statistics over "
        "time. With local BN (DDP's default) every rank normalizes with its own batch; with SyncBN all use the global "
        "statistics. A twin run trains the other mode on the same data to compare them side by side.");
    ImGui::PopStyleColor();
    if (d.phase == RunPhase::Failed) text_wrapped_colored(col::kError, d.error);
    else if (d.cfg.record_bn == "off" && d.last_complete_step() >= 0)
      ImGui::TextDisabled("This run kept no BatchNorm statistics (--record-bn off).");
    else if (d.opened())
      ImGui::TextDisabled("This run directory holds no BatchNorm statistics: no iteration finished, or bn_stats.bin "
                          "is missing.");
    else ImGui::TextDisabled("No iteration finished yet: the statistics appear after the first forward pass.");
    return;
  }
  // layer and channel
  const int layers = static_cast<int>(rec->bn.size());
  st.layer = std::clamp(st.layer, 0, layers - 1);
  const lab::BnLayerRecord& L = rec->bn[static_cast<size_t>(st.layer)];
  const int channels = static_cast<int>(L.batch_mean.size());
  st.channel = std::clamp(st.channel, 0, std::max(0, channels - 1));
  ImGui::SetNextItemWidth(ImGui::GetFontSize() * 15);
  const std::string cur = fmt("module %s: %s(%d)", L.layer.c_str(), d.cfg.model == "cnn" ? "BatchNorm2d" : "BatchNorm1d", channels);
  if (ImGui::BeginCombo("layer", cur.c_str())) {
    for (int i = 0; i < layers; ++i) {
      const lab::BnLayerRecord& b = rec->bn[static_cast<size_t>(i)];
      const std::string name = fmt("module %s: %s(%zu)", b.layer.c_str(), d.cfg.model == "cnn" ? "BatchNorm2d" : "BatchNorm1d",
                                   b.batch_mean.size());
      if (ImGui::Selectable(name.c_str(), i == st.layer)) st.layer = i;
    }
    ImGui::EndCombo();
  }
  tooltip("The BatchNorm layers, by their index in the model (the prefix of their state_dict names, e.g. "
          "'2.running_mean').");
  ImGui::SameLine();
  ImGui::SetNextItemWidth(ImGui::GetFontSize() * 10);
  ImGui::SliderInt("channel", &st.channel, 0, std::max(0, channels - 1));
  tooltip(fmt("Statistics are per channel, over n = %lld values (batch x height x width).", static_cast<long long>(L.count)));
  ImGui::SameLine();
  ImGui::Checkbox("newest", &st.follow);
  tooltip("Show the newest iteration; off: choose one.");
  if (!st.follow) {
    ImGui::SameLine();
    int s = static_cast<int>(std::clamp<int64_t>(st.step, 0, last));
    ImGui::SetNextItemWidth(ImGui::GetFontSize() * 10);
    if (ImGui::SliderInt("iteration", &s, 0, static_cast<int>(last))) st.step = s;
  }
  ImGui::SameLine();
  ImGui::Checkbox("variance", &st.show_var);
  tooltip("Charts: running_var instead of running_mean.");
  int64_t step = st.follow ? last : std::clamp<int64_t>(st.step, 0, last);
  if (st.follow) st.step = step;
  const int64_t chosen = step;
  step = std::max<int64_t>(d.bn_step_at_or_before(step), 0);
  if (step != chosen)
    ImGui::TextDisabled("iteration %lld (the newest recorded at or before %lld: %s)", static_cast<long long>(step),
                        static_cast<long long>(chosen), recorded_steps(d.cfg.record_bn).c_str());
  else
    ImGui::TextDisabled("iteration %lld", static_cast<long long>(step));
  note_item("value", "iteration", true, std::to_string(step));

  const bool two = twin != nullptr;
  const int64_t tstep = two ? twin->bn_step_at_or_before(std::min(step, twin->last_complete_step())) : -1;
  Range mean_range, var_range;
  if (two && tstep >= 0) {
    for (const RunData* r : {&d, twin}) {
      const ChannelStats cs = channel_stats(*r, r == twin ? tstep : step, st.layer, st.channel);
      if (!cs.valid) continue;
      for (float v : cs.mean) mean_range.add(v);
      for (float v : cs.var) var_range.add(v);
      mean_range.add(cs.global_mean);
      var_range.add(cs.global_var);
    }
  }
  const float chart_h = std::max(ImGui::GetFontSize() * 7,
                                 ImGui::GetContentRegionAvail().y - ImGui::GetFontSize() * (2.6f * 2 + 2.4f) -
                                     ImGui::GetFontSize() * 1.15f * 2 * static_cast<float>(d.world()) - ImGui::GetFontSize() * 4);
  if (two && ImGui::BeginTable("bn_twins", 2, ImGuiTableFlags_BordersInnerV)) {
    ImGui::TableNextColumn();
    draw_run_column(d, st, st.cache[0], step, "bn_main", chart_h, mean_range, var_range);
    ImGui::TableNextColumn();
    if (tstep < 0) {
      heading(fmt("bn=%s (twin)", twin->cfg.bn.c_str()).c_str());
      ImGui::TextDisabled("the twin run has not finished an iteration yet (%s)", run_phase_name(twin->phase));
    } else {
      draw_run_column(*twin, st, st.cache[1], tstep, "bn_twin", chart_h, mean_range, var_range);
      if (tstep != step) ImGui::TextDisabled("(the twin is at iteration %lld)", static_cast<long long>(tstep));
    }
    ImGui::EndTable();
  } else {
    draw_run_column(d, st, st.cache[0], step, "bn_main", chart_h, Range{}, Range{});
    if (d.live && d.world() > 1 && d.caps().sync_bn) {  // the twin trains the other BatchNorm mode
      if (ImGui::Button(fmt("Compare: start a twin run with bn=%s", d.cfg.bn == "sync" ? "local" : "sync").c_str()))
        cmd.compare_bn = true;
      tooltip("Same seed, same data order, the other BatchNorm mode, stepped together with this run.");
    }
  }
}

}  // namespace viz
