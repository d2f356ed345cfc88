// Loss and accuracy per rank: every rank trains on its own shard, so its batch loss differs even
// though all ranks hold the same weights (DDP keeps them equal).
#include <algorithm>

#include "draw.h"
#include "panels.h"

namespace viz {

namespace {

void smooth_into(const std::vector<float>& raw, int k, size_t from, std::vector<float>& out) {
  out.resize(raw.size());
  for (size_t i = from; i < raw.size(); ++i) {
    const size_t a = i + 1 >= static_cast<size_t>(k) ? i + 1 - static_cast<size_t>(k) : 0;
    double s = 0;
    for (size_t j = a; j <= i; ++j) s += raw[j];
    out[i] = static_cast<float>(s / static_cast<double>(i - a + 1));
  }
}

void update(const RunData& d, RanksViewState& st) {
  RanksViewState::Cache& c = st.cache;
  const int w = d.world();
  if (c.world != w || c.built > d.by_step.size() || c.smooth != st.smooth) {
    const bool only_smooth = c.world == w && c.built <= d.by_step.size();
    if (only_smooth) {
      c.smooth = st.smooth;
      for (int r = 0; r < w; ++r) {
        smooth_into(c.loss[static_cast<size_t>(r)], c.smooth, 0, c.loss_s[static_cast<size_t>(r)]);
        smooth_into(c.acc[static_cast<size_t>(r)], c.smooth, 0, c.acc_s[static_cast<size_t>(r)]);
      }
    } else {
      c = RanksViewState::Cache{};
      c.world = w;
      c.smooth = st.smooth;
      c.loss.assign(static_cast<size_t>(w), {});
      c.acc.assign(static_cast<size_t>(w), {});
      c.loss_s.assign(static_cast<size_t>(w), {});
      c.acc_s.assign(static_cast<size_t>(w), {});
    }
  }
  const size_t from = c.x.size();
  const int64_t last = d.last_complete_step();
  for (int64_t s = static_cast<int64_t>(c.built); s <= last; ++s) {
    c.built = static_cast<size_t>(s + 1);
    c.x.push_back(static_cast<float>(s));
    for (int r = 0; r < w; ++r) {
      const lab::StepRecord* rec = d.record(s, r);
      c.loss[static_cast<size_t>(r)].push_back(rec ? rec->loss : 0.0f);
      c.acc[static_cast<size_t>(r)].push_back(rec && rec->batch_size ? static_cast<float>(rec->correct) / static_cast<float>(rec->batch_size) : 0.0f);
    }
  }
  if (c.x.size() != from)
    for (int r = 0; r < w; ++r) {
      smooth_into(c.loss[static_cast<size_t>(r)], c.smooth, from, c.loss_s[static_cast<size_t>(r)]);
      smooth_into(c.acc[static_cast<size_t>(r)], c.smooth, from, c.acc_s[static_cast<size_t>(r)]);
    }
}

}  // namespace

void draw_ranks_panel(const RunData& d, RanksViewState& st) {
  update(d, st);
  const RanksViewState::Cache& c = st.cache;
  const float fs = ImGui::GetFontSize();
  ImGui::SetNextItemWidth(fs * 7);
  ImGui::SliderInt("smooth", &st.smooth, 1, 100, "%d iterations");
  tooltip("Moving average over this many iterations (1: the raw batch values).");
  if (c.world > 0 && !c.x.empty()) {
    ImGui::SameLine();
    const size_t i = c.x.size() - 1;
    std::string s;
    for (int r = 0; r < (d.caps().master_device ? std::min(1, c.world) : c.world); ++r)
      s += fmt("%s: loss %.4f, accuracy %.3f\n", d.member(r).c_str(), c.loss[static_cast<size_t>(r)][i], c.acc[static_cast<size_t>(r)][i]);
    ImGui::TextDisabled("iteration %lld", static_cast<long long>(c.x.back()));
    tooltip("Each rank's batch loss and accuracy at this iteration (its own samples):\n" + s);
  }
  // DataParallel: device 0 computes the loss and accuracy over the whole global batch; the other
  // devices only run their chunk's forward and backward, so they have none of their own.
  const bool dp = d.caps().master_device;
  const float h = std::max(fs * 4, (ImGui::GetContentRegionAvail().y - fs * (dp ? 4.6f : 3.4f)) / 2);
  if (dp) {
    ImGui::PushStyleColor(ImGuiCol_Text, ImGui::GetStyleColorVec4(ImGuiCol_TextDisabled));
    ImGui::TextWrapped("DataParallel: only device 0 has a loss, over the whole batch");
    ImGui::PopStyleColor();
  }
  std::vector<ChartSeries> loss, acc;
  for (int r = 0; r < (dp ? std::min(1, c.world) : c.world); ++r) {
    const int n = static_cast<int>(c.x.size());
    loss.push_back({d.member(r), rank_color(r), c.x.data(), c.loss_s[static_cast<size_t>(r)].data(), n, 1.5f, false, rank_color_is_repeat(r)});
    acc.push_back({d.member(r), rank_color(r), c.x.data(), c.acc_s[static_cast<size_t>(r)].data(), n, 1.5f, false, rank_color_is_repeat(r)});
  }
  ChartOptions o;
  o.id = "ranks_loss";
  o.size = ImVec2(0, h);
  o.legend = false;
  o.y_min = 0;
  o.hover_note = "Training loss of each rank's own batch (cross-entropy, mean over the batch).";
  ImGui::TextUnformatted("training loss per rank");
  line_chart(o, loss);
  o.id = "ranks_acc";
  o.y_max = 1;
  o.value_fmt = "%.3f";
  o.hover_note = "Accuracy of each rank's own batch: correct / batch size.";
  ImGui::TextUnformatted("training accuracy per rank");
  line_chart(o, acc);
}

}  // namespace viz
