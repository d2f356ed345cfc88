// View 6, memory: what each rank holds, by category (lab/core/memory.h), at one point of a step,
// and how it changes over the step. Per rank a stacked bar of the categories at the chosen point,
// with a tick where the ZeRO paper's formula puts its model states; below, the chosen rank's bytes
// at every point of the step as stacked columns (FSDP's gather-use-free pattern: the gathered
// parameters rise at each all-gather and fall at each free); beside them the formula with the
// live operands, and a table of the categories measured against it.
//
// The points come from the step records (a live run always; a run directory with
// --record-memory), else from summary.json (each rank's peak step).
//
// Sections: 1. colours and data  2. the bars  3. the step's curve  4. the formula and the table
// 5. the view
#include <algorithm>
#include <cmath>

#include "config.h"
#include "draw.h"
#include "memory.h"
#include "model.h"
#include "optim.h"
#include "panels.h"
#include "run.h"

namespace viz {

namespace {

// ---- 1. colours and data ----

// Okabe-Ito, one per category (memory.h's order).
constexpr ImU32 kCategoryColor[lab::kMemCategories] = {
    IM_COL32(0, 114, 178, 255),    // parameters: blue
    IM_COL32(230, 159, 0, 255),    // gradients: orange
    IM_COL32(204, 121, 167, 255),  // optimizer state: reddish purple
    IM_COL32(86, 180, 233, 255),   // activations: sky blue
    IM_COL32(240, 228, 66, 255),   // comm buffers: yellow
    IM_COL32(0, 158, 115, 255),    // gathered parameters: bluish green
};

const char* category_what(int c) {
  switch (c) {
    case lab::kMemParameters: return "the parameters the rank keeps between steps (FSDP sharded: its shards)";
    case lab::kMemGradients: return "gradients: the model's, and FSDP's sharded ones";
    case lab::kMemOptimizerState: return "momentum, Adam's exp_avg and exp_avg_sq (ZeRO, FSDP: of the rank's share only)";
    case lab::kMemActivations: return "what the train forward saved for backward, released as backward goes";
    case lab::kMemCommBuffers: return "DDP's gradient buckets; FSDP's padded flat gradient during its reduction";
    case lab::kMemGatheredParameters: return "FSDP's all-gathered parameters, from the all-gather to the free";
  }
  return "";
}

std::string fmt_mib(int64_t bytes) { return fmt("%.2f MiB", static_cast<double>(bytes) / (1024.0 * 1024.0)); }

// The step shown and every rank's points of it.
struct StepPoints {
  int64_t step = -1;
  std::string source;  // "iteration 12", "the peak iteration (summary.json)"
  std::vector<const std::vector<lab::MemorySample>*> ranks;  // per rank (nullptr: none)
  size_t points() const {
    for (const auto* p : ranks)
      if (p) return p->size();
    return 0;
  }
};

// Whether every rank has the points of `step` in the records.
bool complete(const RunData& d, int64_t step) {
  if (step < 0 || step >= d.steps_done()) return false;
  for (const lab::StepRecord& r : d.by_step[static_cast<size_t>(step)])
    if (r.rank < 0 || r.memory.empty()) return false;
  return true;
}

StepPoints step_points(const RunData& d, MemoryViewState& st) {
  StepPoints out;
  const int64_t newest = d.last_complete_step();
  int64_t oldest = -1;  // the oldest step that still has its points
  for (int64_t s = std::max<int64_t>(0, newest - RunData::kMemorySteps); s <= newest; ++s)
    if (complete(d, s)) {
      oldest = s;
      break;
    }
  if (oldest >= 0) {
    st.first_step = oldest;
    st.last_step = newest;
    int64_t s = st.follow || st.step < oldest || st.step > newest ? newest : st.step;
    while (s > oldest && !complete(d, s)) --s;
    if (complete(d, s)) {
      st.step = s;
      out.step = s;
      out.source = fmt("iteration %lld", static_cast<long long>(s));
      for (const lab::StepRecord& r : d.by_step[static_cast<size_t>(s)]) out.ranks.push_back(&r.memory);
      return out;
    }
  }
  st.first_step = st.last_step = -1;
  // an opened run without --record-memory: each rank's peak iteration from summary.json
  if (!d.summary.memory_peak_points.empty()) {
    for (const auto& p : d.summary.memory_peak_points) out.ranks.push_back(&p);
    out.step = d.summary.memory_peak_step.empty() ? -1 : d.summary.memory_peak_step[0];
    out.source = "each rank's peak iteration (summary.json; --record-memory keeps every one)";
  }
  return out;
}

// The formula's operands for the run's configuration.
struct Formula {
  lab::ZeroFormula z;
  std::vector<int64_t> psi_r;  // a mode that splits the model: each rank's Psi (Psi_r); empty otherwise
  int rank = -1;               // ... and the rank whose Psi_r z.psi is
  std::string optimizer;  // "Adam", "SGD with momentum", "SGD"
  std::string mode;       // "FSDP full_shard"
};

Formula formula_of(const RunData& d, MemoryViewState& st) {
  Formula f;
  const lab::RunConfig& c = d.cfg;
  const lab::ParallelMode* m = lab::find_mode(c.mode);
  f.z.stage = m ? m->zero_stage(c) : 0;
  const lab::OptimizerOptions o = lab::optimizer_options(c);
  f.z.k = lab::optimizer_bytes_per_parameter(!o.is_sgd(), o.sgd.momentum);
  f.optimizer = o.is_sgd() ? (o.sgd.momentum != 0 ? "SGD with momentum" : "SGD") : (o.kind == "adamw" ? "AdamW" : "Adam");
  f.z.world = c.world_size;
  if (st.psi_model != c.model) {  // Psi from the model itself (built once per model name)
    st.psi_model = c.model;
    st.psi = 0;
    try {
      auto model = lab::build_model(lab::model_options(c), 0);
      for (int64_t n : lab::param_numels(*model)) st.psi += n;
    } catch (const std::exception&) {
      st.psi = d.summary.parameters;
    }
  }
  f.z.psi = st.psi;
  // a pipeline's stages, tensor parallelism's slices: each rank's own parameters (built once per run)
  const std::string key = c.model + "|" + c.mode + "|" + std::to_string(c.world_size) + "|" + std::to_string(c.stages) +
                          "|" + std::to_string(c.dp) + "|" + std::to_string(c.tp) + "|" + c.balance;
  if (m && st.psi_r_key != key) {
    st.psi_r_key = key;
    st.psi_r.clear();
    try {
      for (int r = 0; r < c.world_size && m->rank_parameters(c, 0) >= 0; ++r) st.psi_r.push_back(m->rank_parameters(c, r));
    } catch (const std::exception&) {
      st.psi_r.clear();
    }
  }
  f.psi_r = st.psi_r;
  if (!f.psi_r.empty()) {
    f.rank = std::clamp(st.rank, 0, static_cast<int>(f.psi_r.size()) - 1);
    f.z.psi = f.psi_r[static_cast<size_t>(f.rank)];
  }
  f.mode = c.mode == "fsdp" ? "FSDP " + c.sharding_strategy : m ? m->title() : c.mode;
  return f;
}

// ---- 2. the bars ----

// Rank r's bar: the categories stacked left to right, scaled so that `scale` bytes fill `w`.
void rank_bar(ImDrawList* dl, ImVec2 p, float w, float h, const lab::MemoryBytes& b, double scale, int64_t formula,
              const std::string& who) {
  float x = p.x;
  const ImVec2 mouse = ImGui::GetIO().MousePos;
  for (int c = 0; c < lab::kMemCategories; ++c) {
    const float cw = static_cast<float>(static_cast<double>(b[c]) / scale * w);
    if (cw <= 0) continue;
    dl->AddRectFilled(ImVec2(x, p.y), ImVec2(x + cw, p.y + h), kCategoryColor[c]);
    if (cw > 3) dl->AddLine(ImVec2(x + cw - 1, p.y), ImVec2(x + cw - 1, p.y + h), col::kPanel);
    if (ImGui::IsWindowHovered() && mouse.x >= x && mouse.x < x + cw && mouse.y >= p.y && mouse.y < p.y + h)
      ImGui::SetTooltip("%s, %s: %s bytes (%s)\n%s", who.c_str(), lab::memory_category_name(c),
                        fmt_count(static_cast<double>(b[c])).c_str(), fmt_mib(b[c]).c_str(), category_what(c));
    x += cw;
  }
  // the formula's model states: a white tick
  if (formula > 0) {
    const float fx = p.x + static_cast<float>(static_cast<double>(formula) / scale * w);
    dl->AddLine(ImVec2(fx, p.y - 3), ImVec2(fx, p.y + h + 3), col::kGlobal, 2.0f);
  }
  const std::string t = fmt_mib(b.total());
  dl->AddText(ImVec2(x + 6, p.y + (h - ImGui::GetFontSize()) / 2), col::kText, t.c_str());
}

void legend() {
  for (int c = 0; c < lab::kMemCategories; ++c) {
    if (c) ImGui::SameLine(0, ImGui::GetFontSize());
    const ImVec2 p = ImGui::GetCursorScreenPos();
    const float s = ImGui::GetFontSize() * 0.8f;
    ImGui::GetWindowDrawList()->AddRectFilled(ImVec2(p.x, p.y + 2), ImVec2(p.x + s, p.y + 2 + s), kCategoryColor[c]);
    ImGui::Dummy(ImVec2(s, s));
    ImGui::SameLine(0, 4);
    ImGui::TextUnformatted(lab::memory_category_name(c));
    tooltip(category_what(c));
  }
}

// ---- 3. the step's curve ----

// A point's name short enough for a column: "AG 4" (all-gather of unit 4), "RS 4"
// (reduce-scatter), "AR 4" (allreduce); "start", "forward", "backward", "end" as they are.
std::string short_point(const std::string& p) {
  const std::pair<const char*, const char*> kinds[] = {
      {"all-gather ", "AG "}, {"reduce-scatter ", "RS "}, {"allreduce ", "AR "}};
  for (const auto& [long_name, short_name] : kinds) {
    const size_t at = p.find(long_name);
    if (at != std::string::npos) return short_name + p.substr(at + std::string(long_name).size());
  }
  return p;
}

// The chosen rank's points as stacked columns; the chosen point framed. Returns a clicked point
// (-1: none).
int step_columns(const std::vector<lab::MemorySample>& pts, int chosen, double scale, float height) {
  ImDrawList* dl = ImGui::GetWindowDrawList();
  const ImVec2 p0 = ImGui::GetCursorScreenPos();
  const float fs = ImGui::GetFontSize();
  const float axis_w = fs * 4.5f;
  const float w = std::max(100.0f, ImGui::GetContentRegionAvail().x - axis_w - fs);
  const float n = static_cast<float>(std::max<size_t>(1, pts.size()));
  const float slot = w / n, bar = std::max(2.0f, slot * 0.72f);
  const float base = p0.y + height;
  // y axis: four gridlines in MiB
  for (int g = 0; g <= 4; ++g) {
    const double v = scale * g / 4;
    const float y = base - static_cast<float>(v / scale) * height;
    dl->AddLine(ImVec2(p0.x + axis_w, y), ImVec2(p0.x + axis_w + w, y), col::kGrid);
    const std::string t = fmt_mib(static_cast<int64_t>(v));
    dl->AddText(font(FontId::Small), font(FontId::Small)->FontSize, ImVec2(p0.x, y - fs * 0.45f), col::kDim, t.c_str());
  }
  int clicked = -1;
  const ImVec2 mouse = ImGui::GetIO().MousePos;
  for (size_t i = 0; i < pts.size(); ++i) {
    const float x = p0.x + axis_w + slot * static_cast<float>(i) + (slot - bar) / 2;
    float y = base;
    for (int c = 0; c < lab::kMemCategories; ++c) {
      const float h = static_cast<float>(static_cast<double>(pts[i].bytes[c]) / scale) * height;
      if (h <= 0) continue;
      dl->AddRectFilled(ImVec2(x, y - h), ImVec2(x + bar, y), kCategoryColor[c]);
      y -= h;
    }
    if (static_cast<int>(i) == chosen)
      dl->AddRect(ImVec2(x - 2, y - 2), ImVec2(x + bar + 2, base + 2), col::kGlobal, 0, 0, 2.0f);
    // the point's number and short name under it when there is room, its whole name in its tooltip
    ImFont* sf = font(FontId::Small);
    const std::string num = fmt("%zu", i), name = short_point(pts[i].point);
    if (slot > fs * 1.2f || i % 5 == 0) dl->AddText(sf, sf->FontSize, ImVec2(x, base + 3), col::kDim, num.c_str());
    if (sf->CalcTextSizeA(sf->FontSize, FLT_MAX, 0, name.c_str()).x < slot - 2)
      dl->AddText(sf, sf->FontSize, ImVec2(x, base + 3 + sf->FontSize), static_cast<int>(i) == chosen ? col::kText : col::kDim,
                  name.c_str());
    const bool hover = ImGui::IsWindowHovered() && mouse.x >= x - (slot - bar) / 2 && mouse.x < x + bar + (slot - bar) / 2 &&
                       mouse.y >= p0.y && mouse.y < base;
    if (hover) {
      std::string t = fmt("point %zu: %s\ntotal %s\n", i, pts[i].point.c_str(), fmt_mib(pts[i].bytes.total()).c_str());
      for (int c = 0; c < lab::kMemCategories; ++c)
        if (pts[i].bytes[c]) t += fmt("  %s: %s\n", lab::memory_category_name(c), fmt_mib(pts[i].bytes[c]).c_str());
      ImGui::SetTooltip("%s(click to show this point in the bars)", t.c_str());
      if (ImGui::IsMouseClicked(0)) clicked = static_cast<int>(i);
    }
  }
  ImGui::Dummy(ImVec2(axis_w + w, height + fs * 2.2f));
  note_item("value", "memory: points of the step", true, fmt("%zu", pts.size()));
  return clicked;
}

// ---- 4. the formula and the table ----

void formula_text(const Formula& f, const lab::MemoryBytes& fb) {
  const lab::ZeroFormula& z = f.z;
  const std::string ops =
      f.rank >= 0 ? fmt("K = %d (%s), Psi_r = %s parameters: what rank %d holds of the model (its stage, its slices)",
                        z.k, f.optimizer.c_str(), fmt_count(static_cast<double>(z.psi)).c_str(), f.rank)
                  : fmt("K = %d (%s), Psi = %s parameters, N = %d", z.k, f.optimizer.c_str(),
                        fmt_count(static_cast<double>(z.psi)).c_str(), z.world);
  std::string value;
  switch (z.stage) {
    case 0: value = fmt("(8+%d) x %s", z.k, fmt_count(static_cast<double>(z.psi)).c_str()); break;
    case 1: value = fmt("8 x %s + %d x %s/%d", fmt_count(static_cast<double>(z.psi)).c_str(), z.k,
                        fmt_count(static_cast<double>(z.psi)).c_str(), z.world); break;
    case 2: value = fmt("4 x %s + (4+%d) x %s/%d", fmt_count(static_cast<double>(z.psi)).c_str(), z.k,
                        fmt_count(static_cast<double>(z.psi)).c_str(), z.world); break;
    default: value = fmt("(8+%d) x %s/%d", z.k, fmt_count(static_cast<double>(z.psi)).c_str(), z.world); break;
  }
  if (f.rank >= 0)
    ImGui::TextUnformatted(fmt("%s splits the model: rank %d's model states = (8+K)Psi_r", f.mode.c_str(), f.rank).c_str());
  else
    ImGui::TextUnformatted(fmt("ZeRO stage %d (%s): model states per rank = %s", z.stage, f.mode.c_str(), z.expression().c_str()).c_str());
  ImGui::TextUnformatted(fmt("  = %s = %s bytes (%s)", value.c_str(), fmt_count(static_cast<double>(fb.total())).c_str(),
                             fmt_mib(fb.total()).c_str()).c_str());
  ImGui::TextDisabled("  %s; fp32: parameters 4 bytes, gradients 4, optimizer K (0 SGD, 4 momentum, 8 Adam)%s", ops.c_str(),
                      z.stage == 3 ? "; plus the unit gathered at once" : "");
  note_item("value", "memory: formula", true, f.rank >= 0 ? std::string("(8+K)Psi_r") : z.expression());
}

void category_table(const lab::MemoryBytes& now, const lab::MemoryBytes& end, const lab::MemoryBytes& fb, int rank,
                    const std::string& point) {
  const ImGuiTableFlags tf = ImGuiTableFlags_BordersInnerH | ImGuiTableFlags_RowBg | ImGuiTableFlags_SizingFixedFit;
  if (!ImGui::BeginTable("memory_categories", 4, tf)) return;
  ImGui::TableSetupColumn("category");
  ImGui::TableSetupColumn(fmt("rank %d at \"%s\"", rank, point.c_str()).c_str());
  ImGui::TableSetupColumn("after the step");
  ImGui::TableSetupColumn("formula");
  ImGui::TableHeadersRow();
  for (int c = 0; c < lab::kMemCategories; ++c) {
    ImGui::TableNextRow();
    ImGui::TableNextColumn();
    ImGui::TextColored(ImGui::ColorConvertU32ToFloat4(kCategoryColor[c]), "%s", lab::memory_category_name(c));
    tooltip(category_what(c));
    ImGui::TableNextColumn();
    ImGui::TextUnformatted(fmt_mib(now[c]).c_str());
    tooltip(fmt_count(static_cast<double>(now[c])) + " bytes");
    ImGui::TableNextColumn();
    ImGui::TextUnformatted(fmt_mib(end[c]).c_str());
    tooltip(fmt_count(static_cast<double>(end[c])) + " bytes");
    ImGui::TableNextColumn();
    if (c <= lab::kMemOptimizerState) {
      ImGui::TextUnformatted(fmt_mib(fb[c]).c_str());
      const int64_t diff = end[c] - fb[c];
      tooltip(fmt_count(static_cast<double>(fb[c])) + " bytes; after the step: " + (diff >= 0 ? "+" : "") +
              fmt_count(static_cast<double>(diff)) +
              " (FSDP's padding of the last shard, ZeRO-1's whole-parameter partition, or stage 2's parameters "
              "freed between steps)");
    } else {
      ImGui::TextDisabled("-");
    }
  }
  ImGui::EndTable();
}

}  // namespace

// ---- 5. the view ----

void draw_memory_view(const RunData& d, MemoryViewState& st) {
  const StepPoints sp = step_points(d, st);
  const size_t n = sp.points();
  if (sp.ranks.empty() || n == 0) {
    ImGui::TextWrapped("%s", nothing_recorded(d, "memory points",
                                              "Each rank's bytes by category appear here after its first iteration.")
                                 .c_str());
    return;
  }
  const Formula f = formula_of(d, st);
  const lab::MemoryBytes fb = f.z.model_states();
  formula_text(f, fb);
  ImGui::Spacing();
  // which iteration, which point
  if (st.first_step >= 0 && st.last_step > st.first_step) {
    int s = static_cast<int>(sp.step);
    ImGui::SetNextItemWidth(ImGui::GetFontSize() * 14);
    if (ImGui::SliderInt("iteration", &s, static_cast<int>(st.first_step), static_cast<int>(st.last_step))) {
      st.step = s;
      st.follow = s == st.last_step;
    }
    note_item("slider", "iteration", true, fmt("%d", s));
    ImGui::SameLine();
    ImGui::Checkbox("follow", &st.follow);
    ImGui::SameLine();
  }
  // the point: chosen, or the step's highest on the chosen rank
  const int rank = std::clamp(st.rank, 0, static_cast<int>(sp.ranks.size()) - 1);
  const std::vector<lab::MemorySample>& mine = *sp.ranks[static_cast<size_t>(rank)];
  int top = 0;
  for (size_t i = 1; i < mine.size(); ++i)
    if (mine[i].bytes.total() > mine[static_cast<size_t>(top)].bytes.total()) top = static_cast<int>(i);
  int chosen = st.point < 0 ? top : std::min(st.point, static_cast<int>(mine.size()) - 1);
  ImGui::SetNextItemWidth(ImGui::GetFontSize() * 14);
  if (ImGui::SliderInt("point", &chosen, 0, static_cast<int>(mine.size()) - 1)) st.point = chosen;
  ImGui::SameLine();
  if (ImGui::SmallButton("peak")) st.point = -1;
  tooltip("Show the point of the step where this rank holds the most.");
  ImGui::SameLine();
  ImGui::Text("%s: \"%s\"%s", sp.source.c_str(), mine[static_cast<size_t>(chosen)].point.c_str(),
              chosen == top ? " (the step's peak)" : "");
  note_item("value", "memory: the point shown", true, mine[static_cast<size_t>(chosen)].point);

  // every rank's bar at the chosen point (a rank's point of the same index: the ranks' steps have
  // the same points), on one scale: the largest total of any rank's step
  double scale = 1;
  for (const auto* pts : sp.ranks)
    if (pts)
      for (const lab::MemorySample& s : *pts) scale = std::max(scale, static_cast<double>(s.bytes.total()));
  scale = std::max(scale, static_cast<double>(fb.total())) * 1.12;
  ImGui::Spacing();
  legend();
  ImGui::TextDisabled("white tick: the formula's model states (parameters + gradients + optimizer state)");
  ImDrawList* dl = ImGui::GetWindowDrawList();
  const float fs = ImGui::GetFontSize();
  const float label_w = fs * 4.5f, bar_h = fs * 1.3f;
  const float bar_w = std::max(100.0f, ImGui::GetContentRegionAvail().x - label_w - fs * 6);
  for (size_t r = 0; r < sp.ranks.size(); ++r) {
    const ImVec2 p = ImGui::GetCursorScreenPos();
    const auto* pts = sp.ranks[r];
    const std::string who = d.member(static_cast<int>(r));
    const bool sel = static_cast<int>(r) == rank;
    if (ImGui::Selectable(fmt("##rank%zu", r).c_str(), sel, 0, ImVec2(label_w - 4, bar_h))) st.rank = static_cast<int>(r);
    dl->AddText(ImVec2(p.x, p.y + (bar_h - fs) / 2), sel ? col::kText : col::kDim, who.c_str());
    ImGui::SameLine(label_w);
    const ImVec2 bp = ImGui::GetCursorScreenPos();
    if (pts && static_cast<size_t>(chosen) < pts->size())
      rank_bar(dl, bp, bar_w, bar_h, (*pts)[static_cast<size_t>(chosen)].bytes, scale,
               r < f.psi_r.size() ? [&] {
                 lab::ZeroFormula zr = f.z;
                 zr.psi = f.psi_r[r];
                 return zr.model_states().total();
               }()
                                  : fb.total(),
               who);
    ImGui::Dummy(ImVec2(bar_w + fs * 6, bar_h));
    note_item("value", "memory: " + who, true, pts && static_cast<size_t>(chosen) < pts->size()
                                    ? fmt_mib((*pts)[static_cast<size_t>(chosen)].bytes.total())
                                    : "");
  }
  ImGui::Spacing();
  ImGui::TextUnformatted(fmt("%s over the step (click a rank above for its own; a column for each point)",
                             d.member(rank).c_str()).c_str());
  const float chart_h = std::clamp(ImGui::GetContentRegionAvail().y * 0.45f, fs * 6, fs * 14);
  const int clicked = step_columns(mine, chosen, scale, chart_h);
  if (clicked >= 0) st.point = clicked;
  category_table(mine[static_cast<size_t>(chosen)].bytes, mine.back().bytes, fb, rank, mine[static_cast<size_t>(chosen)].point);
}

}  // namespace viz
