// View 7, pipeline (--mode pipeline, lab/modes/pipeline.h): the whiteboard's diagram, drawn from
// the run. One row per stage, time to the right; each micro-batch's forward and backward a block
// (forward blue, backward orange, its number inside), the idle time between them shaded, the
// sends between stages as ticks. Above: one iteration as the timeline recorded it; below: the
// same schedule played with equal stages (forward 1, backward 2, messages free), the diagram of
// the papers. Beside them the bubble three ways (measured this iteration, the schedule's, GPipe's
// formula (p-1)/(m+p-1)) and per stage the micro-batches in flight at most (GPipe: m; 1F1B:
// min(p-s, m)) with the activations its memory accounting measured.
//
// Sections: 1. data  2. the diagram  3. the table  4. the view
#include <algorithm>
#include <cmath>
#include <map>

#include "config.h"
#include "draw.h"
#include "grid_draw.h"
#include "memory.h"
#include "mode.h"
#include "model.h"
#include "group_transport.h"
#include "panels.h"
#include "pipeline.h"
#include "run.h"

namespace viz {

namespace {

// ---- 1. data ----

constexpr ImU32 kForward = IM_COL32(0, 114, 178, 255);   // Okabe-Ito blue
constexpr ImU32 kBackward = IM_COL32(230, 159, 0, 255);  // Okabe-Ito orange
constexpr ImU32 kIdle = IM_COL32(60, 60, 66, 255);

struct Block {
  int stage = 0;
  bool forward = true;
  int micro = 0;
  double start = 0, end = 0;
};
struct Send {
  int src = 0, dst = 0, micro = 0;
  bool forward = true;
  double end = 0;
  uint64_t bytes = 0;
};
struct StepDiagram {
  std::vector<Block> blocks;
  std::vector<Send> sends;
  double t0 = 0, t1 = 0;
  std::vector<double> busy;  // per stage
  int micro = 0;             // micro-batches this iteration
};

// The blocks and sends of iteration `step` in the recorded events.
// (replica 0's stages under --dp, their slice 0 under --tp: rank rank_of(0, s, 0) is stage s)
StepDiagram diagram_of(const RunData& d, int64_t step, const lab::GridShape& grid) {
  const int stages = grid.pp;
  auto stage_of = [&](int rank) {  // -1: another replica's
    if (rank < 0 || rank >= grid.size()) return -1;
    const lab::GridCoords c = grid.coords(rank);
    return c.d == 0 && c.t == 0 ? c.p : -1;
  };
  StepDiagram g;
  g.busy.assign(static_cast<size_t>(stages), 0.0);
  g.t0 = 1e300;
  g.t1 = -1e300;
  for (size_t r = 0; r < d.events.size(); ++r) {
    const int s = stage_of(static_cast<int>(r));
    if (s < 0) continue;
    for (const lab::Event& e : d.events[r]) {
      if (e.train_step != step) continue;
      if (e.kind == lab::EventKind::Compute && e.tag >= 0 &&
          (e.phase == lab::Phase::Forward || e.phase == lab::Phase::Backward)) {
        g.blocks.push_back({s, e.phase == lab::Phase::Forward, e.tag, e.t_start, e.t_end});
        g.busy[static_cast<size_t>(s)] += e.t_end - e.t_start;
        g.t0 = std::min(g.t0, e.t_start);
        g.t1 = std::max(g.t1, e.t_end);
        g.micro = std::max(g.micro, e.tag + 1);
      } else if (e.kind == lab::EventKind::Chunk && e.phase == lab::Phase::Send && stage_of(e.dst) >= 0) {
        g.sends.push_back({s, stage_of(e.dst), e.tag, std::string(e.what) == "activations", e.t_end, e.bytes});
      }
    }
  }
  if (g.blocks.empty()) g.t0 = g.t1 = 0;
  return g;
}

StepDiagram ideal_of(const std::string& schedule, int stages, int micro) {
  StepDiagram g;
  const lab::PipeTimeline t = lab::simulate_pipeline(schedule, stages, micro, 1.0, 2.0);
  g.busy.assign(static_cast<size_t>(stages), 0.0);
  for (const lab::PipeBlock& b : t.blocks) {
    g.blocks.push_back({b.stage, b.op == lab::PipeOp::Forward, b.micro, b.start, b.end});
    g.busy[static_cast<size_t>(b.stage)] += b.end - b.start;
  }
  g.t1 = t.makespan;
  g.micro = micro;
  return g;
}

// The iterations whose records every rank has (their events are in by then).
int64_t newest_complete(const RunData& d) { return d.last_complete_step(); }

// ---- 2. the diagram ----

void draw_diagram(const char* id, const StepDiagram& g, int stages, double unit, const char* unit_name) {
  ImDrawList* dl = ImGui::GetWindowDrawList();
  const float fs = ImGui::GetFontSize();
  const float label_w = fs * 5.5f;
  const ImVec2 p0 = ImGui::GetCursorScreenPos();
  const float w = std::max(200.0f, ImGui::GetContentRegionAvail().x - label_w - fs);
  const float row = fs * 1.7f, gap = fs * 0.35f;
  const double span = std::max(1e-12, g.t1 - g.t0);
  auto x_of = [&](double t) { return p0.x + label_w + static_cast<float>((t - g.t0) / span) * w; };
  const ImVec2 mouse = ImGui::GetIO().MousePos;
  for (int s = 0; s < stages; ++s) {
    const float y = p0.y + static_cast<float>(s) * (row + gap);
    dl->AddText(ImVec2(p0.x, y + (row - fs) / 2), col::kText, fmt("stage %d", s).c_str());
    dl->AddRectFilled(ImVec2(p0.x + label_w, y), ImVec2(p0.x + label_w + w, y + row), kIdle);  // idle, under the blocks
    for (float hx = p0.x + label_w; hx < p0.x + label_w + w; hx += fs * 0.8f)  // shaded: hatching
      dl->AddLine(ImVec2(hx, y + row), ImVec2(std::min(hx + row, p0.x + label_w + w), y), IM_COL32(80, 80, 88, 255));
  }
  for (const Block& b : g.blocks) {
    const float y = p0.y + static_cast<float>(b.stage) * (row + gap);
    const float x0 = x_of(b.start), x1 = std::max(x_of(b.end), x0 + 1.0f);
    const ImU32 c = b.forward ? kForward : kBackward;
    dl->AddRectFilled(ImVec2(x0, y), ImVec2(x1, y + row), c);
    dl->AddRect(ImVec2(x0, y), ImVec2(x1, y + row), col::kPanel);
    const std::string t = std::to_string(b.micro);
    const ImVec2 ts = ImGui::CalcTextSize(t.c_str());
    if (x1 - x0 > ts.x + 2) dl->AddText(ImVec2((x0 + x1 - ts.x) / 2, y + (row - ts.y) / 2), text_on(c), t.c_str());
    if (ImGui::IsWindowHovered() && mouse.x >= x0 && mouse.x < x1 && mouse.y >= y && mouse.y < y + row)
      ImGui::SetTooltip("stage %d: %s of micro-batch %d\n%.3f to %.3f %s (%.3f %s)", b.stage,
                        b.forward ? "forward" : "backward", b.micro, (b.start - g.t0) * unit, (b.end - g.t0) * unit,
                        unit_name, (b.end - b.start) * unit, unit_name);
  }
  // the sends: a tick from the sender's row to the receiver's when the message had arrived
  for (const Send& m : g.sends) {
    if (m.src < 0 || m.dst < 0 || m.src >= stages || m.dst >= stages) continue;
    const float x = x_of(m.end);
    const float ys = p0.y + static_cast<float>(m.src) * (row + gap) + (m.dst > m.src ? row : 0);
    const float yd = p0.y + static_cast<float>(m.dst) * (row + gap) + (m.dst > m.src ? 0 : row);
    dl->AddLine(ImVec2(x, ys), ImVec2(x, yd), m.forward ? col::kEval : col::kTrain, 1.5f);
  }
  // time axis
  const float ya = p0.y + static_cast<float>(stages) * (row + gap);
  dl->AddLine(ImVec2(p0.x + label_w, ya), ImVec2(p0.x + label_w + w, ya), col::kGrid);
  dl->AddText(ImVec2(p0.x + label_w, ya + 2), col::kDim, "0");
  const std::string end = fmt("%.3g %s", span * unit, unit_name);
  dl->AddText(ImVec2(p0.x + label_w + w - ImGui::CalcTextSize(end.c_str()).x, ya + 2), col::kDim, end.c_str());
  ImGui::Dummy(ImVec2(label_w + w, static_cast<float>(stages) * (row + gap) + fs * 1.4f));
  (void)id;
}

void legend() {
  for (const auto& [c, t] : {std::pair<ImU32, const char*>{kForward, "forward"}, {kBackward, "backward"}, {kIdle, "idle"}}) {
    const ImVec2 p = ImGui::GetCursorScreenPos();
    const float s = ImGui::GetFontSize() * 0.8f;
    ImGui::GetWindowDrawList()->AddRectFilled(ImVec2(p.x, p.y + 2), ImVec2(p.x + s, p.y + 2 + s), c);
    ImGui::Dummy(ImVec2(s, s));
    ImGui::SameLine(0, 4);
    ImGui::TextUnformatted(t);
    ImGui::SameLine(0, ImGui::GetFontSize());
  }
  ImGui::TextDisabled("| ticks: sends (activations forward, their gradients back), number: the micro-batch");
}

// ---- 3. the table ----

void draw_stage_table(const RunData& d, const StepDiagram& g, int64_t step, const lab::GridShape& grid, int micro,
                      const std::vector<std::string>& stage_modules) {
  const int stages = grid.pp;
  const lab::RunConfig& c = d.cfg;
  const ImGuiTableFlags tf = ImGuiTableFlags_Borders | ImGuiTableFlags_RowBg | ImGuiTableFlags_SizingFixedFit;
  if (!ImGui::BeginTable("pipeline_stages", 6, tf)) return;
  ImGui::TableSetupColumn("stage");
  ImGui::TableSetupColumn("modules", ImGuiTableColumnFlags_WidthStretch);
  ImGui::TableSetupColumn("in flight at most");
  ImGui::TableSetupColumn("activations at the peak");
  ImGui::TableSetupColumn("busy");
  ImGui::TableSetupColumn("forward / backward");
  ImGui::TableHeadersRow();
  const std::vector<lab::StepRecord>* recs =
      step >= 0 && step < d.steps_done() ? &d.by_step[static_cast<size_t>(step)] : nullptr;
  for (int s = 0; s < stages; ++s) {
    ImGui::TableNextRow();
    ImGui::TableNextColumn();
    ImGui::Text("%d", s);
    ImGui::TableNextColumn();
    if (static_cast<size_t>(s) < stage_modules.size()) ImGui::TextUnformatted(stage_modules[static_cast<size_t>(s)].c_str());
    ImGui::TableNextColumn();
    const int peak = lab::peak_in_flight(lab::pipeline_schedule(c.schedule, stages, s, micro));
    ImGui::Text("%d", peak);
    tooltip(c.schedule == "gpipe" ? fmt("GPipe: every forward before any backward, so all %d micro-batches", micro)
                                  : fmt("1F1B: min(p - s, m) = min(%d - %d, %d)", stages, s, micro));
    ImGui::TableNextColumn();
    int64_t acts = -1;
    const size_t rank = static_cast<size_t>(grid.rank_of({0, s, 0}));
    if (recs && rank < recs->size())
      for (const lab::MemorySample& p : (*recs)[rank].memory)
        acts = std::max(acts, p.bytes[lab::kMemActivations]);
    ImGui::TextUnformatted(acts >= 0 ? fmt_bytes(static_cast<double>(acts)).c_str() : "-");
    tooltip("the most bytes of saved activations (each micro-batch's input, output and what its modules saved for "
            "backward) at any point of this iteration, from the stage's memory accounting (the Memory view)");
    ImGui::TableNextColumn();
    const double span = g.t1 - g.t0;
    ImGui::TextUnformatted(span > 0 ? fmt("%.0f%%", 100.0 * g.busy[static_cast<size_t>(s)] / span).c_str() : "-");
    ImGui::TableNextColumn();
    double f = 0, b = 0;
    int nf = 0, nb = 0;
    for (const Block& x : g.blocks)
      if (x.stage == s) (x.forward ? (f += x.end - x.start, ++nf) : (b += x.end - x.start, ++nb));
    ImGui::TextUnformatted(nf && nb ? fmt("%.2f / %.2f ms", 1e3 * f / nf, 1e3 * b / nb).c_str() : "-");
  }
  ImGui::EndTable();
}

// Each stage's modules, "Conv2d(1, 32, ...), BatchNorm2d(32), ..." (empty where the config's stage
// map cannot be made).
std::vector<std::string> stage_modules_of(const lab::RunConfig& c, int stages) {
  std::vector<std::string> out;
  try {
    const std::unique_ptr<lab::Model> model = lab::build_model(lab::model_options(c), c.seed);
    for (const lab::PipelineStage& st : lab::pipeline_stages(*model, stages, c.balance, c.model)) {
      std::string mods;
      for (size_t i = st.begin; i < st.end; ++i) mods += (mods.empty() ? "" : ", ") + model->module(i).describe();
      out.push_back(mods);
    }
  } catch (const lab::Error&) {
    out.clear();
  }
  return out;
}

}  // namespace

// What the view draws from the events and the config, made again only when the run or the
// iteration shown changes, not every frame (an iteration's events are all in once every rank's
// record of it is: newest_complete). An iteration that showed no blocks yet is looked for again
// when events come.
struct PipelineDiagramCache {
  uint64_t run = 0, events_version = 0;
  int64_t step = -2;
  StepDiagram measured;
  GridTraffic grid;
  std::vector<std::string> stage_modules;
};

// ---- 4. the view ----

void draw_pipeline_view(const RunData& d, PipelineViewState& st) {
  const lab::RunConfig& c = d.cfg;
  if (!d.caps().micro_batches) {
    ImGui::TextDisabled("This view draws a pipeline: --mode pipeline --stages P --microbatches M --schedule gpipe|1f1b.");
    ImGui::TextDisabled("(The run shown is --mode %s.)", c.mode.c_str());
    return;
  }
  const lab::GridShape grid = run_grid(c);
  const int stages = grid.pp;
  const int configured = static_cast<int>(c.microbatches);
  const int64_t newest = newest_complete(d);
  iteration_picker(st.follow, st.step, newest);
  if (!st.cache) st.cache = std::make_shared<PipelineDiagramCache>();
  PipelineDiagramCache& cache = *st.cache;
  if (cache.run != d.identity) {
    cache = PipelineDiagramCache{};
    cache.run = d.identity;
    cache.stage_modules = stage_modules_of(c, stages);
  }
  if (cache.step != st.step || (cache.measured.blocks.empty() && cache.events_version != d.events_version)) {
    cache.step = st.step;
    cache.events_version = d.events_version;
    cache.measured = st.step >= 0 ? diagram_of(d, st.step, grid) : StepDiagram{};
    if (grid.dp > 1 || grid.tp > 1) cache.grid = grid_traffic(d, grid, st.step);
  }
  const StepDiagram& g = cache.measured;
  const int micro = g.micro > 0 ? g.micro : configured;
  const StepDiagram ideal = ideal_of(c.schedule, stages, micro);
  const double formula = lab::bubble_formula(stages, micro);
  const double schedule_bubble = lab::simulate_pipeline(c.schedule, stages, micro, 1.0, 2.0).bubble;
  const double measured = g.blocks.empty() ? NAN : lab::measured_bubble(g.busy, g.t1 - g.t0);

  heading(fmt("%s, %d stages, %d micro-batches%s", c.schedule == "gpipe" ? "GPipe" : "1F1B", stages, micro,
              c.deferred_batch_norm ? ", deferred BatchNorm" : "")
              .c_str());
  labeled_value("bubble, formula", fmt("%.1f%%", 100 * formula),
                fmt("GPipe's idle share (p-1)/(m+p-1) = (%d-1)/(%d+%d-1) = %.4f: the fill and the drain, where some "
                    "stages wait for the first micro-batch to reach them or the last to come back",
                    stages, micro, stages, formula));
  ImGui::SameLine(0, ImGui::GetFontSize() * 2);
  labeled_value("the schedule's", fmt("%.1f%%", 100 * schedule_bubble),
                "the diagram below: this schedule played with equal stages (forward 1, backward 2) and messages "
                "that cost nothing. 1F1B has GPipe's bubble; what it changes is the micro-batches in flight.");
  ImGui::SameLine(0, ImGui::GetFontSize() * 2);
  labeled_value("measured", std::isnan(measured) ? "-" : fmt("%.1f%%", 100 * measured),
                "this iteration: 1 - (every stage's forward and backward time) / (stages x the iteration's span). "
                "Stages of unequal work wait for the slowest, so it exceeds the formula's; on fewer cores than "
                "stages the stages also wait for a core.");
  if (grid.dp > 1 || grid.tp > 1) {
    ImGui::Spacing();
    ImGui::TextUnformatted(fmt("the grid: %d data-parallel replica%s x %d stages x %d tensor-parallel slices (below: "
                               "replica 0's stages%s)", grid.dp, grid.dp == 1 ? "" : "s", stages, grid.tp,
                               grid.tp > 1 ? ", as their slice 0 recorded them" : "").c_str());
    draw_rank_grid(grid, cache.grid);
    text_wrapped_colored(col::kDim, "blue: the pipeline's messages between neighbouring stages (activations and their "
                                    "gradients); orange: each position's gradient allreduce over the replicas (its "
                                    "data-parallel group); green: a stage's slices (its layers' activations and input "
                                    "gradients, allreduced); bytes of the iteration shown (the Grid view: every group)");
  }
  ImGui::Spacing();
  ImGui::TextUnformatted(st.step >= 0 ? fmt("iteration %lld as the timeline recorded it", static_cast<long long>(st.step)).c_str()
                                      : "no iteration recorded yet");
  if (!g.blocks.empty()) draw_diagram("measured", g, stages, 1e3, "ms");
  ImGui::TextUnformatted("the schedule with equal stages (forward 1, backward 2): the whiteboard's diagram");
  draw_diagram("ideal", ideal, stages, 1.0, "units");
  legend();
  ImGui::Spacing();
  draw_stage_table(d, g, st.step, grid, micro, cache.stage_modules);
}

}  // namespace viz
