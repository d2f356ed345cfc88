// View 9, scale: "why does allreduce stop scaling at 1,000 GPUs?" and "ring or tree?", answered by
// the collective simulator (lab/sim/collective_sim.h, `dtlab simulate`) on 8 to 4,096 GPUs.
//   controls    a topology preset, the collective, NCCL's protocol or the wire, N (nodes), the size
//               S, which algorithms to draw, and the algorithm whose time is split; a simulate run
//               (a lesson's observation, --open) sets them all from the run (ScaleViewState::apply),
//               its topology too when it is no preset, and a line says so
//   topology    the cluster for the chosen N: nodes with their GPUs, switch and NICs, the leaf
//               switches and the spine; a few nodes and "... x K" when there are many; the chosen
//               algorithm's ring or trees drawn over it while every node is drawn
//   charts      busbw against N at S (each algorithm); time against N at S split into latency,
//               bandwidth and contention (one algorithm), with the emulated run's measured
//               allreduces and the simulator's wire prediction for its link; busbw against S at N
//               with the size where ring overtakes dbtree marked. Log axes; hover for the figures,
//               click to choose N or S.
// The points are simulated off the GUI thread (ScaleSim, viz/data/scale_data.h) and kept: the
// charts fill in as they arrive. Screenshots (a frozen clock) wait for them.
//
// Sections: 1. state and formatting  2. axes  3. the topology  4. the charts  5. the view
#include <algorithm>
#include <cmath>

#include "draw.h"
#include "panels.h"
#include "scale_data.h"

namespace viz {

// ---- 1. state and formatting ----

struct ScaleViewCache {
  ScaleSettings s;
  // the simulate run the view was last set up from (ScaleViewState::apply): the line saying so, and
  // its topology in the topology menu when it is no preset
  std::optional<ScaleSetup> from;
  lab::SimAlgorithm split = lab::SimAlgorithm::Ring;  // the time chart's algorithm, drawn over the topology
  bool show[4] = {true, true, true, true};            // per scale_algorithms()
  ScaleSim sim;
  ScaleCharts charts;
  bool charts_valid = false;
  // the run's points: rebuilt when the run or its events change (at most twice a second while live)
  uint64_t run_identity = ~uint64_t{0};
  uint64_t run_events_version = ~uint64_t{0};
  RunPhase run_phase = RunPhase::Empty;
  double run_built_at = -1e9;
  EmulatedRun run;
};

namespace {

const ImU32 kAlgoColor[4] = {IM_COL32(86, 180, 233, 255), IM_COL32(230, 159, 0, 255), IM_COL32(0, 158, 115, 255),
                             IM_COL32(204, 121, 167, 255)};
constexpr ImU32 kLatency = IM_COL32(213, 94, 0, 255);      // vermillion
constexpr ImU32 kBandwidth = IM_COL32(0, 114, 178, 255);   // blue
constexpr ImU32 kContention = IM_COL32(240, 228, 66, 255); // yellow
constexpr ImU32 kMeasured = IM_COL32(245, 245, 245, 255);
constexpr ImU32 kPredicted = IM_COL32(204, 121, 167, 255);
constexpr ImU32 kChosen = IM_COL32(255, 255, 255, 70);
constexpr ImU32 kBox = IM_COL32(52, 56, 64, 255);
constexpr ImU32 kBoxEdge = IM_COL32(110, 116, 126, 255);
constexpr ImU32 kGpu = IM_COL32(70, 110, 80, 255);
constexpr ImU32 kNic = IM_COL32(120, 96, 60, 255);
constexpr ImU32 kSwitch = IM_COL32(72, 84, 110, 255);
constexpr ImU32 kCable = IM_COL32(150, 150, 150, 110);

int algo_index(lab::SimAlgorithm a) {
  const auto& all = scale_algorithms();
  for (size_t i = 0; i < all.size(); ++i)
    if (all[i] == a) return static_cast<int>(i);
  return 0;
}
ImU32 algo_color(lab::SimAlgorithm a) { return kAlgoColor[algo_index(a)]; }

std::string fmt_time(double s) {
  if (!(s > 0)) return "0";
  if (s < 1e-3) return fmt("%.3g us", s * 1e6);
  if (s < 1) return fmt("%.3g ms", s * 1e3);
  return fmt("%.3g s", s);
}
std::string fmt_gbs(double bytes_per_s) { return fmt("%.3g GB/s", bytes_per_s / 1e9); }
std::string fmt_gpus(int n) { return n >= 1024 && n % 1024 == 0 ? fmt("%dK", n / 1024) : fmt("%d", n); }
std::string size_tick(uint64_t b) {
  std::string s = scale_size_text(b);
  const size_t sp = s.find(' ');
  if (sp != std::string::npos) s = s.substr(0, sp) + s.substr(sp + 1, 1);  // "64 MiB" -> "64M"
  return s;
}

ImVec2 text_size(ImFont* f, const std::string& s) { return f->CalcTextSizeA(f->FontSize, FLT_MAX, 0, s.c_str()); }
void text_at(ImDrawList* dl, ImFont* f, ImVec2 p, ImU32 c, const std::string& s) {
  dl->AddText(f, f->FontSize, p, c, s.c_str());
}

void note(const std::string& s) {
  ImGui::PushStyleColor(ImGuiCol_Text, ImGui::GetStyleColorVec4(ImGuiCol_TextDisabled));
  ImGui::TextWrapped("%s", s.c_str());
  ImGui::PopStyleColor();
  note_item("text", s);
}

void arrow_head(ImDrawList* dl, ImVec2 tip, ImVec2 from, ImU32 c, float size) {
  const float dx = tip.x - from.x, dy = tip.y - from.y, len = std::sqrt(dx * dx + dy * dy);
  if (len < 1e-3f) return;
  const float ux = dx / len, uy = dy / len;
  dl->AddTriangleFilled(tip, ImVec2(tip.x - ux * size - uy * size * 0.5f, tip.y - uy * size + ux * size * 0.5f),
                        ImVec2(tip.x - ux * size + uy * size * 0.5f, tip.y - uy * size - ux * size * 0.5f), c);
}

ImVec2 bezier(ImVec2 p0, ImVec2 p1, ImVec2 p2, ImVec2 p3, float t) {
  const float u = 1 - t;
  const float a = u * u * u, b = 3 * u * u * t, c = 3 * u * t * t, d = t * t * t;
  return ImVec2(a * p0.x + b * p1.x + c * p2.x + d * p3.x, a * p0.y + b * p1.y + c * p2.y + d * p3.y);
}

// A curve from p0 to p3 dipping `depth` pixels below them (negative: above), with an arrow head at p3.
void arc(ImDrawList* dl, ImVec2 p0, ImVec2 p3, float depth, ImU32 c, float thick, bool dashed, bool head = true) {
  const ImVec2 p1(p0.x + (p3.x - p0.x) * 0.15f, p0.y + depth), p2(p3.x - (p3.x - p0.x) * 0.15f, p3.y + depth);
  const int n = 24;
  ImVec2 prev = p0;
  for (int i = 1; i <= n; ++i) {
    const ImVec2 q = bezier(p0, p1, p2, p3, static_cast<float>(i) / n);
    if (!dashed || i % 2) dl->AddLine(prev, q, c, thick);
    prev = q;
  }
  if (head) arrow_head(dl, p3, bezier(p0, p1, p2, p3, 0.85f), c, 7);
}

// ---- 2. axes ----

// A logarithmic axis over [lo, hi] onto pixels [a, b].
struct LogAxis {
  double lo = 1, hi = 10;
  float a = 0, b = 1;
  float at(double v) const {
    const double f = std::log(std::max(v, lo * 1e-6) / lo) / std::log(hi / lo);
    return a + static_cast<float>(f) * (b - a);
  }
  double value(float px) const { return lo * std::exp((px - a) / (b - a) * std::log(hi / lo)); }
};

// A log axis' range holding [lo, hi]: from the power of ten at or below lo to the one at or above hi.
void decade_range(double lo, double hi, double& out_lo, double& out_hi) {
  if (!(lo > 0)) lo = hi > 0 ? hi / 10 : 1;
  if (!(hi > lo)) hi = lo * 10;
  out_lo = std::pow(10.0, std::floor(std::log10(lo) + 1e-9));
  out_hi = std::pow(10.0, std::ceil(std::log10(hi) - 1e-9));
  if (!(out_hi > out_lo)) out_hi = out_lo * 10;
}

// 1, 2, 5 x 10^k in [lo, hi]; only the powers of ten when more than `max` would be drawn.
std::vector<double> y_ticks(double lo, double hi, size_t max) {
  std::vector<double> all, decades;
  int guard = 0;
  for (double p = lo; p <= hi * 1.000001 && ++guard < 60; p *= 10)
    for (double m : {1.0, 2.0, 5.0}) {
      const double v = p * m;
      if (v > hi * 1.000001) break;
      all.push_back(v);
      if (m == 1.0) decades.push_back(v);
    }
  if (all.size() <= max) return all;
  if (decades.size() <= max) return decades;
  std::vector<double> some;  // every second or third decade
  const size_t step = (decades.size() + max - 1) / max;
  for (size_t i = 0; i < decades.size(); i += step) some.push_back(decades[i]);
  return some;
}

std::string time_tick(double s) {
  if (s < 1e-3) return fmt("%g us", s * 1e6);
  if (s < 1) return fmt("%g ms", s * 1e3);
  return fmt("%g s", s);
}
std::string gbs_tick(double bytes_per_s) { return fmt("%g", bytes_per_s / 1e9); }

// A legend from (x, y): a swatch and a label per entry, wrapping at max_x; returns the height used.
struct LegendEntry {
  ImU32 color;
  std::string label;
  int shape;  // 0 line, 1 box, 2 dot, 3 diamond, -1 none (the axis' title)
};
float legend(ImDrawList* dl, ImVec2 at, float max_x, const std::vector<LegendEntry>& es) {
  ImFont* small = font(FontId::Small);
  const float h = small->FontSize;
  float x = at.x, y = at.y;
  for (const LegendEntry& e : es) {
    const float w = (e.shape < 0 ? 0 : h * 1.4f) + text_size(small, e.label).x + h * 0.9f;
    if (x + w > max_x && x > at.x) {
      x = at.x;
      y += h + 3;
    }
    const ImVec2 c(x + h * 0.55f, y + h * 0.55f);
    if (e.shape < 0) {
      text_at(dl, small, ImVec2(x, y), e.color, e.label);
      x += text_size(small, e.label).x + h * 1.2f;
      continue;
    }
    switch (e.shape) {
      case 0: dl->AddLine(ImVec2(x, c.y), ImVec2(x + h * 1.1f, c.y), e.color, 2.5f); break;
      case 1: dl->AddRectFilled(ImVec2(x + 1, y + 2), ImVec2(x + h * 1.1f, y + h - 1), e.color); break;
      case 2: dl->AddCircleFilled(c, 4, e.color, 12); break;
      default:
        dl->AddQuad(ImVec2(c.x, c.y - 5), ImVec2(c.x + 5, c.y), ImVec2(c.x, c.y + 5), ImVec2(c.x - 5, c.y), e.color, 2);
    }
    text_at(dl, small, ImVec2(x + h * 1.4f, y), col::kText, e.label);
    x += w;
  }
  return y + h - at.y;
}

// A chart's frame: its place reserved (an InvisibleButton: hover and click), the plot area, the
// axes with their ticks and titles.
struct Frame {
  ImVec2 p0, p1, a, b;  // the whole item; the plot area (a top left, b bottom right)
  LogAxis x, y;
  bool hovered = false, clicked = false;
  ImVec2 mouse;
  bool ok = false;
};

struct XTick {
  double v;
  std::string label;  // empty: a minor tick
};

// Above the plot: the y axis' title and the legend, two rows reserved (every chart's plot starts at
// the same height).
Frame chart_frame(const char* id, ImVec2 size, double x_lo, double x_hi, const std::vector<XTick>& xt, double y_lo,
                  double y_hi, std::string (*y_label)(double), const std::string& x_title, const std::string& y_title,
                  const std::vector<LegendEntry>& leg) {
  Frame f;
  ImDrawList* dl = ImGui::GetWindowDrawList();
  ImFont* small = font(FontId::Small);
  const float fs = ImGui::GetFontSize();
  f.p0 = ImGui::GetCursorScreenPos();
  ImGui::InvisibleButton(id, size);
  f.hovered = ImGui::IsItemHovered();
  f.clicked = ImGui::IsItemClicked();
  f.mouse = ImGui::GetIO().MousePos;
  f.p1 = ImVec2(f.p0.x + size.x, f.p0.y + size.y);
  const float left = fs * 3.6f, right = fs * 0.8f, top = (small->FontSize + 3) * 2 + 4, bottom = fs * 2.6f;
  f.a = ImVec2(f.p0.x + left, f.p0.y + top);
  f.b = ImVec2(f.p1.x - right, f.p1.y - bottom);
  if (f.b.x - f.a.x < 60 || f.b.y - f.a.y < 60) return f;
  f.ok = true;
  f.x = LogAxis{x_lo, x_hi, f.a.x, f.b.x};
  decade_range(y_lo, y_hi, f.y.lo, f.y.hi);
  f.y.a = f.b.y;
  f.y.b = f.a.y;
  dl->AddRectFilled(f.a, f.b, IM_COL32(24, 25, 28, 255));
  for (double v : y_ticks(f.y.lo, f.y.hi, static_cast<size_t>(std::max(2.0f, (f.b.y - f.a.y) / (fs * 1.7f))))) {
    const float y = f.y.at(v);
    dl->AddLine(ImVec2(f.a.x, y), ImVec2(f.b.x, y), col::kGrid);
    const std::string s = y_label(v);
    const ImVec2 ts = text_size(small, s);
    text_at(dl, small, ImVec2(f.a.x - ts.x - 4, y - ts.y / 2), col::kDim, s);
  }
  for (const XTick& t : xt) {
    const float x = f.x.at(t.v);
    if (t.label.empty()) {
      dl->AddLine(ImVec2(x, f.b.y), ImVec2(x, f.b.y + 3), col::kFaint);
      continue;
    }
    dl->AddLine(ImVec2(x, f.a.y), ImVec2(x, f.b.y), with_alpha(col::kGrid, 0.6f));
    dl->AddLine(ImVec2(x, f.b.y), ImVec2(x, f.b.y + 4), col::kDim);
    const ImVec2 ts = text_size(small, t.label);
    text_at(dl, small, ImVec2(x - ts.x / 2, f.b.y + 5), col::kText, t.label);
  }
  dl->AddRect(f.a, f.b, col::kGrid);
  const ImVec2 xs = text_size(small, x_title);
  text_at(dl, small, ImVec2((f.a.x + f.b.x - xs.x) / 2, f.b.y + 6 + small->FontSize), col::kDim, x_title);
  std::vector<LegendEntry> head = {{col::kDim, y_title, -1}};
  head.insert(head.end(), leg.begin(), leg.end());
  legend(dl, f.p0, f.p1.x - 4, head);
  return f;
}

std::vector<XTick> gpu_ticks(int lo, int hi) {
  std::vector<XTick> t;
  for (int g = lo; g <= hi; g *= 2) t.push_back({static_cast<double>(g), fmt_gpus(g)});
  return t;
}

std::vector<XTick> size_ticks() {
  std::vector<XTick> t;
  int i = 0;
  for (uint64_t b : scale_sizes()) t.push_back({static_cast<double>(b), i++ % 3 == 0 ? size_tick(b) : ""});
  return t;
}

// ---- 3. the topology ----

struct NodeBox {
  int node;
  ImVec2 a, b;
  std::vector<ImVec2> gpu;  // centres of its GPUs
  std::vector<ImVec2> nic;  // centres of its NICs
  float gpu_bottom = 0;
};

void draw_topology(const lab::Topology& t, lab::SimAlgorithm overlay, lab::SimCollective coll) {
  ImDrawList* dl = ImGui::GetWindowDrawList();
  ImFont* small = font(FontId::Small);
  const float fs = ImGui::GetFontSize(), sfs = small->FontSize;
  const ImVec2 p0 = ImGui::GetCursorScreenPos();
  const float width = ImGui::GetContentRegionAvail().x;

  const int nodes = t.nodes, g = t.gpus_per_node;
  const bool all_shown = nodes <= 4;
  std::vector<int> shown;
  if (all_shown) {
    for (int i = 0; i < nodes; ++i) shown.push_back(i);
  } else {
    shown = {0, 1, 2, nodes - 1};
  }
  const int hidden = nodes - static_cast<int>(shown.size());
  const float gap = fs, ell_w = all_shown ? 0 : fs * 7;
  const float slots = static_cast<float>(shown.size());
  const float node_w = std::min(fs * 19, (width - ell_w - gap * (slots + 1)) / slots);
  const float used = node_w * slots + gap * (slots - 1) + ell_w + (all_shown ? 0 : gap);
  float x = p0.x + std::max(0.0f, (width - used) / 2);

  // rows, top to bottom: spine, leaves, nodes (NICs, switch, GPUs), the overlay's arcs below
  const int groups = t.leaves();
  const bool spine = groups > 1;
  const float leaf_h = sfs + 6;
  const float spine_y = p0.y + 2, leaf_y = p0.y + (spine ? leaf_h + sfs + 14 : sfs + 4);
  const float node_y = leaf_y + leaf_h + fs * 1.5f;
  const float node_h = (3 + sfs + 2) + sfs * 0.6f + (sfs + 3) + sfs * 0.6f + fs * 1.5f + 5;
  const float dip = fs * 0.9f;
  const float height = node_y + node_h + dip * 2.0f + sfs + 6 - p0.y;  // the arcs below, their line of text
  ImGui::InvisibleButton("scale_topology", ImVec2(width, height));
  const bool hovered = ImGui::IsItemHovered();
  std::vector<NodeBox> boxes;
  float ell_x = x;
  for (size_t i = 0; i < shown.size(); ++i) {
    if (!all_shown && i == 3) {  // "... x K" between the first three and the last
      ell_x = x;
      const std::string s = fmt("... x %d", hidden);
      const ImVec2 ts = ImGui::CalcTextSize(s.c_str());
      dl->AddText(ImVec2(x + (ell_w - ts.x) / 2, node_y + node_h / 2 - ts.y), col::kText, s.c_str());
      const std::string s2 = fmt("nodes %d .. %d", 3, nodes - 2);
      const ImVec2 t2 = text_size(small, s2);
      text_at(dl, small, ImVec2(x + (ell_w - t2.x) / 2, node_y + node_h / 2 + 2), col::kDim, s2);
      x += ell_w + gap;
    }
    NodeBox nb;
    nb.node = shown[i];
    nb.a = ImVec2(x, node_y);
    nb.b = ImVec2(x + node_w, node_y + node_h);
    dl->AddRectFilled(nb.a, nb.b, kBox, 4);
    dl->AddRect(nb.a, nb.b, kBoxEdge, 4);
    text_at(dl, small, ImVec2(nb.a.x + 5, nb.a.y + 2), col::kText, fmt("node %d", nb.node));
    // NICs: a row at the top right of the title
    const int nics = t.nics_per_node;
    const float nic_area_x0 = nb.a.x + fs * 3.6f, nic_area_x1 = nb.b.x - 5;
    const float nic_w = std::min(fs * 2.2f, (nic_area_x1 - nic_area_x0) / nics - 2);
    const float nic_y0 = nb.a.y + 3, nic_y1 = nic_y0 + sfs + 2;
    for (int k = 0; k < nics; ++k) {
      const float cx = nics == 1 ? (nic_area_x0 + nic_area_x1) / 2
                                 : nic_area_x0 + (nic_area_x1 - nic_area_x0) * (k + 0.5f) / nics;
      const ImVec2 na(cx - nic_w / 2, nic_y0), nbb(cx + nic_w / 2, nic_y1);
      dl->AddRectFilled(na, nbb, kNic, 2);
      if (nic_w > text_size(small, "NIC").x + 2) {
        const ImVec2 ts = text_size(small, "NIC");
        text_at(dl, small, ImVec2(cx - ts.x / 2, nic_y0 + 1), col::kText, "NIC");
      }
      nb.nic.push_back(ImVec2(cx, nic_y0));
    }
    // the node's switch
    const float sw_y0 = nic_y1 + sfs * 0.6f, sw_y1 = sw_y0 + sfs + 3;
    dl->AddRectFilled(ImVec2(nb.a.x + 5, sw_y0), ImVec2(nb.b.x - 5, sw_y1), kSwitch, 2);
    const std::string sw = fmt("%s %.4g GB/s per GPU", t.nvlink ? "NVSwitch" : "PCIe switch", t.intra_GBps);
    const std::string sw_short = t.nvlink ? "NVSwitch" : "PCIe";
    const std::string& swl = text_size(small, sw).x < node_w - 14 ? sw : sw_short;
    const ImVec2 swts = text_size(small, swl);
    text_at(dl, small, ImVec2((nb.a.x + nb.b.x - swts.x) / 2, sw_y0 + 1), col::kText, swl);
    for (const ImVec2& n : nb.nic) dl->AddLine(ImVec2(n.x, nic_y1), ImVec2(n.x, sw_y0), kCable);
    // GPUs
    const float gpu_y0 = sw_y1 + sfs * 0.6f, gpu_y1 = std::min(nb.b.y - 4, gpu_y0 + fs * 1.5f);
    const float gw = (node_w - 10) / g;
    for (int k = 0; k < g; ++k) {
      const float gx0 = nb.a.x + 5 + gw * k + 1, gx1 = gx0 + gw - 2;
      dl->AddRectFilled(ImVec2(gx0, gpu_y0), ImVec2(gx1, gpu_y1), kGpu, 2);
      dl->AddLine(ImVec2((gx0 + gx1) / 2, sw_y1), ImVec2((gx0 + gx1) / 2, gpu_y0), kCable);
      const std::string r = fmt("%d", nb.node * g + k);
      const ImVec2 ts = text_size(small, r);
      if (ts.x < gw - 2) text_at(dl, small, ImVec2((gx0 + gx1 - ts.x) / 2, (gpu_y0 + gpu_y1 - ts.y) / 2), col::kText, r);
      nb.gpu.push_back(ImVec2((gx0 + gx1) / 2, (gpu_y0 + gpu_y1) / 2));
    }
    nb.gpu_bottom = gpu_y1;
    boxes.push_back(std::move(nb));
    x += node_w + gap;
  }

  // leaves: per group of nodes_per_leaf nodes, one switch, or one per rail (NIC index)
  const int per_leaf = t.nodes_per_leaf > 0 ? t.nodes_per_leaf : nodes;
  std::vector<int> group_list;
  for (const NodeBox& nb : boxes) {
    const int gi = nb.node / per_leaf;
    if (std::find(group_list.begin(), group_list.end(), gi) == group_list.end()) group_list.push_back(gi);
  }
  const int rails = t.rails ? t.nics_per_node : 1;
  std::vector<float> group_cx;
  std::vector<std::vector<ImVec2>> leaf_at;  // [group in group_list][rail]: bottom centre
  for (int gi : group_list) {
    float lo = 1e9f, hi = -1e9f;
    for (const NodeBox& nb : boxes)
      if (nb.node / per_leaf == gi) {
        lo = std::min(lo, nb.a.x);
        hi = std::max(hi, nb.b.x);
      }
    const float want = std::max(fs * 6, std::min(hi - lo, static_cast<float>(rails) * fs * 3.2f));
    const float cx = (lo + hi) / 2, gx0 = cx - want / 2;
    group_cx.push_back(cx);
    std::vector<ImVec2> rail_pts;
    const float lw = want / rails;
    for (int r = 0; r < rails; ++r) {
      const ImVec2 la(gx0 + lw * r + 1, leaf_y), lb(gx0 + lw * (r + 1) - 1, leaf_y + leaf_h);
      dl->AddRectFilled(la, lb, kSwitch, 2);
      const std::string s = rails > 1 ? fmt("rail %d", r) : fmt("leaf %d", gi);
      const ImVec2 ts = text_size(small, s);
      if (ts.x < lw - 3) text_at(dl, small, ImVec2((la.x + lb.x - ts.x) / 2, leaf_y + 3), col::kText, s);
      rail_pts.push_back(ImVec2((la.x + lb.x) / 2, lb.y));
    }
    leaf_at.push_back(rail_pts);
    if (rails > 1) {
      const std::string s = fmt("leaf group %d", gi);
      const ImVec2 ts = text_size(small, s);
      text_at(dl, small, ImVec2(cx - ts.x / 2, leaf_y - ts.y - 1), col::kDim, s);
    }
  }
  for (const NodeBox& nb : boxes) {
    const size_t gpos = static_cast<size_t>(std::find(group_list.begin(), group_list.end(), nb.node / per_leaf) -
                                            group_list.begin());
    for (size_t k = 0; k < nb.nic.size(); ++k) {
      const ImVec2 to = leaf_at[gpos][t.rails ? k % static_cast<size_t>(rails) : 0];
      dl->AddLine(nb.nic[k], to, kCable);
    }
  }
  // the spine above the leaves, when there are several groups
  if (spine) {
    const float sx0 = p0.x + width * 0.3f, sx1 = p0.x + width * 0.7f;
    dl->AddRectFilled(ImVec2(sx0, spine_y), ImVec2(sx1, spine_y + leaf_h), kSwitch, 2);
    const std::string s = fmt("spine: %d leaf groups of %d nodes; each leaf's uplink %.4g GB/s each way%s", groups,
                              per_leaf, t.uplink_bytes_per_s() / 1e9,
                              t.oversubscription > 1 ? fmt(" (%g:1 oversubscribed)", t.oversubscription).c_str() : "");
    const ImVec2 ts = text_size(small, s);
    text_at(dl, small, ImVec2((sx0 + sx1 - ts.x) / 2, spine_y + 3), col::kText, s);
    for (size_t i = 0; i < leaf_at.size(); ++i)
      for (const ImVec2& l : leaf_at[i]) dl->AddLine(ImVec2(l.x, leaf_y), ImVec2((sx0 + sx1) / 2 + (l.x - (sx0 + sx1) / 2) * 0.4f, spine_y + leaf_h), kCable);
    if (groups > static_cast<int>(group_list.size()) && !all_shown) {  // over the nodes' "... x K"
      const std::string more = fmt("+ %d leaf group%s", groups - static_cast<int>(group_list.size()),
                                   groups - static_cast<int>(group_list.size()) == 1 ? "" : "s");
      const ImVec2 ms = text_size(small, more);
      text_at(dl, small, ImVec2(ell_x + (ell_w - ms.x) / 2, leaf_y + 2), col::kDim, more);
    }
  }

  // the algorithm over it, while every node is drawn
  const ImU32 oc = algo_color(overlay);
  std::string what;
  if (!all_shown) {
    what = fmt("%s's messages are drawn for up to 4 nodes (32 GPUs).", lab::sim_algorithm_name(overlay));
  } else if (overlay == lab::SimAlgorithm::Ring || (overlay == lab::SimAlgorithm::Rhd && nodes > 1)) {
    if (overlay == lab::SimAlgorithm::Ring) what = "ring: every GPU sends to the next; the last node's last GPU closes it";
    std::vector<ImVec2> order;
    for (const NodeBox& nb : boxes) order.insert(order.end(), nb.gpu.begin(), nb.gpu.end());
    if (overlay == lab::SimAlgorithm::Ring) {
      for (size_t i = 0; i + 1 < order.size(); ++i) {
        const bool cross = (i + 1) % static_cast<size_t>(g) == 0;
        const ImVec2 a(order[i].x, boxes[0].gpu_bottom), b(order[i + 1].x, boxes[0].gpu_bottom);
        arc(dl, a, b, cross ? dip * 1.6f : dip * 0.7f, oc, cross ? 2.5f : 1.8f, false);
      }
      if (order.size() > 1) {
        const ImVec2 a(order.back().x, boxes[0].gpu_bottom), b(order.front().x, boxes[0].gpu_bottom);
        arc(dl, a, b, dip * 2.2f, oc, 2.0f, true);
      }
    }
  } else if (overlay == lab::SimAlgorithm::DbTree && coll == lab::SimCollective::Allreduce) {
    what = "dbtree: two binary trees over the nodes (solid, dashed), each node a leaf in one; a chain through each node's GPUs";
    for (const NodeBox& nb : boxes)
      for (size_t k = 0; k + 1 < nb.gpu.size(); ++k)
        arc(dl, ImVec2(nb.gpu[k].x, nb.gpu_bottom), ImVec2(nb.gpu[k + 1].x, nb.gpu_bottom), dip * 0.6f, oc, 1.6f, false);
    for (int tree = 0; tree < 2; ++tree)
      for (int r = 0; r < nodes; ++r) {
        const int parent = lab::dbtree_parent(nodes, r, tree);
        if (parent < 0) continue;
        const NodeBox& c = boxes[static_cast<size_t>(r)];
        const NodeBox& p = boxes[static_cast<size_t>(parent)];
        const ImVec2 a((p.a.x + p.b.x) / 2 + (tree ? 12 : -12), p.b.y), b((c.a.x + c.b.x) / 2 + (tree ? 12 : -12), c.b.y);
        arc(dl, a, b, dip * (tree ? 2.4f : 1.7f), tree ? mix(oc, col::kText, 0.4f) : oc, 2.2f, tree == 1);
      }
  } else if (overlay == lab::SimAlgorithm::Hier) {
    what = "hier: a reduce-scatter in each node, a ring over the nodes between GPUs of the same local index (one per NIC), an allgather in each node";
    for (const NodeBox& nb : boxes)
      for (size_t k = 0; k + 1 < nb.gpu.size(); ++k)
        arc(dl, ImVec2(nb.gpu[k].x, nb.gpu_bottom), ImVec2(nb.gpu[k + 1].x, nb.gpu_bottom), dip * 0.6f, oc, 1.4f, false);
    if (nodes > 1)
      for (size_t i = 0; i < boxes.size(); ++i) {
        const NodeBox& a = boxes[i];
        const NodeBox& b = boxes[(i + 1) % boxes.size()];
        arc(dl, ImVec2(a.gpu[0].x, a.gpu_bottom), ImVec2(b.gpu[0].x, b.gpu_bottom), dip * (i + 1 == boxes.size() ? 2.3f : 1.6f),
            mix(oc, col::kText, 0.3f), 2.2f, i + 1 == boxes.size());
      }
  }
  if (overlay == lab::SimAlgorithm::Rhd && all_shown) {
    what = "rhd: at step k every GPU exchanges with GPU (rank xor 2^k): half the data, then a quarter, ... (steps 0-2 drawn)";
    for (const NodeBox& nb : boxes)
      for (int lvl = 0; lvl < 3 && (1 << lvl) < g; ++lvl)
        for (int k = 0; k < g; ++k) {
          const int partner = k ^ (1 << lvl);
          if (partner < k || partner >= g) continue;
          arc(dl, ImVec2(nb.gpu[static_cast<size_t>(k)].x, nb.gpu_bottom),
              ImVec2(nb.gpu[static_cast<size_t>(partner)].x, nb.gpu_bottom), dip * (0.5f + 0.5f * lvl),
              with_alpha(oc, 1.0f - 0.25f * lvl), 1.6f, false, false);
        }
  }
  if (!what.empty()) {
    const ImVec2 ts = text_size(small, what);
    text_at(dl, small, ImVec2(p0.x + std::max(0.0f, (width - ts.x) / 2), p0.y + height - ts.y - 1), oc, what);
  }
  if (hovered) {
    ImGui::BeginTooltip();
    ImGui::PushTextWrapPos(fs * 34);
    ImGui::TextUnformatted(lab::topology_line(t).c_str());
    ImGui::TextDisabled("%s", t.about.c_str());
    ImGui::TextUnformatted("A message between nodes leaves through a NIC of its node (the GPU's local index modulo "
                           "the NICs) and enters through one of the other's; between leaf groups it also crosses "
                           "both leaves' uplinks. Each link, NIC and uplink is one resource: messages that share one "
                           "share its bandwidth (contention).");
    ImGui::PopTextWrapPos();
    ImGui::EndTooltip();
  }
}

// ---- 4. the charts ----

struct ChartArgs {
  const ScaleCharts* c = nullptr;
  const bool* show = nullptr;
  lab::SimAlgorithm split = lab::SimAlgorithm::Ring;
  const EmulatedRun* run = nullptr;
  ImVec2 size;
};

// The series' index nearest the mouse along x (log), -1 when outside.
int nearest_x(const Frame& f, const std::vector<double>& xs) {
  if (!f.hovered || f.mouse.x < f.a.x - 8 || f.mouse.x > f.b.x + 8) return -1;
  int best = -1;
  float bd = 1e9f;
  for (size_t i = 0; i < xs.size(); ++i) {
    const float d = std::fabs(f.x.at(xs[i]) - f.mouse.x);
    if (d < bd) {
      bd = d;
      best = static_cast<int>(i);
    }
  }
  return best;
}

void point_lines(const lab::SimResult& r, lab::SimCollective c) {
  ImGui::Text("time %s = latency %s + bandwidth %s + contention %s", fmt_time(r.time_s).c_str(), fmt_time(r.latency_s).c_str(),
              fmt_time(r.bandwidth_s).c_str(), fmt_time(r.contention_s).c_str());
  ImGui::Text("algbw %s, busbw %s (x %s), %lld %s", fmt_gbs(r.algbw).c_str(), fmt_gbs(r.busbw).c_str(),
              c == lab::SimCollective::Allreduce ? "2(N-1)/N" : "(N-1)/N", static_cast<long long>(r.steps),
              r.steps == 1 ? "step" : "steps or hops");
}

// One algorithm's row in a busbw chart's tooltip: its name in its colour, then the point's figures.
// Returns whether the point is ready.
bool tooltip_algorithm_row(const ScaleSeries& s, const ScalePoint& p, lab::SimCollective c) {
  ImGui::PushStyleColor(ImGuiCol_Text, ImGui::ColorConvertU32ToFloat4(algo_color(s.algo)));
  ImGui::TextUnformatted(lab::sim_algorithm_name(s.algo));
  ImGui::PopStyleColor();
  ImGui::SameLine();
  if (p.ready) point_lines(p.r, c);
  else ImGui::TextDisabled("computing...");
  return p.ready;
}

// The legend of the algorithms shown, and the range of their busbw (lo > hi: nothing ready).
void busbw_legend_and_range(const std::vector<ScaleSeries>& series, const bool* show, std::vector<LegendEntry>& leg,
                            double& lo, double& hi) {
  lo = 1e300;
  hi = 0;
  for (size_t ai = 0; ai < series.size(); ++ai) {
    const ScaleSeries& s = series[ai];
    if (!show[ai] || !s.supported) continue;
    leg.push_back({algo_color(s.algo), lab::sim_algorithm_name(s.algo), 0});
    for (const ScalePoint& p : s.points)
      if (p.ready && p.r.busbw > 0) {
        lo = std::min(lo, p.r.busbw);
        hi = std::max(hi, p.r.busbw);
      }
  }
}

// busbw against GPUs, one line per algorithm, at the chosen size. Returns the node count clicked (0: none).
int busbw_by_nodes_chart(const ChartArgs& x) {
  const ScaleCharts& c = *x.c;
  double lo = 0, hi = 0;
  std::vector<LegendEntry> leg;
  busbw_legend_and_range(c.by_nodes, x.show, leg, lo, hi);
  const int gpn = c.by_nodes.empty() ? 8 : c.by_nodes[0].points[0].gpus;
  const int gpus_hi = gpn * kScaleMaxNodes;
  Frame f = chart_frame("busbw_nodes", x.size, gpn / 1.25, gpus_hi * 1.25, gpu_ticks(gpn, gpus_hi), lo, hi, gbs_tick,
                        "GPUs (log scale)", "busbw GB/s", leg);
  if (!f.ok) return 0;
  ImDrawList* dl = ImGui::GetWindowDrawList();
  const float chosen = f.x.at(static_cast<double>(c.settings.nodes) * gpn);
  dl->AddRectFilled(ImVec2(chosen - 5, f.a.y), ImVec2(chosen + 5, f.b.y), kChosen);
  std::vector<double> xs;
  for (const ScalePoint& p : c.by_nodes[0].points) xs.push_back(p.gpus);
  for (size_t ai = 0; ai < c.by_nodes.size(); ++ai) {
    const ScaleSeries& s = c.by_nodes[ai];
    if (!x.show[ai] || !s.supported) continue;
    const ImU32 col = algo_color(s.algo);
    std::vector<ImVec2> line;
    for (const ScalePoint& p : s.points)
      if (p.ready && p.r.busbw > 0) line.emplace_back(f.x.at(p.gpus), f.y.at(p.r.busbw));
    if (line.size() > 1) dl->AddPolyline(line.data(), static_cast<int>(line.size()), col, 0, 2.2f);
    for (const ImVec2& q : line) dl->AddCircleFilled(q, 3.2f, col, 10);
  }
  const int hi_i = nearest_x(f, xs);
  if (hi_i >= 0) {
    const float hx = f.x.at(xs[static_cast<size_t>(hi_i)]);
    dl->AddLine(ImVec2(hx, f.a.y), ImVec2(hx, f.b.y), col::kDim);
    const ScalePoint& p0 = c.by_nodes[0].points[static_cast<size_t>(hi_i)];
    ImGui::BeginTooltip();
    ImGui::Text("%d node%s x %d = %s GPUs, %s %s", p0.nodes, p0.nodes == 1 ? "" : "s", gpn, fmt_count(p0.gpus).c_str(),
                scale_size_text(p0.bytes).c_str(), lab::sim_collective_name(c.settings.collective));
    for (size_t ai = 0; ai < c.by_nodes.size(); ++ai) {
      const ScaleSeries& s = c.by_nodes[ai];
      if (!x.show[ai] || !s.supported) continue;
      tooltip_algorithm_row(s, s.points[static_cast<size_t>(hi_i)], c.settings.collective);
    }
    ImGui::TextDisabled("click: show %s GPUs in the other charts", fmt_count(p0.gpus).c_str());
    ImGui::EndTooltip();
    if (f.clicked) return p0.nodes;
  }
  return 0;
}

// time against GPUs for one algorithm, each bar split in proportion to latency, bandwidth and
// contention; the emulated run's allreduces and their wire prediction at its own N.
int time_by_nodes_chart(const ChartArgs& x) {
  const ScaleCharts& c = *x.c;
  const ScaleSeries* s = c.nodes_series(x.split);
  const int gpn = c.by_nodes.empty() ? 8 : c.by_nodes[0].points[0].gpus;
  const EmulatedRun* run = x.run && x.run->why_not.empty() && !x.run->points.empty() ? x.run : nullptr;
  int gpus_lo = gpn;
  if (run)
    while (gpus_lo > 1 && gpus_lo > run->ranks) gpus_lo /= 2;
  double lo = 1e300, hi = 0;
  if (s && s->supported)
    for (const ScalePoint& p : s->points)
      if (p.ready && p.r.time_s > 0) {
        lo = std::min(lo, p.r.time_s);
        hi = std::max(hi, p.r.time_s);
      }
  if (run)
    for (const EmulatedPoint& e : run->points) {
      lo = std::min({lo, e.seconds.front(), e.predicted.time_s});
      hi = std::max({hi, e.seconds.back(), e.predicted.time_s});
    }
  if (!s) return 0;
  std::vector<LegendEntry> leg = {{kLatency, "latency", 1}, {kBandwidth, "bandwidth", 1}, {kContention, "contention", 1},
                                  {algo_color(s->algo), std::string(lab::sim_algorithm_name(s->algo)) + " total", 0}};
  if (run) {
    leg.push_back({kMeasured, "this run: measured", 2});
    leg.push_back({kPredicted, "its wire prediction", 3});
  }
  Frame f = chart_frame("time_nodes", x.size, gpus_lo / 1.25, gpn * kScaleMaxNodes * 1.25,
                        gpu_ticks(gpus_lo, gpn * kScaleMaxNodes), lo, hi, time_tick, "GPUs (log scale)",
                        "time per collective", leg);
  if (!f.ok) return 0;
  ImDrawList* dl = ImGui::GetWindowDrawList();
  const float chosen = f.x.at(static_cast<double>(c.settings.nodes) * gpn);
  dl->AddRectFilled(ImVec2(chosen - 5, f.a.y), ImVec2(chosen + 5, f.b.y), kChosen);
  std::vector<double> xs;
  for (const ScalePoint& p : s->points) xs.push_back(p.gpus);
  const float bar_w = std::max(6.0f, (f.x.at(2.0) - f.x.at(1.0)) * 0.55f);
  if (s->supported) {
    for (const ScalePoint& p : s->points) {
      if (!p.ready || !(p.r.time_s > 0)) continue;
      const float cx = f.x.at(p.gpus), top = f.y.at(p.r.time_s), h = f.b.y - top;
      const double parts[3] = {p.r.latency_s, p.r.bandwidth_s, p.r.contention_s};
      const ImU32 cols[3] = {kLatency, kBandwidth, kContention};
      float y = f.b.y;
      for (int k = 0; k < 3; ++k) {
        const float ph = static_cast<float>(parts[k] / p.r.time_s) * h;
        if (ph > 0.2f) dl->AddRectFilled(ImVec2(cx - bar_w / 2, y - ph), ImVec2(cx + bar_w / 2, y), cols[k]);
        y -= ph;
      }
    }
    std::vector<ImVec2> line;
    for (const ScalePoint& p : s->points)
      if (p.ready && p.r.time_s > 0) line.emplace_back(f.x.at(p.gpus), f.y.at(p.r.time_s));
    if (line.size() > 1) dl->AddPolyline(line.data(), static_cast<int>(line.size()), algo_color(s->algo), 0, 2.0f);
  } else {
    const std::string m = fmt("%s: %s", lab::sim_algorithm_name(s->algo), s->why.c_str());
    ImGui::GetWindowDrawList()->AddText(ImVec2(f.a.x + 8, (f.a.y + f.b.y) / 2), col::kWarn, m.c_str());
  }
  // the emulated run: each measured allreduce a dot, the median a ring, the prediction a diamond
  std::vector<ImVec2> run_pts;
  if (run) {
    const float rx = f.x.at(run->ranks);
    for (size_t i = 0; i < run->points.size(); ++i) {
      const EmulatedPoint& e = run->points[i];
      const float dx = (static_cast<float>(i) - (run->points.size() - 1) / 2.0f) * 12;
      for (double v : e.seconds) dl->AddCircleFilled(ImVec2(rx + dx, f.y.at(v)), 2.5f, with_alpha(kMeasured, 0.7f), 8);
      const ImVec2 m(rx + dx, f.y.at(e.median_s));
      dl->AddCircle(m, 5.5f, kMeasured, 14, 2.0f);
      const ImVec2 q(rx + dx, f.y.at(e.predicted.time_s));
      dl->AddQuad(ImVec2(q.x, q.y - 6), ImVec2(q.x + 6, q.y), ImVec2(q.x, q.y + 6), ImVec2(q.x - 6, q.y), kPredicted, 2.0f);
      run_pts.push_back(m);
    }
    const std::string lab_s = "this run (emulated, its own link and buckets)";
    ImFont* small = font(FontId::Small);
    const ImVec2 ts = text_size(small, lab_s);
    float ly = run_pts.front().y - ts.y - 8;
    if (ly < f.a.y + 2) ly = run_pts.front().y + 8;
    text_at(dl, small, ImVec2(std::min(rx + 10, f.b.x - ts.x - 2), ly), kMeasured, lab_s);
  }

  // hover: a run's point, else the nearest bar
  if (f.hovered && run) {
    for (size_t i = 0; i < run_pts.size(); ++i)
      if (std::fabs(f.mouse.x - run_pts[i].x) < 7) {
        const EmulatedPoint& e = run->points[i];
        ImGui::BeginTooltip();
        ImGui::Text("this run (emulated): %d ranks, %s", run->ranks, run->link.c_str());
        ImGui::Text("gradient bucket allreduce of %s (%s bytes), %s", fmt_bytes(static_cast<double>(e.bytes)).c_str(),
                    fmt_count(static_cast<double>(e.bytes)).c_str(), run->algo == lab::SimAlgorithm::Ring ? "ring" : "tree (rhd)");
        ImGui::Text("measured: median %s of %zu (%s .. %s), the last rank's start to the last rank's end",
                    fmt_time(e.median_s).c_str(), e.seconds.size(), fmt_time(e.seconds.front()).c_str(),
                    fmt_time(e.seconds.back()).c_str());
        ImGui::Text("the simulator, wire protocol on this link: %s (latency %s + bandwidth %s + contention %s)",
                    fmt_time(e.predicted.time_s).c_str(), fmt_time(e.predicted.latency_s).c_str(),
                    fmt_time(e.predicted.bandwidth_s).c_str(), fmt_time(e.predicted.contention_s).c_str());
        ImGui::Text("measured / predicted: %.2f", e.median_s / e.predicted.time_s);
        ImGui::EndTooltip();
        return 0;
      }
  }
  const int hi_i = nearest_x(f, xs);
  if (hi_i >= 0) {
    const ScalePoint& p = s->points[static_cast<size_t>(hi_i)];
    const float hx = f.x.at(p.gpus);
    dl->AddRect(ImVec2(hx - bar_w / 2 - 2, f.a.y), ImVec2(hx + bar_w / 2 + 2, f.b.y), col::kDim);
    ImGui::BeginTooltip();
    ImGui::Text("%s %s of %s on %s GPUs (%d node%s)", lab::sim_algorithm_name(s->algo),
                lab::sim_collective_name(c.settings.collective), scale_size_text(p.bytes).c_str(),
                fmt_count(p.gpus).c_str(), p.nodes, p.nodes == 1 ? "" : "s");
    if (p.ready && p.r.time_s > 0) {
      point_lines(p.r, c.settings.collective);
      ImGui::Text("shares: latency %.0f%%, bandwidth %.0f%%, contention %.0f%%", 100 * p.r.latency_s / p.r.time_s,
                  100 * p.r.bandwidth_s / p.r.time_s, 100 * p.r.contention_s / p.r.time_s);
    } else if (!p.error.empty()) {
      ImGui::TextUnformatted(p.error.c_str());
    } else {
      ImGui::TextDisabled("computing...");
    }
    ImGui::TextDisabled("click: show %s GPUs in the other charts", fmt_count(p.gpus).c_str());
    ImGui::EndTooltip();
    if (f.clicked) return p.nodes;
  }
  return 0;
}

// busbw against the size on the chosen N, each algorithm; the ring / dbtree crossover marked.
// Returns the size clicked (0: none).
uint64_t busbw_by_size_chart(const ChartArgs& x, const ScaleCrossover& cross) {
  const ScaleCharts& c = *x.c;
  double lo = 0, hi = 0;
  std::vector<LegendEntry> leg;
  busbw_legend_and_range(c.by_size, x.show, leg, lo, hi);
  if (cross.known && cross.index >= 0) leg.push_back({col::kText, "ring / dbtree crossover", 0});
  Frame f = chart_frame("busbw_size", x.size, kScaleMinBytes / 1.4, kScaleMaxBytes * 1.4, size_ticks(), lo, hi, gbs_tick,
                        "size per collective (log scale)", "busbw GB/s", leg);
  if (!f.ok) return 0;
  ImDrawList* dl = ImGui::GetWindowDrawList();
  ImFont* small = font(FontId::Small);
  const float chosen = f.x.at(static_cast<double>(c.settings.bytes));
  dl->AddRectFilled(ImVec2(chosen - 5, f.a.y), ImVec2(chosen + 5, f.b.y), kChosen);
  std::vector<double> xs;
  for (uint64_t b : scale_sizes()) xs.push_back(static_cast<double>(b));
  for (size_t ai = 0; ai < c.by_size.size(); ++ai) {
    const ScaleSeries& s = c.by_size[ai];
    if (!x.show[ai] || !s.supported) continue;
    const ImU32 col = algo_color(s.algo);
    std::vector<ImVec2> line;
    for (const ScalePoint& p : s.points)
      if (p.ready && p.r.busbw > 0) line.emplace_back(f.x.at(static_cast<double>(p.bytes)), f.y.at(p.r.busbw));
    if (line.size() > 1) dl->AddPolyline(line.data(), static_cast<int>(line.size()), col, 0, 2.2f);
  }
  // the crossover: a dashed line between the last size where dbtree is faster and the first where
  // ring is (and back, where dbtree wins again), labelled
  auto mark = [&](uint64_t bytes, bool first, const std::string& s, int row) {
    const double b = static_cast<double>(bytes);
    const float cx = first ? f.x.at(b) : f.x.at(b / std::sqrt(2.0));
    for (float y = f.a.y; y < f.b.y; y += 9) dl->AddLine(ImVec2(cx, y), ImVec2(cx, std::min(y + 5, f.b.y)), col::kText, 1.5f);
    const ImVec2 ts = text_size(small, s);
    const float tx = cx + 5 + ts.x > f.b.x ? cx - ts.x - 5 : cx + 5;
    const float ty = f.b.y - (ts.y + 6) * static_cast<float>(row + 1);
    dl->AddRectFilled(ImVec2(tx - 2, ty - 2), ImVec2(tx + ts.x + 2, ty + ts.y + 2), IM_COL32(24, 25, 28, 230));
    text_at(dl, small, ImVec2(tx, ty), col::kText, s);
  };
  if (cross.known && cross.index >= 0) {
    mark(cross.bytes, cross.index == 0,
         cross.index == 0 ? "ring faster than dbtree from the smallest size"
                          : "ring faster than dbtree from " + scale_size_text(cross.bytes),
         cross.back >= 0 ? 1 : 0);
    if (cross.back >= 0) mark(cross.back_bytes, false, "dbtree faster again from " + scale_size_text(cross.back_bytes), 0);
  }
  const int hi_i = nearest_x(f, xs);
  if (hi_i >= 0) {
    const float hx = f.x.at(xs[static_cast<size_t>(hi_i)]);
    dl->AddLine(ImVec2(hx, f.a.y), ImVec2(hx, f.b.y), col::kDim);
    const uint64_t bytes = scale_sizes()[static_cast<size_t>(hi_i)];
    const int gpus = c.by_size.empty() ? 0 : c.by_size[0].points[0].gpus;
    ImGui::BeginTooltip();
    ImGui::Text("%s %s on %s GPUs", scale_size_text(bytes).c_str(), lab::sim_collective_name(c.settings.collective),
                fmt_count(gpus).c_str());
    const lab::SimResult* best = nullptr;
    const char* best_name = "";
    for (size_t ai = 0; ai < c.by_size.size(); ++ai) {
      const ScaleSeries& s = c.by_size[ai];
      if (!x.show[ai] || !s.supported) continue;
      const ScalePoint& p = s.points[static_cast<size_t>(hi_i)];
      if (tooltip_algorithm_row(s, p, c.settings.collective) && (!best || p.r.time_s < best->time_s)) {
        best = &p.r;
        best_name = lab::sim_algorithm_name(s.algo);
      }
    }
    if (best) ImGui::Text("fastest: %s", best_name);
    ImGui::TextDisabled("click: choose %s", scale_size_text(bytes).c_str());
    ImGui::EndTooltip();
    if (f.clicked) return bytes;
  }
  return 0;
}

// ---- captions: what each chart says, with its numbers ----

std::string busbw_caption(const ScaleCharts& c) {
  std::string s = std::string("busbw (nccl-tests) = algbw x ") +
                  (c.settings.collective == lab::SimCollective::Allreduce ? "2(N-1)/N for allreduce" : "(N-1)/N") +
                  ": the bandwidth each GPU's link carries; a flat line scales, a falling one spends its time on "
                  "something other than bytes.";
  const ScaleSeries* ring = c.nodes_series(lab::SimAlgorithm::Ring);
  if (ring && ring->points.front().ready && ring->points.back().ready)
    s += fmt(" Ring at %s: %s on %d GPUs, %s on %s.", scale_size_text(c.settings.bytes).c_str(),
             fmt_gbs(ring->points.front().r.busbw).c_str(), ring->points.front().gpus,
             fmt_gbs(ring->points.back().r.busbw).c_str(), fmt_count(ring->points.back().gpus).c_str());
  return s;
}

std::string time_caption(const ScaleCharts& c, lab::SimAlgorithm a) {
  std::string s = "latency: the fixed cost of every hop (NCCL's base and per-hop latencies, or the wire's), paid once "
                  "per step in a row. A ring allreduce passes 2(N-1) steps one after the other (reduce-scatter, "
                  "allgather: N-1), so its latency grows linearly with N; the trees pass about 2 log2 N. bandwidth: the bytes over the busiest link; contention: "
                  "time lost where GPUs share a NIC or an uplink (each bar split in proportion).";
  const ScaleSeries* sr = c.nodes_series(a);
  if (sr && sr->supported) {
    for (const ScalePoint& p : sr->points)
      if (p.nodes == c.settings.nodes && p.ready && p.r.time_s > 0)
        s += fmt(" %s on %s GPUs: latency %s of %s (%.0f%%).", lab::sim_algorithm_name(a), fmt_count(p.gpus).c_str(),
                 fmt_time(p.r.latency_s).c_str(), fmt_time(p.r.time_s).c_str(), 100 * p.r.latency_s / p.r.time_s);
  }
  return s;
}

std::string size_caption(const ScaleCharts& c, const ScaleCrossover& x) {
  std::string s = std::string("Small collectives are latency-bound: few hops win (trees). Large ones are "
                              "bandwidth-bound: the ring sends each GPU's minimum, ") +
                  (c.settings.collective == lab::SimCollective::Allreduce ? "2(N-1)/N" : "(N-1)/N") + " of the buffer.";
  const int gpus = c.by_size.empty() ? 0 : c.by_size[0].points[0].gpus;
  if (c.settings.collective != lab::SimCollective::Allreduce) s += " (dbtree runs allreduce only: no crossover.)";
  else if (!x.known) s += " Crossover: computing...";
  else if (x.index < 0) s += fmt(" On %s GPUs dbtree is faster at every size up to 8 GiB.", fmt_count(gpus).c_str());
  else {
    s += x.index == 0 ? fmt(" On %s GPUs ring is faster than dbtree from the smallest size", fmt_count(gpus).c_str())
                      : fmt(" On %s GPUs ring overtakes dbtree at %s", fmt_count(gpus).c_str(), scale_size_text(x.bytes).c_str());
    if (x.back < 0) s += x.index == 0 ? " on." : " and stays faster.";
    else
      s += fmt("; dbtree is faster again from %s (%s: one ring's bandwidth against two trees').",
               scale_size_text(x.back_bytes).c_str(), lab::sim_protocol_name(c.settings.protocol));
  }
  return s;
}

// ---- 5. the view ----

template <typename E>
bool enum_combo(const char* label, E& v, const std::vector<E>& all, const char* (*name)(E), float width) {
  bool changed = false;
  ImGui::SetNextItemWidth(width);
  if (ImGui::BeginCombo(label, name(v))) {
    for (E e : all)
      if (ImGui::Selectable(name(e), e == v)) {
        v = e;
        changed = true;
      }
    ImGui::EndCombo();
  }
  return changed;
}

int log2_of(uint64_t v) {
  int l = 0;
  while ((uint64_t{1} << (l + 1)) <= v) ++l;
  return l;
}

void draw_controls(ScaleViewCache& st, const lab::Topology& t1) {
  ScaleSettings& s = st.s;
  const float fs = ImGui::GetFontSize();
  const std::vector<std::string> presets = lab::topology_presets();
  ImGui::AlignTextToFramePadding();
  ImGui::TextUnformatted("topology");
  ImGui::SameLine();
  ImGui::SetNextItemWidth(fs * 7.5f);
  if (ImGui::BeginCombo("##topology", s.preset.c_str())) {
    for (const std::string& p : presets)
      if (ImGui::Selectable(p.c_str(), p == s.preset && !s.custom)) {
        s.preset = p;
        s.custom.reset();
      }
    // the simulate run's own topology (a file's, or a preset with other GPUs per node)
    if (st.from && st.from->settings.custom &&
        ImGui::Selectable(st.from->settings.preset.c_str(), s.custom.has_value() && s.preset == st.from->settings.preset)) {
      s.preset = st.from->settings.preset;
      s.custom = st.from->settings.custom;
    }
    ImGui::EndCombo();
  }
  tooltip(t1.about);
  note_item("value", "scale: preset", true, s.preset);
  ImGui::SameLine(0, fs);
  ImGui::TextUnformatted("collective");
  ImGui::SameLine();
  enum_combo("##collective", s.collective,
             {lab::SimCollective::Allreduce, lab::SimCollective::ReduceScatter, lab::SimCollective::Allgather},
             lab::sim_collective_name, fs * 8);
  note_item("value", "scale: collective", true, lab::sim_collective_name(s.collective));
  ImGui::SameLine(0, fs);
  ImGui::TextUnformatted("protocol");
  ImGui::SameLine();
  enum_combo("##protocol", s.protocol,
             {lab::SimProtocol::Simple, lab::SimProtocol::LL128, lab::SimProtocol::LL, lab::SimProtocol::Wire},
             lab::sim_protocol_name, fs * 5.5f);
  tooltip("simple, ll128, ll: NCCL's protocols (NCCL 2.30.7's latencies and bandwidth factors; its steps overlap, "
          "pipelined). wire: the topology's own link latencies and bandwidths, steps that wait for each other, as "
          "dtlab's emulated ranks on the link model.");
  note_item("value", "scale: protocol", true, lab::sim_protocol_name(s.protocol));
  ImGui::SameLine(0, fs);
  ImGui::TextUnformatted("N");
  ImGui::SameLine();
  int nl = log2_of(static_cast<uint64_t>(s.nodes));
  const std::string nlabel = fmt("%d node%s = %s GPUs", s.nodes, s.nodes == 1 ? "" : "s",
                                 fmt_count(static_cast<double>(s.nodes) * t1.gpus_per_node).c_str());
  ImGui::SetNextItemWidth(fs * 12);
  if (ImGui::SliderInt("##nodes", &nl, 0, log2_of(kScaleMaxNodes), nlabel.c_str(), ImGuiSliderFlags_NoInput))
    s.nodes = 1 << nl;
  tooltip("nodes of " + std::to_string(t1.gpus_per_node) + " GPUs, powers of two");
  note_item("slider", "N", true, nlabel);
  ImGui::SameLine(0, fs);
  ImGui::TextUnformatted("size");
  ImGui::SameLine();
  int sl = log2_of(s.bytes);
  const std::string slabel = scale_size_text(s.bytes);
  ImGui::SetNextItemWidth(fs * 8);
  if (ImGui::SliderInt("##size", &sl, log2_of(kScaleMinBytes), log2_of(kScaleMaxBytes), slabel.c_str(),
                       ImGuiSliderFlags_NoInput))
    s.bytes = uint64_t{1} << sl;
  tooltip("the collective's size S as nccl-tests gives it: the buffer of an allreduce, the input of a "
          "reduce-scatter, the output of an allgather");
  note_item("slider", "size", true, slabel);

  // second row: which algorithms, and whose time is split
  ImGui::AlignTextToFramePadding();
  ImGui::TextUnformatted("algorithms");
  const int n_gpus = s.nodes * t1.gpus_per_node;
  const char* about[4] = {"ring: the flat ring over all GPUs (NCCL's rings; dtlab's ring under wire): 2(N-1) steps",
                          "rhd: recursive halving-doubling, dtlab's --allreduce tree: 2 log2 N steps",
                          "dbtree: NCCL's double binary tree over the nodes, a chain inside each node (allreduce only)",
                          "hier: reduce-scatter in each node, a ring across nodes per local GPU, allgather in each node"};
  for (size_t i = 0; i < scale_algorithms().size(); ++i) {
    const lab::SimAlgorithm a = scale_algorithms()[i];
    std::string why;
    const bool ok = lab::sim_supports(a, s.collective, n_gpus, &why);
    ImGui::SameLine(0, i == 0 ? fs * 0.5f : fs);
    ImGui::PushStyleColor(ImGuiCol_CheckMark, ImGui::ColorConvertU32ToFloat4(kAlgoColor[i]));
    ImGui::PushStyleColor(ImGuiCol_Text, ImGui::ColorConvertU32ToFloat4(ok ? kAlgoColor[i] : col::kFaint));
    ImGui::BeginDisabled(!ok);
    ImGui::Checkbox(lab::sim_algorithm_name(a), &st.show[i]);
    ImGui::EndDisabled();
    ImGui::PopStyleColor(2);
    tooltip(ok ? about[i] : std::string(about[i]) + "\n\nnot here: " + why);
    note_item("checkbox", lab::sim_algorithm_name(a), ok);
  }
  ImGui::SameLine(0, fs * 2);
  ImGui::TextUnformatted("time split and drawing of");
  ImGui::SameLine();
  enum_combo("##split", st.split, scale_algorithms(), lab::sim_algorithm_name, fs * 5.5f);
  note_item("value", "scale: split", true, lab::sim_algorithm_name(st.split));
}

void update_run(ScaleViewCache& st, const RunData& d, const FrameClock& clock) {
  const bool changed = st.run_identity != d.identity || st.run_phase != d.phase;
  const bool news = st.run_events_version != d.events_version;
  if (!changed && !(news && (clock.frozen || clock.now - st.run_built_at > 0.5))) return;
  st.run = emulated_run(d);
  st.run_identity = d.identity;
  st.run_phase = d.phase;
  st.run_events_version = d.events_version;
  st.run_built_at = clock.now;
}

std::string run_line(const EmulatedRun& r) {
  if (!r.why_not.empty())
    return "No emulated run on the time chart: " + r.why_not +
           ". Open one trained with it (dtlab run --world-size 4 --link-gbps 1 --link-latency-us 50 --out DIR) to see "
           "its allreduces here.";
  std::string s = fmt("This run (emulated, %d ranks, %s, %s): ", r.ranks, r.link.c_str(),
                      r.algo == lab::SimAlgorithm::Ring ? "ring" : "tree = rhd");
  for (size_t i = 0; i < r.points.size(); ++i) {
    const EmulatedPoint& e = r.points[i];
    s += fmt("%s%s bucket: measured %s (median of %zu), the simulator's wire prediction %s (measured / predicted %.2f)",
             i ? "; " : "",
             fmt_bytes(static_cast<double>(e.bytes)).c_str(), fmt_time(e.median_s).c_str(), e.seconds.size(),
             fmt_time(e.predicted.time_s).c_str(), e.median_s / e.predicted.time_s);
  }
  s += ". Measured: from the last rank's start to the last one's end (the simulator starts every rank together).";
  if (r.overlapped)
    s += " DDP overlapped these allreduces with backward: the ranks' CPUs were shared with the computation "
         "(--no-overlap measures the allreduces alone).";
  return s;
}

}  // namespace

void draw_scale_view(const RunData& d, ScaleViewState& state, const FrameClock& clock) {
  if (!state.cache) state.cache = std::make_shared<ScaleViewCache>();
  ScaleViewCache& st = *state.cache;
  const float fs = ImGui::GetFontSize();

  if (state.apply) {  // a simulate run's settings (a lesson's observation, --open)
    st.from = *state.apply;
    state.apply.reset();
    st.s = st.from->settings;
    if (!st.from->algorithms.empty()) {
      for (size_t i = 0; i < scale_algorithms().size(); ++i)
        st.show[i] = std::find(st.from->algorithms.begin(), st.from->algorithms.end(), scale_algorithms()[i]) !=
                     st.from->algorithms.end();
      st.split = st.from->algorithms.front();
    }
    st.charts_valid = false;
  }

  lab::Topology t1;
  try {
    t1 = scale_topology(st.s, 1);
  } catch (const std::exception&) {
    st.s.preset = lab::topology_presets().front();
    st.s.custom.reset();
    t1 = scale_topology(st.s, 1);
  }
  draw_controls(st, t1);
  const lab::Topology t = scale_topology(st.s, st.s.nodes);

  if (!st.charts_valid || st.charts.settings != st.s) {
    st.charts = scale_charts(st.s);
    st.charts_valid = true;
  }
  // screenshots wait for every point; otherwise the worker fills them in
  if (st.charts.missing > 0) st.sim.fill(st.charts, clock.frozen);
  update_run(st, d, clock);
  const ScaleCrossover cross = ring_tree_crossover(st.charts);

  const std::string line = lab::topology_line(t);
  ImGui::TextDisabled("%s", line.c_str());
  tooltip(t.about);
  note_item("value", "scale: topology", true, line);
  const char* hint = "simulated (dtlab simulate); hover a chart for its figures, click one to choose N or the size";
  ImGui::SameLine(0, fs * 2);
  if (ImGui::CalcTextSize(hint).x < ImGui::GetContentRegionAvail().x) ImGui::TextDisabled("%s", hint);
  else ImGui::NewLine();
  if (st.charts.missing > 0) {
    ImGui::SameLine();
    ImGui::TextColored(ImGui::ColorConvertU32ToFloat4(col::kWarn), "  simulating... %d points to go", st.charts.missing);
  }
  if (st.from) {  // where these settings came from
    const std::string from = st.from->line + (st.from->note.empty() ? "" : " " + st.from->note);
    ImGui::PushStyleColor(ImGuiCol_Text, ImGui::ColorConvertU32ToFloat4(kMeasured));
    ImGui::TextWrapped("%s", from.c_str());
    ImGui::PopStyleColor();
    note_item("value", "scale: from", true, from);
  }
  draw_topology(t, st.split, st.s.collective);

  // the charts: three columns, each a title, the chart and what it says
  const std::string caps[3] = {busbw_caption(st.charts), time_caption(st.charts, st.split),
                               size_caption(st.charts, cross)};
  // the run's allreduces; a simulate run's view says nothing of a training run it does not have
  const std::string runl = st.run.why_not.empty() || !st.from ? run_line(st.run) : "";
  const float avail_w = ImGui::GetContentRegionAvail().x;
  const float col_w = (avail_w - ImGui::GetStyle().ItemSpacing.x * 4) / 3;
  float cap_h = 0;
  for (const std::string& c : caps) cap_h = std::max(cap_h, ImGui::CalcTextSize(c.c_str(), nullptr, false, col_w).y);
  const float run_h = runl.empty() ? 0 : ImGui::CalcTextSize(runl.c_str(), nullptr, false, avail_w).y;
  const float chart_h = std::max(fs * 13, ImGui::GetContentRegionAvail().y - cap_h - run_h - fs * 3.6f);

  ChartArgs args;
  args.c = &st.charts;
  args.show = st.show;
  args.split = st.split;
  args.run = &st.run;
  args.size = ImVec2(col_w, chart_h);
  const std::string s_text = scale_size_text(st.s.bytes);
  const std::string n_text = fmt_count(static_cast<double>(st.s.nodes) * t.gpus_per_node);
  if (ImGui::BeginTable("scale_charts", 3, ImGuiTableFlags_SizingStretchSame | ImGuiTableFlags_BordersInnerV)) {
    ImGui::TableNextColumn();
    heading(fmt("busbw against GPUs, %s %s", s_text.c_str(), lab::sim_collective_name(st.s.collective)).c_str());
    args.size.x = ImGui::GetContentRegionAvail().x;
    if (const int n = busbw_by_nodes_chart(args)) st.s.nodes = n;
    note(caps[0]);
    ImGui::TableNextColumn();
    heading(fmt("time against GPUs: %s, %s", lab::sim_algorithm_name(st.split), s_text.c_str()).c_str());
    args.size.x = ImGui::GetContentRegionAvail().x;
    if (const int n = time_by_nodes_chart(args)) st.s.nodes = n;
    note(caps[1]);
    ImGui::TableNextColumn();
    heading(fmt("busbw against size, %s GPUs", n_text.c_str()).c_str());
    args.size.x = ImGui::GetContentRegionAvail().x;
    if (const uint64_t b = busbw_by_size_chart(args, cross)) st.s.bytes = b;
    note(caps[2]);
    ImGui::EndTable();
  }
  if (!runl.empty()) {
    ImGui::PushStyleColor(ImGuiCol_Text, ImGui::ColorConvertU32ToFloat4(st.run.why_not.empty() ? kMeasured : col::kDim));
    ImGui::TextWrapped("%s", runl.c_str());
    ImGui::PopStyleColor();
  }

  // what a test reads back (--screenshot-items)
  if (recording_drawn_items()) {
    note_item("value", "scale: settings", true,
              fmt("%s %s %s %d nodes %llu bytes", st.s.preset.c_str(), lab::sim_collective_name(st.s.collective),
                  lab::sim_protocol_name(st.s.protocol), st.s.nodes, static_cast<unsigned long long>(st.s.bytes)));
    note_item("value", "scale: channels", true, fmt("%d", st.s.channels));
    std::string drawn;
    for (size_t i = 0; i < scale_algorithms().size(); ++i)
      if (st.show[i]) drawn += (drawn.empty() ? "" : ",") + std::string(lab::sim_algorithm_name(scale_algorithms()[i]));
    note_item("value", "scale: algorithms", true, drawn);
    note_item("value", "scale: missing", true, fmt("%d", st.charts.missing));
    note_item("value", "scale: crossover", true,
              !cross.known ? "unknown" : cross.index < 0 ? "none" : fmt("%llu", static_cast<unsigned long long>(cross.bytes)));
    for (const ScaleSeries& s : st.charts.by_nodes) {
      std::string v;
      for (const ScalePoint& p : s.points) v += (v.empty() ? "" : " ") + (p.ready ? fmt("%.9g", p.r.busbw) : std::string("-"));
      note_item("value", std::string("scale: busbw by GPUs ") + lab::sim_algorithm_name(s.algo), s.supported, v);
    }
    if (st.run.why_not.empty())
      for (const EmulatedPoint& e : st.run.points)
        note_item("value", fmt("scale: this run %llu", static_cast<unsigned long long>(e.bytes)), true,
                  fmt("measured %.9g predicted %.9g n %zu", e.median_s, e.predicted.time_s, e.seconds.size()));
    else
      note_item("value", "scale: this run", false, st.run.why_not);
  }
}

}  // namespace viz
