// View 8, grid: the ranks of a run placed on the grid of parallelism (lab/comm/group_transport.h:
// D data-parallel replicas x P pipeline stages x T tensor slices, Megatron-LM's placement world
// rank = t + T (d + D p)). One row per replica, one box per stage holding its slices' ranks; the
// groups drawn between them: a stage's slices (tensor parallelism: the layers' activations and
// input gradients, allreduced), neighbouring stages (pipeline: activations and their gradients,
// point to point), the same position in every replica (data parallelism: the gradients,
// allreduced); each with the bytes its messages carried in the iteration shown. Below, a table per
// kind of group: how many, their members, what the trace says travels in them, and the bytes.
// DDP, ZeRO and FSDP are one data-parallel group of the whole world.
//
// Sections: 1. data  2. the diagram  3. the view
#include <algorithm>
#include <map>
#include <set>
#include <string>

#include "config.h"
#include "draw.h"
#include "grid_draw.h"
#include "panels.h"

namespace viz {

// ---- 1. data ----

lab::GridShape run_grid(const lab::RunConfig& c) {
  lab::GridShape g;
  const int world = std::max(1, c.world_size);
  if (c.mode == "pipeline") {
    g.dp = std::max(1, c.dp);
    g.tp = std::max(1, c.tp);
    g.pp = c.stages > 0 ? c.stages : std::max(1, world / (g.dp * g.tp));
  } else if (c.mode == "tensor") {
    g.dp = std::max(1, c.dp);
    g.tp = c.tp > 0 ? c.tp : std::max(1, world / g.dp);
  } else {
    g.dp = world;  // the whole world is one data-parallel group
  }
  if (g.size() != world) g = lab::GridShape{world, 1, 1};  // (a config validate() would refuse)
  return g;
}

namespace {

constexpr int kDp = kGridDp, kPp = kGridPp, kTp = kGridTp, kKinds = kGridKinds;
const char* kKindName[kKinds] = {"dp", "pp", "tp"};
const ImU32 kKindColor[kKinds] = {IM_COL32(230, 159, 0, 255), IM_COL32(0, 114, 178, 255), IM_COL32(0, 158, 115, 255)};

// Which kind of group an event's group name is: "dp", "pp", "tp"; a message over the whole world
// ("") belongs to the grid's only axis of more than one rank (DDP's world is its data-parallel
// group); -1 where the world has several.
int kind_of(const char* group, const lab::GridShape& g) {
  const std::string s = group ? group : "";
  for (int k = 0; k < kKinds; ++k)
    if (s == kKindName[k]) return k;
  if (!s.empty()) return -1;
  const int axes = (g.dp > 1) + (g.pp > 1) + (g.tp > 1);
  if (axes != 1) return -1;
  return g.dp > 1 ? kDp : g.pp > 1 ? kPp : kTp;
}

// The group of `kind` that `rank` belongs to, as an index: dp (p, t), pp (d, t), tp (d, p).
int group_index(int kind, int rank, const lab::GridShape& g) {
  const lab::GridCoords c = g.coords(rank);
  if (kind == kDp) return c.p * g.tp + c.t;
  if (kind == kPp) return c.d * g.tp + c.t;
  return c.p * g.dp + c.d;
}

GridTraffic traffic_of(const RunData& d, const lab::GridShape& g, int64_t step) {
  GridTraffic t;
  for (const auto& rank_events : d.events)
    for (const lab::Event& e : rank_events) {
      if (e.train_step != step) continue;
      if (e.kind != lab::EventKind::Chunk && e.kind != lab::EventKind::Collective) continue;
      const int k = kind_of(e.group, g);
      if (k >= 0 && e.what && e.what[0]) t.what[k].insert(e.what);
      if (e.kind != lab::EventKind::Chunk || e.src < 0 || e.dst < 0 || e.src >= g.size() || e.dst >= g.size()) continue;
      if (k < 0) {
        t.other += e.bytes;
        continue;
      }
      t.bytes[k][group_index(k, e.src, g)] += e.bytes;
      if (k == kPp) t.pairs[{std::min(e.src, e.dst), std::max(e.src, e.dst)}] += e.bytes;
    }
  return t;
}

// ---- 2. the diagram ----

std::string members_text(const std::vector<int>& m) {
  std::string s;
  for (int r : m) s += (s.empty() ? "" : ", ") + std::to_string(r);
  return s;
}

}  // namespace

void draw_rank_grid(const lab::GridShape& g, const GridTraffic& t) {
  ImDrawList* dl = ImGui::GetWindowDrawList();
  const float fs = ImGui::GetFontSize();
  const ImVec2 p0 = ImGui::GetCursorScreenPos();
  const ImVec2 mouse = ImGui::GetMousePos();
  const float cw = fs * 4.6f, ch = fs * 2.0f, pad = fs * 0.45f, gx = fs * 7.0f, gy = fs * 2.6f, left = fs * 6.0f;
  const float box_w = static_cast<float>(g.tp) * cw + pad * 2, box_h = ch + pad * 2;
  auto box = [&](int d, int p) {
    return ImVec2(p0.x + left + static_cast<float>(p) * (box_w + gx), p0.y + fs * 1.4f + static_cast<float>(d) * (box_h + gy));
  };
  auto bytes_of = [&](int kind, int index) {
    const auto it = t.bytes[kind].find(index);
    return it == t.bytes[kind].end() ? std::string("-") : fmt_bytes(static_cast<double>(it->second));
  };
  for (int p = 0; p < g.pp; ++p)
    dl->AddText(ImVec2(box(0, p).x, p0.y), col::kDim, g.pp > 1 ? fmt("stage %d", p).c_str() : "");
  std::string hovered;
  for (int d = 0; d < g.dp; ++d) {
    const ImVec2 row = box(d, 0);
    dl->AddText(ImVec2(p0.x, row.y + (box_h - fs) / 2), col::kDim, g.dp > 1 ? fmt("replica %d", d).c_str() : "");
    for (int p = 0; p < g.pp; ++p) {
      const ImVec2 b = box(d, p);
      if (g.tp > 1) {  // the stage's slices: one tensor-parallel group (its bytes right of it, below the middle)
        dl->AddRect(b, ImVec2(b.x + box_w, b.y + box_h), kKindColor[kTp], 5.0f, 0, 2.0f);
        const std::string s = "tp " + bytes_of(kTp, p * g.dp + d);
        dl->AddText(ImVec2(b.x + box_w + fs * 0.3f, b.y + box_h / 2 + fs * 0.15f), kKindColor[kTp], s.c_str());
      }
      for (int s = 0; s < g.tp; ++s) {
        const int r = g.rank_of({d, p, s});
        const ImVec2 a(b.x + pad + static_cast<float>(s) * cw, b.y + pad);
        const ImVec2 z(a.x + cw - fs * 0.3f, a.y + ch);
        dl->AddRectFilled(a, z, with_alpha(rank_color(r), 0.35f), 4.0f);
        dl->AddRect(a, z, rank_color(r), 4.0f, 0, 1.5f);
        const std::string label = fmt("rank %d", r);
        const ImVec2 ts = ImGui::CalcTextSize(label.c_str());
        dl->AddText(ImVec2((a.x + z.x - ts.x) / 2, a.y + (ch - ts.y) / 2), col::kText, label.c_str());
        if (ImGui::IsWindowHovered() && mouse.x >= a.x && mouse.x < z.x && mouse.y >= a.y && mouse.y < z.y) {
          hovered = fmt("rank %d: replica %d, stage %d, slice %d", r, d, p, s);
          if (g.dp > 1) hovered += "\ndata-parallel group (its gradients): ranks " + members_text(g.data_group(r));
          if (g.pp > 1) hovered += "\npipeline (its activations): ranks " + members_text(g.pipeline_group(r));
          if (g.tp > 1) hovered += "\ntensor-parallel group (its layers' slices): ranks " + members_text(g.tensor_group(r));
        }
      }
      if (p + 1 < g.pp) {  // the pipeline's neighbours: a link per slice
        const float y = b.y + box_h / 2, x0 = b.x + box_w, x1 = box(d, p + 1).x;
        dl->AddLine(ImVec2(x0, y), ImVec2(x1, y), kKindColor[kPp], 2.0f);
        dl->AddTriangleFilled(ImVec2(x1, y), ImVec2(x1 - fs * 0.5f, y - fs * 0.3f), ImVec2(x1 - fs * 0.5f, y + fs * 0.3f),
                              kKindColor[kPp]);
        uint64_t sum = 0;
        for (int s = 0; s < g.tp; ++s) {
          const int a = g.rank_of({d, p, s}), c = g.rank_of({d, p + 1, s});
          const auto it = t.pairs.find({std::min(a, c), std::max(a, c)});
          if (it != t.pairs.end()) sum += it->second;
        }
        const std::string s = sum ? fmt_bytes(static_cast<double>(sum)) : std::string("-");
        const ImVec2 ts = ImGui::CalcTextSize(s.c_str());
        dl->AddText(ImVec2((x0 + x1 - ts.x) / 2, y - fs * 1.2f), kKindColor[kPp], s.c_str());
      }
    }
  }
  if (g.dp > 1)  // each position's data-parallel group, down its column
    for (int p = 0; p < g.pp; ++p)
      for (int s = 0; s < g.tp; ++s) {
        const ImVec2 top = box(0, p), bottom = box(g.dp - 1, p);
        const float x = top.x + pad + static_cast<float>(s) * cw + cw * 0.5f;
        dl->AddLine(ImVec2(x, top.y + box_h - pad), ImVec2(x, bottom.y + pad), with_alpha(kKindColor[kDp], 0.8f), 2.0f);
        // its bytes beside the line, in the gap below replica 0 (slices alternate above and below)
        const std::string b = bytes_of(kDp, p * g.tp + s);
        const float gap_top = top.y + box_h, y = gap_top + (s % 2 == 0 ? fs * 0.2f : gy - fs * 1.2f);
        dl->AddText(ImVec2(x + fs * 0.25f, y), kKindColor[kDp], b.c_str());
      }
  ImGui::Dummy(ImVec2(left + static_cast<float>(g.pp) * (box_w + gx),
                      fs * 1.4f + static_cast<float>(g.dp) * (box_h + gy) - gy + fs * 0.6f));
  if (!hovered.empty()) ImGui::SetTooltip("%s", hovered.c_str());
}

GridTraffic grid_traffic(const RunData& d, const lab::GridShape& g, int64_t step) { return traffic_of(d, g, step); }

// ---- 3. the view ----

// What the view draws from the events, made again only when the run or the iteration shown
// changes (an iteration's events are all in once every rank's record of it is).
struct GridViewCache {
  uint64_t run = 0, events_version = 0;
  int64_t step = -2;
  GridTraffic traffic;
};

void draw_grid_view(const RunData& d, GridViewState& st) {
  const lab::RunConfig& c = d.cfg;
  const lab::GridShape g = run_grid(c);
  const int64_t newest = d.last_complete_step();
  iteration_picker(st.follow, st.step, newest);
  if (!st.cache) st.cache = std::make_shared<GridViewCache>();
  GridViewCache& cache = *st.cache;
  if (cache.run != d.identity || cache.step != st.step ||
      (cache.traffic.empty() && cache.events_version != d.events_version)) {
    cache.run = d.identity;
    cache.step = st.step;
    cache.events_version = d.events_version;
    cache.traffic = st.step >= 0 ? traffic_of(d, g, st.step) : GridTraffic{};
  }
  const GridTraffic& t = cache.traffic;
  note_item("value", "grid: shape", true, fmt("%d x %d x %d", g.dp, g.pp, g.tp));

  heading(fmt("%d rank%s: %d data-parallel x %d pipeline x %d tensor-parallel", g.size(), g.size() == 1 ? "" : "s",
              g.dp, g.pp, g.tp)
              .c_str());
  help_marker("Megatron-LM's placement: world rank = t + T (d + D p). A layer's slices (t) sit on neighbouring ranks "
              "(inside one machine, where the link is fastest: they talk in every layer), then the data-parallel "
              "replicas (d), then the pipeline stages (p). Two ranks share at most one group: they differ in one "
              "coordinate.");
  ImGui::TextDisabled("--mode %s%s", c.mode.c_str(),
                      g.pp == 1 && g.tp == 1 ? ": every rank holds the whole model; the world is one data-parallel group"
                                             : "");
  ImGui::Spacing();
  ImGui::TextUnformatted(st.step >= 0 ? fmt("iteration %lld: the bytes each group's messages carried",
                                            static_cast<long long>(st.step)).c_str()
                                      : "no iteration recorded yet");
  draw_rank_grid(g, t);
  ImGui::TextDisabled("hover a rank for its groups");

  const ImGuiTableFlags tf = ImGuiTableFlags_Borders | ImGuiTableFlags_RowBg | ImGuiTableFlags_SizingFixedFit;
  if (!ImGui::BeginTable("grid_groups", 5, tf)) return;
  ImGui::TableSetupColumn("group");
  ImGui::TableSetupColumn("groups x ranks");
  ImGui::TableSetupColumn("members");
  ImGui::TableSetupColumn("what travels (the trace's names)", ImGuiTableColumnFlags_WidthStretch);
  ImGui::TableSetupColumn("bytes this iteration");
  ImGui::TableHeadersRow();
  const char* kind_title[kKinds] = {"data parallel (dp)", "pipeline (pp)", "tensor parallel (tp)"};
  const int sizes[kKinds] = {g.dp, g.pp, g.tp};
  std::vector<int> (lab::GridShape::*members[kKinds])(int) const = {&lab::GridShape::data_group,
                                                                    &lab::GridShape::pipeline_group,
                                                                    &lab::GridShape::tensor_group};
  for (int k = 0; k < kKinds; ++k) {
    if (sizes[k] < 2) continue;
    ImGui::TableNextRow();
    ImGui::TableNextColumn();
    ImGui::PushStyleColor(ImGuiCol_Text, kKindColor[k]);
    ImGui::TextUnformatted(kind_title[k]);
    ImGui::PopStyleColor();
    ImGui::TableNextColumn();
    ImGui::Text("%d x %d", g.size() / sizes[k], sizes[k]);
    ImGui::TableNextColumn();
    std::set<std::vector<int>> seen;
    std::string all;
    for (int r = 0; r < g.size(); ++r) {
      const std::vector<int> m = (g.*members[k])(r);
      if (seen.insert(m).second) all += (all.empty() ? "" : "  ") + ("{" + members_text(m) + "}");
    }
    ImGui::TextUnformatted(all.c_str());
    note_item("value", std::string("grid: ") + kKindName[k] + " groups", true, all);
    ImGui::TableNextColumn();
    std::string what;
    for (const std::string& w : t.what[k]) what += (what.empty() ? "" : ", ") + w;
    ImGui::TextUnformatted(what.empty() ? "-" : what.c_str());
    ImGui::TableNextColumn();
    uint64_t sum = 0;
    for (const auto& [i, b] : t.bytes[k]) sum += b;
    ImGui::TextUnformatted(sum ? fmt_bytes(static_cast<double>(sum)).c_str() : "-");
    tooltip(fmt("%llu bytes: every group of this kind, the messages of iteration %lld (a ring allreduce's chunks, the "
                "pipeline's sends)", static_cast<unsigned long long>(sum), static_cast<long long>(st.step)));
    note_item("value", std::string("grid: ") + kKindName[k] + " bytes", true, fmt("%llu", static_cast<unsigned long long>(sum)));
  }
  if (t.other) {
    ImGui::TableNextRow();
    ImGui::TableNextColumn();
    ImGui::TextUnformatted("the whole world");
    for (int i = 0; i < 3; ++i) ImGui::TableNextColumn();
    ImGui::TableNextColumn();
    ImGui::TextUnformatted(fmt_bytes(static_cast<double>(t.other)).c_str());
  }
  ImGui::EndTable();
}

}  // namespace viz
