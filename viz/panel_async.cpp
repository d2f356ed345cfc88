// The allreduce view for --mode async: there is no allreduce. The workers sit on a circle round
// the parameter server; each worker's latest push is an arrow into the server, coloured by the
// gradient's staleness (how many updates the server applied between that worker's pull and its
// push). Beside it: the staleness of every push so far as a histogram, and per worker over its
// iterations.
#include <algorithm>
#include <cmath>

#include "draw.h"
#include "panels.h"

namespace viz {

namespace {

// green (fresh) to vermillion (stale), relative to the staleness a round robin would give
ImU32 staleness_color(int64_t s, int64_t scale) {
  const float t = scale > 0 ? std::min(1.0f, static_cast<float>(s) / static_cast<float>(scale)) : 0.0f;
  return mix(col::kGood, col::kError, t);
}

struct LastPush {
  bool valid = false;
  int64_t staleness = 0, step = 0;
  double t_end = 0;
};

}  // namespace

void draw_async_view(const RunData& d, AsyncViewState& st, const FrameClock& clock) {
  const int w = d.world();
  ImGui::TextWrapped("--mode async: %d workers and a parameter server. Each worker pulls the weights, computes a gradient "
                     "on its own batch and pushes it; the server applies every push at once (%s schedule), whatever the "
                     "other workers are doing. A gradient's staleness: the updates the server applied between the "
                     "worker's pull and its push.",
                     w, d.cfg.async_schedule == "seeded" ? ("a seeded, reproducible" + std::string(" (seed ") +
                                                             std::to_string(d.cfg.async_seed) + ")").c_str()
                                                         : "a free, first-come-first-served");
  // every push so far, from the workers' step records
  std::vector<int64_t> hist;
  int64_t pushes = 0, max_st = 0;
  double mean = 0;
  const int64_t last = d.steps_done() - 1;
  for (int64_t s = 0; s <= last; ++s)
    for (int r = 0; r < w; ++r)
      if (const lab::StepRecord* rec = d.record(s, r); rec && rec->staleness >= 0) {
        if (static_cast<size_t>(rec->staleness) >= hist.size()) hist.resize(static_cast<size_t>(rec->staleness) + 1, 0);
        ++hist[static_cast<size_t>(rec->staleness)];
        ++pushes;
        max_st = std::max(max_st, rec->staleness);
        mean += static_cast<double>(rec->staleness);
      }
  if (pushes) mean /= static_cast<double>(pushes);
  if (pushes == 0) {
    ImGui::Spacing();
    const std::string none = nothing_recorded(d, "pushes", "Press Play, or step (Shift+Right) while paused.");
    text_wrapped_colored(col::kDim, none);
    return;
  }
  // each worker's latest push (its event's tag is the staleness)
  std::vector<LastPush> lastp(static_cast<size_t>(w));
  for (int r = 0; r < w && r < static_cast<int>(d.events.size()); ++r)
    for (auto it = d.events[static_cast<size_t>(r)].rbegin(); it != d.events[static_cast<size_t>(r)].rend(); ++it)
      if (it->kind == lab::EventKind::Collective && std::string(it->op) == "push") {
        lastp[static_cast<size_t>(r)] = {true, it->tag, it->train_step, it->t_end};
        break;
      }
  const int64_t scale = std::max<int64_t>(w - 1, 1) * 2;  // twice a round robin's N - 1

  const ImVec2 avail = ImGui::GetContentRegionAvail();
  const float size = std::max(140.0f, std::min(avail.x * 0.45f, avail.y - ImGui::GetFontSize() * 5));
  const ImVec2 origin = ImGui::GetCursorScreenPos();
  ImDrawList* dl = ImGui::GetWindowDrawList();
  const ImVec2 c(origin.x + size * 0.5f, origin.y + size * 0.5f);
  const float radius = size * 0.38f, node = std::max(12.0f, size * 0.06f);
  // the server
  dl->AddCircleFilled(c, node * 1.5f, col::kPanel);
  dl->AddCircle(c, node * 1.5f, col::kGlobal, 0, 2.0f);
  const char* label = "server";
  const ImVec2 ls = ImGui::CalcTextSize(label);
  dl->AddText(ImVec2(c.x - ls.x * 0.5f, c.y - ls.y * 0.5f), col::kText, label);
  double newest = 0;
  for (const LastPush& p : lastp) newest = std::max(newest, p.t_end);
  for (int r = 0; r < w; ++r) {
    const float a = -1.5707964f + 6.2831855f * static_cast<float>(r) / static_cast<float>(w);
    const ImVec2 p(c.x + radius * std::cos(a), c.y + radius * std::sin(a));
    const LastPush& lp = lastp[static_cast<size_t>(r)];
    if (lp.valid) {
      const ImU32 colr = staleness_color(lp.staleness, scale);
      const float dx = c.x - p.x, dy = c.y - p.y, len = std::sqrt(dx * dx + dy * dy);
      const ImVec2 from(p.x + dx / len * node, p.y + dy / len * node);
      const ImVec2 to(c.x - dx / len * node * 1.6f, c.y - dy / len * node * 1.6f);
      // the newest push is drawn bold
      const float thick = lp.t_end >= newest ? 4.0f : 2.0f;
      dl->AddLine(from, to, colr, thick);
      const ImVec2 n(dx / len, dy / len);
      dl->AddTriangleFilled(to, ImVec2(to.x - n.x * 10 - n.y * 5, to.y - n.y * 10 + n.x * 5),
                            ImVec2(to.x - n.x * 10 + n.y * 5, to.y - n.y * 10 - n.x * 5), colr);
      const std::string s = fmt("staleness %lld", static_cast<long long>(lp.staleness));
      // the label beside the arrow's middle, clear of it: its centre moved off the arrow, at right
      // angles, by a gap plus half the label's extent in that direction
      const ImVec2 mid((from.x + to.x) * 0.5f, (from.y + to.y) * 0.5f);
      ImFont* small = font(FontId::Small);
      const ImVec2 tsz = small->CalcTextSizeA(small->FontSize, FLT_MAX, 0, s.c_str());
      const ImVec2 perp(-n.y, n.x);
      const float off = 6 + std::fabs(perp.x) * tsz.x * 0.5f + std::fabs(perp.y) * tsz.y * 0.5f;
      const ImVec2 at(mid.x + perp.x * off - tsz.x * 0.5f, mid.y + perp.y * off - tsz.y * 0.5f);
      dl->AddText(small, small->FontSize, at, colr, s.c_str());
    }
    dl->AddCircleFilled(p, node, rank_color(r));
    const std::string id = std::to_string(r);
    const ImVec2 ts = ImGui::CalcTextSize(id.c_str());
    dl->AddText(ImVec2(p.x - ts.x * 0.5f, p.y - ts.y * 0.5f), text_on(rank_color(r)), id.c_str());
  }
  (void)clock;
  ImGui::BeginGroup();
  ImGui::Dummy(ImVec2(size, size));
  ImGui::PushTextWrapPos(origin.x + size);
  ImGui::TextDisabled("arrows: each worker's latest push, coloured by its staleness from green (0) to vermillion "
                      "(%lld or more), as in the histogram; bold: the newest push",
                      static_cast<long long>(scale));
  ImGui::PopTextWrapPos();
  ImGui::EndGroup();
  ImGui::SameLine();

  // right: the histogram and the staleness over iterations
  ImGui::BeginGroup();
  heading("Staleness of every push so far");
  labeled_value("pushes", fmt_count(static_cast<double>(pushes)), "gradients the server applied (one per worker iteration)");
  ImGui::SameLine();
  labeled_value("mean", fmt("%.2f", mean), "mean staleness: updates applied between a worker's pull and its push");
  ImGui::SameLine();
  labeled_value("max", fmt("%lld", static_cast<long long>(max_st)), "the stalest gradient applied so far");
  const float hw = ImGui::GetContentRegionAvail().x, hh = ImGui::GetFontSize() * 7;
  const ImVec2 h0 = ImGui::GetCursorScreenPos();
  int64_t top = 1;
  for (int64_t v : hist) top = std::max(top, v);
  const float bw = hw / static_cast<float>(std::max<size_t>(hist.size(), 1));
  for (size_t k = 0; k < hist.size(); ++k) {
    const float bh = (hh - ImGui::GetFontSize()) * static_cast<float>(hist[k]) / static_cast<float>(top);
    const ImVec2 a(h0.x + bw * static_cast<float>(k) + 1, h0.y + hh - ImGui::GetFontSize() - bh);
    const ImVec2 b(h0.x + bw * static_cast<float>(k + 1) - 1, h0.y + hh - ImGui::GetFontSize());
    dl->AddRectFilled(a, b, staleness_color(static_cast<int64_t>(k), scale));
    if (bw > ImGui::GetFontSize() * 0.8f || k % 5 == 0) {
      const std::string t = std::to_string(k);
      dl->AddText(font(FontId::Small), font(FontId::Small)->FontSize, ImVec2(a.x, b.y + 1), col::kDim, t.c_str());
    }
  }
  ImGui::Dummy(ImVec2(hw, hh));
  ImGui::TextDisabled("pushes per staleness (0: nobody pushed in between; %d workers in round robin: %d)", w, w - 1);
  ImGui::PushStyleColor(ImGuiCol_Text, ImGui::GetStyleColorVec4(ImGuiCol_TextDisabled));
  ImGui::TextWrapped("What to notice: a push of staleness s carries a gradient computed on weights s updates older than "
                     "the ones the server adds it to (DDP's is always 0: every rank waits for the allreduce). Here "
                     "the mean is %.2f and the stalest was %lld updates late; the more workers, the staler.",
                     mean, static_cast<long long>(max_st));
  ImGui::PopStyleColor();

  // per worker over its iterations
  AsyncViewState::Cache& cc = st.cache;
  if (cc.world != w || cc.built > static_cast<size_t>(d.steps_done())) {
    cc = AsyncViewState::Cache{};
    cc.world = w;
    cc.x.resize(static_cast<size_t>(w));
    cc.y.resize(static_cast<size_t>(w));
  }
  for (int64_t s = static_cast<int64_t>(cc.built); s <= d.last_complete_step(); ++s) {
    cc.built = static_cast<size_t>(s + 1);
    for (int r = 0; r < w; ++r)
      if (const lab::StepRecord* rec = d.record(s, r); rec && rec->staleness >= 0) {
        cc.x[static_cast<size_t>(r)].push_back(static_cast<float>(s));
        cc.y[static_cast<size_t>(r)].push_back(static_cast<float>(rec->staleness));
      }
  }
  std::vector<ChartSeries> series;
  for (int r = 0; r < w; ++r) {
    ChartSeries cs;
    cs.name = d.member(r);
    cs.color = rank_color(r);
    cs.x = cc.x[static_cast<size_t>(r)].data();
    cs.y = cc.y[static_cast<size_t>(r)].data();
    cs.n = static_cast<int>(cc.x[static_cast<size_t>(r)].size());
    cs.dots = true;
    cs.markers = rank_color_is_repeat(r);
    series.push_back(cs);
  }
  ChartOptions o;
  o.id = "staleness";
  o.title = "staleness per worker iteration";
  o.size = ImVec2(0, std::max(ImGui::GetFontSize() * 8, ImGui::GetContentRegionAvail().y - ImGui::GetFontSize()));
  o.value_fmt = "%.0f";
  o.y_min = 0;
  o.legend = w <= 8;
  line_chart(o, series);
  ImGui::EndGroup();
}

}  // namespace viz
