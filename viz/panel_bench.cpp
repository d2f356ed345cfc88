// The Benchmark view: a finished `dtlab bench train` or `dtlab bench chain` result (BenchResult,
// from its result.json). Sections:
//   1. axes and formatting shared by the two charts
//   2. bench train: ms per sample against batch size (log x), one sample at a time as a reference
//   3. bench chain: one row per parenthesization, time bars per thread count (log x), FLOPs,
//      GFLOP/s and thread scaling beside them, the dynamic program's order marked
//   4. draw_bench_view: one result, or two side by side
// Every chart is drawn with ImDrawList over an InvisibleButton that reserves its place and reports
// hovering; hovered points and rows get a tooltip with the exact numbers.
#include <algorithm>
#include <cmath>

#include "draw.h"
#include "panels.h"

namespace viz {

namespace {

// ---- 1. axes and formatting ----

constexpr ImU32 kBatched = IM_COL32(86, 180, 233, 255);     // sky blue: the batched step
constexpr ImU32 kOneByOne = IM_COL32(204, 121, 167, 255);   // reddish purple: one sample at a time
constexpr ImU32 kOptimal = col::kGood;                      // the dynamic program's order
// thread counts of a chain, in the order run (Okabe-Ito, the optimal order's green left out)
constexpr ImU32 kThreadColors[] = {IM_COL32(86, 180, 233, 255), IM_COL32(230, 159, 0, 255), IM_COL32(240, 228, 66, 255),
                                   IM_COL32(204, 121, 167, 255), IM_COL32(40, 130, 220, 255), IM_COL32(213, 94, 0, 255)};
ImU32 thread_color(size_t i) { return kThreadColors[i % (sizeof kThreadColors / sizeof kThreadColors[0])]; }

// 1, 2, 5 x 10^k steps giving about `target` ticks over [lo, hi].
double nice_step(double lo, double hi, int target) {
  const double raw = (hi - lo) / std::max(1, target);
  if (!(raw > 0)) return 1;
  const double p = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (raw <= m * p) return m * p;
  return 10 * p;
}

// 1, 2, 5 x 10^k in [lo, hi] (lo > 0); only the powers of ten when there would be more than max_ticks.
std::vector<double> log_ticks(double lo, double hi, size_t max_ticks) {
  std::vector<double> all, decades;
  if (!(lo > 0) || !std::isfinite(hi)) return all;
  int guard = 0;  // the loader bounds the values; this bounds the loop whatever they are
  for (double p = std::pow(10.0, std::floor(std::log10(lo))); p <= hi * 1.000001 && ++guard < 200; p *= 10)
    for (double m : {1.0, 2.0, 5.0}) {
      const double v = p * m;
      if (v >= lo * 0.999999 && v <= hi * 1.000001) {
        all.push_back(v);
        if (m == 1.0) decades.push_back(v);
      }
    }
  return all.size() <= max_ticks || decades.size() < 2 ? all : decades;
}

// A log axis over [lo, hi] mapped onto [a, b] pixels.
struct LogAxis {
  double lo = 1, hi = 10;
  float a = 0, b = 1;
  float at(double v) const {
    const double f = std::log(std::max(v, lo * 1e-3) / lo) / std::log(hi / lo);
    return a + static_cast<float>(f) * (b - a);
  }
};

// The range of a log axis holding [lo, hi] with some room either side, from a 1-2-5 value below
// to one above.
void log_range(double lo, double hi, double room, double& out_lo, double& out_hi) {
  lo /= room;
  hi *= room;
  auto down = [](double v) {
    const double p = std::pow(10.0, std::floor(std::log10(v)));
    for (double m : {5.0, 2.0, 1.0})
      if (p * m <= v) return p * m;
    return p;
  };
  auto up = [](double v) {
    const double p = std::pow(10.0, std::floor(std::log10(v)));
    for (double m : {1.0, 2.0, 5.0, 10.0})
      if (p * m >= v) return p * m;
    return 10 * p;
  };
  out_lo = down(lo);
  out_hi = up(hi);
  if (!(out_hi > out_lo)) out_hi = out_lo * 10;
}

std::string fmt_ms(double ms) { return ms >= 100 ? fmt("%.0f ms", ms) : fmt("%.3g ms", ms); }
std::string fmt_gflop(double flops) {
  if (flops >= 1e7) return fmt("%.3g GFLOP", flops / 1e9);
  if (flops >= 1e4) return fmt("%.3g MFLOP", flops / 1e6);
  return fmt("%.3g kFLOP", flops / 1e3);
}
std::string fmt_tick(double v) { return std::fabs(v) >= 1e4 ? fmt("%.0e", v) : fmt("%g", v); }

void text_in(ImDrawList* dl, ImFont* f, ImVec2 p, ImU32 c, const std::string& s) {
  dl->AddText(f, f->FontSize, p, c, s.c_str());
}
ImVec2 text_size(ImFont* f, const std::string& s) { return f->CalcTextSizeA(f->FontSize, FLT_MAX, 0, s.c_str()); }

// Explanatory text as the other views write it: wrapped, dimmed.
void note(const std::string& s) {
  ImGui::PushStyleColor(ImGuiCol_Text, ImGui::GetStyleColorVec4(ImGuiCol_TextDisabled));
  ImGui::TextWrapped("%s", s.c_str());
  ImGui::PopStyleColor();
}

// The height of wrapped text in the current font at the available width.
float wrapped_height(const std::string& s) {
  return ImGui::CalcTextSize(s.c_str(), nullptr, false, ImGui::GetContentRegionAvail().x).y + ImGui::GetStyle().ItemSpacing.y;
}

void dashed_hline(ImDrawList* dl, float x0, float x1, float y, ImU32 c, float thick) {
  const float dash = 7, gap = 5;
  for (float x = x0; x < x1; x += dash + gap) dl->AddLine(ImVec2(x, y), ImVec2(std::min(x + dash, x1), y), c, thick);
}

// ---- 2. bench train ----

struct SweepPoint {
  double batch = 0, ms = 0;     // batch size, ms per sample
  const BenchSweepRow* row = nullptr;  // nullptr: the batched step of --per-sample alone
};

std::string what_to_notice_sweep(const BenchTrainResult& t) {
  std::string s = "What to notice: ";
  if (t.sweep.size() >= 2) {
    const BenchSweepRow& a = t.sweep.front();
    const BenchSweepRow& b = t.sweep.back();
    s += fmt("from a batch of %lld to one of %lld the time per sample falls %.1fx. The step takes %.1fx as long for "
             "%.0fx the samples: a layer processes the whole batch as one matrix product, and a wider product keeps "
             "the vector units busier (%.3g GFLOP/s at batch %lld, %.3g at %lld). A minibatch is not B samples one "
             "after the other.",
             static_cast<long long>(a.batch_size), static_cast<long long>(b.batch_size), t.ratio_smallest_largest,
             b.step_ms / a.step_ms, static_cast<double>(b.batch_size) / static_cast<double>(a.batch_size), a.gflops,
             static_cast<long long>(a.batch_size), b.gflops, static_cast<long long>(b.batch_size));
  } else if (!t.sweep.empty()) {
    s += "one batch size alone shows no trend: sweep several (--batch-sizes 2,8,32,128,512).";
  }
  if (t.per_sample) {
    const BenchPerSample& p = *t.per_sample;
    if (t.sweep.size() < 2) s = "What to notice:";
    s += fmt(" One sample at a time, the same %lld samples take %.2fx as long as their batched step: every sample "
             "pays a whole forward and backward pass, and each layer's product shrinks to a matrix times a vector.",
             static_cast<long long>(p.batch_size), p.ratio);
    if (p.batchnorm == "frozen")
      s += " (A batch of one has no batch statistics: those passes run BatchNorm with frozen statistics; hover the "
           "line.)";
  }
  return s;
}

std::string per_sample_tooltip(const BenchPerSample& p) {
  std::string s = fmt("One sample at a time: %lld passes of a batch of one, their gradients accumulated x 1/%lld, then "
                      "one SGD step.\n\n%lld passes: %.3f ms, %.4g ms per sample\nthe batched step of %lld: %.3f ms, %.4g "
                      "ms per sample\nratio %.3f / %.3f = %.2fx",
                      static_cast<long long>(p.batch_size), static_cast<long long>(p.batch_size),
                      static_cast<long long>(p.batch_size), p.per_sample_ms, p.per_sample_ms / static_cast<double>(p.batch_size),
                      static_cast<long long>(p.batch_size), p.batched_ms, p.batched_ms / static_cast<double>(p.batch_size),
                      p.per_sample_ms, p.batched_ms, p.ratio);
  if (!p.batchnorm_note.empty()) s += "\n\nBatchNorm " + p.batchnorm + ": " + p.batchnorm_note + ".";
  if (p.grad_max_rel_diff)
    s += fmt("\nGradients, one at a time vs batched: max rel diff %.2g%s", *p.grad_max_rel_diff,
             p.grad_max_rel_param.empty() ? "" : (" (" + p.grad_max_rel_param + ")").c_str());
  if (p.same_computation_max_rel_diff)
    s += fmt("; with the same frozen statistics in both: %.2g (rounding)", *p.same_computation_max_rel_diff);
  if (!p.train_mode_error.empty()) s += "\nIn train mode a batch of one fails: " + p.train_mode_error;
  return s;
}

void draw_sweep_chart(const BenchTrainResult& t, const std::vector<SweepPoint>& pts, bool log_y, ImVec2 size) {
  ImDrawList* dl = ImGui::GetWindowDrawList();
  ImFont* small = font(FontId::Small);
  const float fs = ImGui::GetFontSize(), sfs = small->FontSize;
  const ImVec2 p0 = ImGui::GetCursorScreenPos();
  ImGui::InvisibleButton("sweep_chart", size);
  const bool hovered = ImGui::IsItemHovered();
  const ImVec2 p1(p0.x + size.x, p0.y + size.y);

  const BenchPerSample* ps = t.per_sample ? &*t.per_sample : nullptr;
  const double ref = ps ? ps->per_sample_ms / static_cast<double>(ps->batch_size) : 0;
  double y_lo = pts.front().ms, y_hi = pts.front().ms;
  for (const SweepPoint& p : pts) {
    y_lo = std::min(y_lo, p.ms);
    y_hi = std::max(y_hi, p.ms);
  }
  if (ps) {
    y_lo = std::min(y_lo, ref);
    y_hi = std::max(y_hi, ref);
  }
  // plot area: y tick labels on the left, x tick labels and the axis title below
  const float left = fs * 4.2f, right = fs * 1.2f, top = fs * 0.8f, bottom = fs * 2.8f;
  const ImVec2 a(p0.x + left, p0.y + top), b(p1.x - right, p1.y - bottom);
  if (b.x - a.x < 40 || b.y - a.y < 40) return;
  LogAxis x;
  log_range(pts.front().batch, pts.back().batch, 1.5, x.lo, x.hi);
  x.a = a.x;
  x.b = b.x;
  LogAxis ylog;
  double ys = 0, y_top = 0;
  if (log_y) {
    log_range(y_lo, y_hi, 1.3, ylog.lo, ylog.hi);
    ylog.a = b.y;
    ylog.b = a.y;
  } else {
    ys = nice_step(0, y_hi * 1.12, std::max(2, static_cast<int>((b.y - a.y) / (fs * 3.5f))));
    y_top = std::ceil(y_hi * 1.12 / ys) * ys;
  }
  auto Y = [&](double v) { return log_y ? ylog.at(v) : b.y - static_cast<float>(v / y_top) * (b.y - a.y); };

  // grid, ticks, axis titles
  std::vector<double> yt;
  if (log_y) yt = log_ticks(ylog.lo, ylog.hi, static_cast<size_t>(std::max(2.0f, (b.y - a.y) / (fs * 1.6f))));
  else
    for (double v = 0; v <= y_top * 1.000001; v += ys) yt.push_back(v);
  for (double v : yt) {
    const float y = Y(v);
    dl->AddLine(ImVec2(a.x, y), ImVec2(b.x, y), col::kGrid);
    const std::string s = fmt("%g", v);
    const ImVec2 ts = text_size(small, s);
    text_in(dl, small, ImVec2(a.x - ts.x - 5, y - ts.y / 2), col::kDim, s);
  }
  for (const SweepPoint& p : pts) {  // the batch sizes measured are the ticks
    const float px = x.at(p.batch);
    dl->AddLine(ImVec2(px, a.y), ImVec2(px, b.y), with_alpha(col::kGrid, 0.6f));
    dl->AddLine(ImVec2(px, b.y), ImVec2(px, b.y + 4), col::kDim);
    const std::string s = fmt("%lld", static_cast<long long>(p.batch));
    const ImVec2 ts = ImGui::CalcTextSize(s.c_str());
    dl->AddText(ImVec2(px - ts.x / 2, b.y + 5), col::kText, s.c_str());
  }
  dl->AddRect(a, b, col::kGrid);
  {
    const std::string s = "batch size B (log scale): samples in one training step";
    const ImVec2 ts = text_size(small, s);
    text_in(dl, small, ImVec2((a.x + b.x - ts.x) / 2, b.y + 5 + fs + 2), col::kDim, s);
  }

  dl->PushClipRect(ImVec2(a.x - 1, p0.y), ImVec2(b.x + 1, b.y + 1), true);
  // one sample at a time: a dashed line across (its time per sample does not depend on B), its
  // measurement marked where it was taken, and the ratio to the batched step there
  float ref_y = 0;
  if (ps) {
    ref_y = Y(ref);
    dashed_hline(dl, a.x, b.x, ref_y, kOneByOne, 2.0f);
    const float mx = x.at(static_cast<double>(ps->batch_size));
    dl->AddQuadFilled(ImVec2(mx, ref_y - 6), ImVec2(mx + 6, ref_y), ImVec2(mx, ref_y + 6), ImVec2(mx - 6, ref_y), kOneByOne);
    const float by = Y(ps->batched_ms / static_cast<double>(ps->batch_size));
    if (by - ref_y > fs * 2.5f) {  // the gap between the batched step and one at a time, as an arrow
      const float ax = mx - fs * 0.9f;
      dl->AddLine(ImVec2(ax, ref_y + 8), ImVec2(ax, by - 8), col::kDim, 1.5f);
      dl->AddTriangleFilled(ImVec2(ax, ref_y + 4), ImVec2(ax - 4, ref_y + 11), ImVec2(ax + 4, ref_y + 11), col::kDim);
      dl->AddTriangleFilled(ImVec2(ax, by - 4), ImVec2(ax - 4, by - 11), ImVec2(ax + 4, by - 11), col::kDim);
      const std::string s = fmt("%.2fx", ps->ratio);
      const ImVec2 ts = ImGui::CalcTextSize(s.c_str());
      dl->AddText(ImVec2(ax - ts.x - 6, (ref_y + by - ts.y) / 2), kOneByOne, s.c_str());
    }
    const std::string s = fmt("one sample at a time: %.3g ms per sample (%lld passes of one sample: %.3g ms)", ref,
                              static_cast<long long>(ps->batch_size), ps->per_sample_ms);
    const ImVec2 ts = text_size(small, s);
    // under the line at the right (the batched curve is low there), clear of the arrow
    const float lx = std::max(a.x + 6, mx - fs * 3.5f - ts.x);
    text_in(dl, small, ImVec2(lx, ref_y + 6), kOneByOne, s);
  }
  // the batched step: ms per sample at each size, each point labelled
  std::vector<ImVec2> line;
  for (const SweepPoint& p : pts) line.emplace_back(x.at(p.batch), Y(p.ms));
  if (line.size() >= 2) dl->AddPolyline(line.data(), static_cast<int>(line.size()), kBatched, 0, 2.0f);
  for (size_t i = 0; i < pts.size(); ++i) {
    dl->AddCircleFilled(line[i], 4.5f, kBatched, 12);
    const std::string s = fmt("%.3g", pts[i].ms);
    const ImVec2 ts = text_size(small, s);
    float ly = line[i].y - ts.y - 5;
    if (ps && std::fabs(ly + ts.y / 2 - ref_y) < ts.y) ly = line[i].y + 6;  // not on the reference line
    text_in(dl, small, ImVec2(line[i].x + 5, ly), kBatched, s);
  }
  dl->PopClipRect();

  // legend, top right inside the plot
  {
    const std::string l1 = "batched step: step time / B", l2 = "one sample at a time";
    float lx = b.x - 8 - text_size(small, l1).x - sfs * 1.6f;
    if (ps) lx -= text_size(small, l2).x + sfs * 2.6f;
    const float ly = a.y + 4;
    dl->AddCircleFilled(ImVec2(lx + sfs * 0.4f, ly + sfs * 0.55f), 4.0f, kBatched, 12);
    text_in(dl, small, ImVec2(lx + sfs * 1.1f, ly), col::kText, l1);
    if (ps) {
      const float l2x = lx + sfs * 1.1f + text_size(small, l1).x + sfs * 1.5f;
      dashed_hline(dl, l2x, l2x + sfs * 1.6f, ly + sfs * 0.55f, kOneByOne, 2.0f);
      text_in(dl, small, ImVec2(l2x + sfs * 2.0f, ly), col::kText, l2);
    }
  }

  // hover: the nearest point, else the reference line
  if (hovered) {
    const ImVec2 m = ImGui::GetIO().MousePos;
    int best = -1;
    float best_d = fs * 1.5f;
    for (size_t i = 0; i < line.size(); ++i) {
      const float d = std::hypot(line[i].x - m.x, line[i].y - m.y);
      if (d < best_d) {
        best_d = d;
        best = static_cast<int>(i);
      }
    }
    if (best >= 0) {
      const SweepPoint& p = pts[static_cast<size_t>(best)];
      dl->AddCircle(line[static_cast<size_t>(best)], 8, col::kText, 12, 1.5f);
      if (p.row) {
        const BenchSweepRow& r = *p.row;
        const BenchSweepRow& first = t.sweep.front();
        ImGui::BeginTooltip();
        ImGui::PushTextWrapPos(fs * 32);
        ImGui::Text("batch size %lld", static_cast<long long>(r.batch_size));
        ImGui::Text("step (forward, backward, SGD): %.4g ms", r.step_ms);
        ImGui::Text("ms per sample: %.4g = %.4g / %lld%s", r.ms_per_sample, r.step_ms,
                    static_cast<long long>(r.batch_size * t.world_size),
                    t.world_size > 1 ? fmt(" (B x %lld ranks)", static_cast<long long>(t.world_size)).c_str() : "");
        ImGui::Text("samples/s: %s", fmt_count(r.samples_per_s).c_str());
        if (t.train_flops_per_sample > 0)
          ImGui::Text("GFLOP/s: %.1f = samples/s x %s FLOPs per sample", r.gflops,
                      fmt_count(static_cast<double>(t.train_flops_per_sample)).c_str());
        else
          ImGui::Text("GFLOP/s: %.1f", r.gflops);
        ImGui::Text("speed-up per sample against batch %lld: %.2fx = %.4g / %.4g", static_cast<long long>(first.batch_size),
                    r.speedup_per_sample, first.ms_per_sample, r.ms_per_sample);
        ImGui::PopTextWrapPos();
        ImGui::EndTooltip();
      } else if (ps) {
        ImGui::BeginTooltip();
        ImGui::Text("the batched step of %lld: %.4g ms, %.4g ms per sample", static_cast<long long>(ps->batch_size),
                    ps->batched_ms, p.ms);
        ImGui::EndTooltip();
      }
    } else if (ps && std::fabs(m.y - ref_y) < 6 && m.x >= a.x && m.x <= b.x) {
      ImGui::BeginTooltip();
      ImGui::PushTextWrapPos(fs * 32);
      ImGui::TextUnformatted(per_sample_tooltip(*ps).c_str());
      ImGui::PopTextWrapPos();
      ImGui::EndTooltip();
    }
  }
}

void draw_train(const BenchTrainResult& t, BenchViewState& st) {
  const float fs = ImGui::GetFontSize();
  const BenchPerSample* ps = t.per_sample ? &*t.per_sample : nullptr;
  std::vector<SweepPoint> pts;
  for (const BenchSweepRow& r : t.sweep) pts.push_back({static_cast<double>(r.batch_size), r.ms_per_sample, &r});
  if (pts.empty() && ps)  // --per-sample alone: its batched step is the one point
    pts.push_back({static_cast<double>(ps->batch_size), ps->batched_ms / static_cast<double>(ps->batch_size), nullptr});

  note(fmt("dtlab bench train: one training step (forward, backward, SGD) of the %s%s on a batch of B samples%s, "
           "timed %s. Is a minibatch B samples processed one after the other? Then the time per sample would "
           "not depend on B.",
           t.model.c_str(), t.batchnorm ? "" : " without BatchNorm",
           t.world_size > 1 ? fmt(" per rank, %lld ranks", static_cast<long long>(t.world_size)).c_str() : "",
           t.sweep.size() >= 2 ? "for each B" : "once"));
  if (t.sweep.size() >= 2) {
    const BenchSweepRow& a = t.sweep.front();
    const BenchSweepRow& b = t.sweep.back();
    labeled_value(fmt("per sample, batch %lld vs %lld", static_cast<long long>(a.batch_size), static_cast<long long>(b.batch_size)).c_str(),
                  fmt("%.2fx faster", t.ratio_smallest_largest),
                  fmt("ms per sample at batch %lld / at batch %lld = %.4g / %.4g = %.2f", static_cast<long long>(a.batch_size),
                      static_cast<long long>(b.batch_size), a.ms_per_sample, b.ms_per_sample, t.ratio_smallest_largest));
    ImGui::SameLine(0, fs * 1.5f);
    labeled_value("sgemm", fmt("%.3g to %.3g GFLOP/s", a.gflops, b.gflops),
                  fmt("the step's arithmetic per second: samples/s x training FLOPs per sample%s",
                      t.train_flops_per_sample > 0
                          ? fmt(" (%s)", fmt_count(static_cast<double>(t.train_flops_per_sample)).c_str()).c_str()
                          : ""));
  }
  if (ps) {
    if (t.sweep.size() >= 2) ImGui::SameLine(0, fs * 1.5f);
    labeled_value("one sample at a time", fmt("%.2fx slower than the batch of %lld", ps->ratio, static_cast<long long>(ps->batch_size)),
                  per_sample_tooltip(*ps));
  }
  ImGui::SameLine(0, fs * 1.5f);
  ImGui::Checkbox("log scale", &st.sweep_log_y);
  tooltip("ms per sample on a logarithmic axis (equal ratios, equal distances); off: a linear axis from 0, where the "
          "heights compare directly.");

  const std::string notice = what_to_notice_sweep(t);
  const float h = std::max(fs * 12, ImGui::GetContentRegionAvail().y - wrapped_height(notice) - fs * 1.6f);
  ImGui::TextUnformatted("ms per sample");
  draw_sweep_chart(t, pts, st.sweep_log_y, ImVec2(std::max(fs * 20, ImGui::GetContentRegionAvail().x), h));
  note(notice);
}

// ---- 3. bench chain ----

std::string dims_text(const BenchChainResult& c) {
  std::string s;
  for (size_t i = 1; i < c.dims.size() && i <= 8; ++i)
    s += fmt("%sA%zu %lldx%lld", i > 1 ? ", " : "", i, static_cast<long long>(c.dims[i - 1]), static_cast<long long>(c.dims[i]));
  if (c.dims.size() > 9) s += ", ...";
  return s;
}

std::string what_to_notice_chain(const BenchChainResult& c) {
  double fmin = c.orders.front().flops, fmax = fmin;
  for (const BenchChainOrder& o : c.orders) {
    fmin = std::min(fmin, o.flops);
    fmax = std::max(fmax, o.flops);
  }
  // the cheapest and the most expensive orders at the first thread count, and their scaling at the last
  struct Group {
    double t_lo = 1e300, t_hi = 0, t_mean = 0, gflops = 0, scaling = 0;
    int n = 0;
  } cheap, dear;
  for (const BenchChainOrder& o : c.orders) {
    for (Group* g : {&cheap, &dear}) {
      if (o.flops != (g == &cheap ? fmin : fmax)) continue;
      g->t_lo = std::min(g->t_lo, o.results.front().time_ms);
      g->t_hi = std::max(g->t_hi, o.results.front().time_ms);
      g->t_mean += o.results.front().time_ms;
      g->gflops += o.results.front().gflops;
      g->scaling += o.results.back().scaling;
      ++g->n;
    }
  }
  for (Group* g : {&cheap, &dear}) {
    g->t_mean /= std::max(1, g->n);
    g->gflops /= std::max(1, g->n);
    g->scaling /= std::max(1, g->n);
  }
  auto range = [](const Group& g) {
    return g.n > 1 && g.t_hi > g.t_lo * 1.005 ? fmt("%.3g-%.3g ms", g.t_lo, g.t_hi) : fmt("%.3g ms", g.t_hi);
  };
  std::string s = "What to notice: ";
  if (fmax > fmin * 1.0001 && fmin > 0) {
    s += fmt("the order%s with the fewest FLOPs (%s) take%s %s; with %.3gx the FLOPs, %s: about %.0fx longer",
             cheap.n > 1 ? "s" : "", fmt_gflop(fmin).c_str(), cheap.n > 1 ? "" : "s", range(cheap).c_str(), fmax / fmin,
             range(dear).c_str(), dear.t_mean / cheap.t_mean);
    if (dear.gflops > cheap.gflops * 1.2)
      s += fmt(", not %.3gx, because sgemm runs faster on their big square products (%.0f GFLOP/s) than on the thin "
               "products of the cheap orders (%.0f).",
               fmax / fmin, dear.gflops, cheap.gflops);
    else
      s += ".";
  } else {
    s += fmt("every order needs the same FLOPs here; their times differ by %.2fx.", c.ratio_slowest_fastest);
  }
  s += " The dynamic program finds the cheapest order from the dims alone, in O(n^3), before anything runs.";
  if (c.threads.size() >= 2 && fmax > fmin * 1.0001)
    s += fmt(" With %lld threads instead of %lld, the expensive orders run %.2fx as fast, the cheap ones %.2fx: a thin "
             "product has too little work to share between cores.",
             static_cast<long long>(c.threads.back()), static_cast<long long>(c.threads.front()), dear.scaling, cheap.scaling);
  return s;
}

// The order's most expensive product, in words: "largest product (2048x2048)(2048x2048)".
std::string largest_product(const BenchChainOrder& o, const std::vector<int64_t>& dims) {
  const std::vector<ChainProductShape> ps = chain_products(o.order, dims);
  if (ps.empty()) return "";
  const ChainProductShape* big = &ps.front();
  for (const ChainProductShape& p : ps)
    if (p.flops() > big->flops()) big = &p;
  return fmt("largest product (%lldx%lld)(%lldx%lld)", static_cast<long long>(big->m), static_cast<long long>(big->k),
             static_cast<long long>(big->k), static_cast<long long>(big->n));
}

void draw_chain_chart(const BenchChainResult& c, ImVec2 size) {
  ImDrawList* dl = ImGui::GetWindowDrawList();
  ImFont* small = font(FontId::Small);
  ImFont* mono = font(FontId::Mono);
  const float fs = ImGui::GetFontSize();
  const ImVec2 p0 = ImGui::GetCursorScreenPos();
  ImGui::InvisibleButton("chain_chart", size);
  const bool hovered = ImGui::IsItemHovered();
  const ImVec2 p1(p0.x + size.x, p0.y + size.y);

  double fmin = c.orders.front().flops, t_lo = c.orders.front().results.front().time_ms, t_hi = t_lo;
  for (const BenchChainOrder& o : c.orders) {
    fmin = std::min(fmin, o.flops);
    for (const BenchChainTiming& r : o.results) {
      t_lo = std::min(t_lo, r.time_ms);
      t_hi = std::max(t_hi, r.time_ms);
    }
  }
  const size_t nt = c.threads.size();
  const bool scaling_cols = nt >= 2;
  // columns: order (and its largest product) | bars | FLOPs | GFLOP/s | speed-up per further thread count
  const std::string check = "\xe2\x9c\x93 ";  // the dynamic program's order
  const std::string order_note = check + "the dynamic program's";
  std::vector<std::string> largest;
  float order_w = text_size(small, order_note).x;
  for (const BenchChainOrder& o : c.orders) {
    largest.push_back(largest_product(o, c.dims));
    order_w = std::max({order_w, text_size(mono, check + o.order).x,
                        text_size(mono, "  ").x + text_size(small, largest.back()).x});
  }
  order_w += fs * 1.5f;
  const float flops_w = fs * 9.5f, gflops_w = fs * 6.5f, scale_w = scaling_cols ? fs * 6.5f * static_cast<float>(nt - 1) : 0;
  const float header_h = small->FontSize * 2.4f, axis_h = fs * 2.6f;
  const float bars_x0 = p0.x + order_w, bars_x1 = p1.x - flops_w - gflops_w - scale_w - fs * 0.5f;
  if (bars_x1 - bars_x0 < fs * 8 || size.y < header_h + axis_h + fs * 2) {
    ImGui::TextDisabled("(too little room for the chart: make the window larger)");
    return;
  }
  const float rows_y0 = p0.y + header_h, rows_y1 = p1.y - axis_h;
  const float row_h = (rows_y1 - rows_y0) / static_cast<float>(c.orders.size());
  LogAxis x;
  log_range(t_lo, t_hi, 1.15, x.lo, x.hi);
  x.a = bars_x0;
  x.b = bars_x1 - fs * 3.8f;  // room for the time label at the end of the longest bar
  const float cx_flops = bars_x1 + fs * 0.5f, cx_gflops = cx_flops + flops_w, cx_scale = cx_gflops + gflops_w;

  // header
  auto header = [&](float x0, const std::string& l1, const std::string& l2) {
    text_in(dl, small, ImVec2(x0, p0.y), col::kDim, l1);
    text_in(dl, small, ImVec2(x0, p0.y + small->FontSize * 1.1f), col::kDim, l2);
  };
  header(p0.x + 4, "order", order_note);
  header(bars_x0, "time to multiply the chain out", "");
  {
    float lx = bars_x0;  // the thread counts' colours, under the title
    for (size_t k = 0; k < nt; ++k) {
      const std::string s = fmt("%lld thread%s", static_cast<long long>(c.threads[k]), c.threads[k] == 1 ? "" : "s");
      const float y = p0.y + small->FontSize * 1.1f;
      dl->AddRectFilled(ImVec2(lx, y + 3), ImVec2(lx + fs * 0.9f, y + small->FontSize - 2), thread_color(k));
      text_in(dl, small, ImVec2(lx + fs * 1.2f, y), col::kText, s);
      lx += fs * 1.2f + text_size(small, s).x + fs;
    }
  }
  header(cx_flops, "FLOPs", "(x the fewest)");
  header(cx_gflops, "GFLOP/s", fmt("(%lld thread%s)", static_cast<long long>(c.threads.front()), c.threads.front() == 1 ? "" : "s"));
  for (size_t k = 1; k < nt && scaling_cols; ++k)
    header(cx_scale + fs * 6.5f * static_cast<float>(k - 1), fmt("%lld threads", static_cast<long long>(c.threads[k])),
           fmt("(speed-up vs %lld)", static_cast<long long>(c.threads.front())));

  // time grid and axis
  const std::vector<double> ticks = log_ticks(x.lo, x.hi, static_cast<size_t>(std::max(2.0f, (x.b - x.a) / (fs * 2.8f))));
  for (double v : ticks) {
    const float px = x.at(v);
    dl->AddLine(ImVec2(px, rows_y0), ImVec2(px, rows_y1 + 4), col::kGrid);
    const std::string s = fmt_tick(v);
    const ImVec2 ts = text_size(small, s);
    text_in(dl, small, ImVec2(px - ts.x / 2, rows_y1 + 5), col::kDim, s);
  }
  {
    const std::string s = "ms (log scale)";
    const ImVec2 ts = text_size(small, s);
    text_in(dl, small, ImVec2((x.a + x.b - ts.x) / 2, rows_y1 + 5 + small->FontSize + 3), col::kDim, s);
  }

  // rows
  int hovered_row = -1;
  const ImVec2 mouse = ImGui::GetIO().MousePos;
  for (size_t i = 0; i < c.orders.size(); ++i) {
    const BenchChainOrder& o = c.orders[i];
    const float y0 = rows_y0 + row_h * static_cast<float>(i), y1 = y0 + row_h;
    const bool hov = hovered && mouse.y >= y0 && mouse.y < y1;
    if (hov) hovered_row = static_cast<int>(i);
    if (hov) dl->AddRectFilled(ImVec2(p0.x, y0), ImVec2(p1.x, y1), IM_COL32(255, 255, 255, 14));
    if (o.is_optimal) dl->AddRect(ImVec2(p0.x - 2, y0 + 1), ImVec2(p1.x, y1 - 1), with_alpha(kOptimal, 0.7f), 3.0f);
    const float mid = (y0 + y1) / 2;
    const std::string label = (o.is_optimal ? check : std::string("  ")) + o.order;
    const bool two_lines = !largest[i].empty() && row_h >= mono->FontSize + small->FontSize + 4;
    const float ly = two_lines ? mid - (mono->FontSize + small->FontSize) / 2 : mid - mono->FontSize / 2;
    text_in(dl, mono, ImVec2(p0.x + 4, ly), o.is_optimal ? kOptimal : col::kText, label);
    if (two_lines)
      text_in(dl, small, ImVec2(p0.x + 4 + text_size(mono, "  ").x, ly + mono->FontSize + 1), col::kDim, largest[i]);
    // one bar per thread count, stacked in the row
    const float pad = std::min(row_h * 0.15f, fs * 0.4f);
    const float bh = std::min(fs * 1.5f, (row_h - 2 * pad) / static_cast<float>(nt));
    const float by0 = mid - bh * static_cast<float>(nt) / 2;
    for (size_t k = 0; k < nt; ++k) {
      const BenchChainTiming& r = o.results[k];
      const float ya = by0 + bh * static_cast<float>(k), yb = ya + bh - 1;
      const float xe = std::max(x.a + 2, x.at(r.time_ms));
      dl->AddRectFilled(ImVec2(x.a, ya), ImVec2(xe, yb), thread_color(k), 2.0f);
      if (bh >= small->FontSize * 0.85f) {
        const std::string s = fmt_ms(r.time_ms);
        text_in(dl, small, ImVec2(xe + 4, (ya + yb - small->FontSize) / 2), col::kText, s);
      }
    }
    const double first_gflops = o.results.front().gflops;
    text_in(dl, small, ImVec2(cx_flops, mid - small->FontSize / 2), col::kText,
            fmt("%s (%.3gx)", fmt_gflop(o.flops).c_str(), fmin > 0 ? o.flops / fmin : 1.0));
    text_in(dl, small, ImVec2(cx_gflops, mid - small->FontSize / 2), col::kText, fmt("%.0f", first_gflops));
    for (size_t k = 1; k < nt && scaling_cols; ++k) {
      const double sc = o.results[k].scaling;
      const ImU32 cc = sc >= 1.3 ? col::kGood : sc < 1.1 ? col::kDim : col::kText;
      text_in(dl, small, ImVec2(cx_scale + fs * 6.5f * static_cast<float>(k - 1), mid - small->FontSize / 2), cc,
              fmt("%.2fx", sc));
    }
    if (i + 1 < c.orders.size()) dl->AddLine(ImVec2(p0.x, y1), ImVec2(p1.x, y1), with_alpha(col::kGrid, 0.5f));
  }

  if (hovered_row >= 0) {
    const BenchChainOrder& o = c.orders[static_cast<size_t>(hovered_row)];
    ImGui::BeginTooltip();
    ImGui::PushTextWrapPos(fs * 34);
    ImGui::PushFont(mono);
    ImGui::TextUnformatted(o.order.c_str());
    ImGui::PopFont();
    if (o.is_optimal) ImGui::TextColored(ImGui::ColorConvertU32ToFloat4(kOptimal), "the dynamic program's order");
    ImGui::Text("%s FLOPs (2 m k n summed over its products), %.3gx the fewest", fmt_count(o.flops).c_str(),
                fmin > 0 ? o.flops / fmin : 1.0);
    for (const ChainProductShape& p : chain_products(o.order, c.dims))
      ImGui::TextDisabled("  (%lld x %lld) times (%lld x %lld): %s", static_cast<long long>(p.m), static_cast<long long>(p.k),
                          static_cast<long long>(p.k), static_cast<long long>(p.n), fmt_gflop(p.flops()).c_str());
    for (size_t k = 0; k < nt; ++k) {
      const BenchChainTiming& r = o.results[k];
      ImGui::TextColored(ImGui::ColorConvertU32ToFloat4(thread_color(k)), "%lld thread%s:", static_cast<long long>(r.threads),
                         r.threads == 1 ? "" : "s");
      ImGui::SameLine();
      ImGui::Text("%.4g ms, %.1f GFLOP/s%s, max_rel_diff %.2g", r.time_ms, r.gflops,
                  k > 0 ? fmt(", %.2fx as fast as %lld", r.scaling, static_cast<long long>(c.threads.front())).c_str() : "",
                  r.max_rel_diff);
    }
    ImGui::TextDisabled("time: median of the timing rounds; max_rel_diff: max |C - C_ref| / max |C_ref| against the "
                        "first order at %lld thread%s (rounding%s)",
                        static_cast<long long>(c.threads.front()), c.threads.front() == 1 ? "" : "s",
                        c.tolerance > 0 ? fmt(", bound %.0e", c.tolerance).c_str() : "");
    ImGui::PopTextWrapPos();
    ImGui::EndTooltip();
  }
}

// The chain's matrices side by side, to scale (rows down, columns across): a thin matrix is a
// line, a square one a block. Nothing is drawn where it would not fit in `room`.
void draw_chain_to_scale(const BenchChainResult& c, float room) {
  const float fs = ImGui::GetFontSize();
  ImFont* small = font(FontId::Small);
  const size_t n = c.dims.size() - 1;
  if (n > 12 || room < fs * 5) return;
  int64_t dmax = 1;
  for (int64_t d : c.dims) dmax = std::max(dmax, d);
  const float gap = fs * 2.2f, avail = ImGui::GetContentRegionAvail().x;
  float side = std::min(fs * 7, room - fs * 3);  // the largest dim, in pixels
  float total = 0;
  for (size_t i = 0; i < n; ++i) total += std::max(2.0f, side * static_cast<float>(c.dims[i + 1]) / static_cast<float>(dmax)) + gap;
  if (total > avail) side *= avail / total;
  if (side < fs * 2) return;
  ImGui::TextDisabled("the chain to scale (rows down, columns across):");
  ImDrawList* dl = ImGui::GetWindowDrawList();
  const ImVec2 p0 = ImGui::GetCursorScreenPos();
  float x = p0.x + fs * 0.5f;
  for (size_t i = 0; i < n; ++i) {
    const float w = std::max(2.0f, side * static_cast<float>(c.dims[i + 1]) / static_cast<float>(dmax));
    const float h = std::max(2.0f, side * static_cast<float>(c.dims[i]) / static_cast<float>(dmax));
    dl->AddRectFilled(ImVec2(x, p0.y), ImVec2(x + w, p0.y + h), with_alpha(col::kText, 0.25f));
    dl->AddRect(ImVec2(x, p0.y), ImVec2(x + w, p0.y + h), col::kDim);
    const std::string l = fmt("A%zu %lldx%lld", i + 1, static_cast<long long>(c.dims[i]), static_cast<long long>(c.dims[i + 1]));
    text_in(dl, small, ImVec2(x, p0.y + std::max(h, 2.0f) + 3), col::kDim, l);
    x += std::max(w, text_size(small, l).x) + gap;
  }
  ImGui::Dummy(ImVec2(x - p0.x, side + small->FontSize + 6));
}

void draw_chain(const BenchChainResult& c) {
  const float fs = ImGui::GetFontSize();
  double worst = 0, fmin = c.orders.front().flops, fmax = fmin;
  for (const BenchChainOrder& o : c.orders) {
    fmin = std::min(fmin, o.flops);
    fmax = std::max(fmax, o.flops);
    for (const BenchChainTiming& r : o.results) worst = std::max(worst, r.max_rel_diff);
  }
  note(fmt("dtlab bench chain: the product of %zu matrices (%s) in every order the parentheses allow, timed with sgemm. "
           "Matrix products are associative: every order computes the same result (here to max_rel_diff %.1e), but "
           "not with the same work.",
           c.dims.size() - 1, dims_text(c).c_str(), worst));
  const BenchChainOrder* opt = nullptr;
  for (const BenchChainOrder& o : c.orders)
    if (o.is_optimal) opt = &o;
  labeled_value("dynamic program's order", c.optimal + ", " + fmt_gflop(c.optimal_flops),
                "m[i][j] = min over k of m[i][k] + m[k+1][j] + d_i d_(k+1) d_(j+1) multiply-adds: the order with the "
                "fewest FLOPs, found from the dims alone in O(n^3) steps");
  ImGui::SameLine(0, fs * 1.5f);
  labeled_value("slowest / fastest", fmt("%.3gx", c.ratio_slowest_fastest),
                fmt("at %lld thread%s: the slowest order's time / the fastest's", static_cast<long long>(c.threads.front()),
                    c.threads.front() == 1 ? "" : "s"));
  ImGui::SameLine(0, fs * 1.5f);
  labeled_value("FLOPs, most / fewest", fmt("%.3gx", fmin > 0 ? fmax / fmin : 1.0), "the most expensive order's FLOPs / the cheapest's");
  if (!opt) {
    ImGui::SameLine(0, fs * 1.5f);
    ImGui::TextDisabled("(the dynamic program's order was not timed)");
  }
  const std::string notice = what_to_notice_chain(c);
  // rows of at most two bars' height plus room, at least the two lines of the order's label
  const float nt = static_cast<float>(c.threads.size());
  const float row_max = std::max(fs * 2.6f, fs * 1.5f * nt + fs * 1.8f), row_min = fs * 1.7f;
  const float n = static_cast<float>(c.orders.size()), frame = fs * 5.2f;  // header and axis
  const float room = ImGui::GetContentRegionAvail().y - wrapped_height(notice) - fs * 0.8f;
  const float h = std::clamp(room, row_min * n + frame, row_max * n + frame);
  draw_chain_chart(c, ImVec2(std::max(fs * 30, ImGui::GetContentRegionAvail().x), h));
  note(notice);
  ImGui::Spacing();
  draw_chain_to_scale(c, ImGui::GetContentRegionAvail().y);
}

void draw_one(const BenchResult& r, BenchViewState& st) {
  switch (r.kind) {
    case BenchKind::Train: draw_train(r.train, st); break;
    case BenchKind::Chain: draw_chain(r.chain); break;
    case BenchKind::None:
      note("No benchmark result is open. This view plots the --json file of `dtlab bench train --batch-sizes "
           "2,8,32,128,512 --per-sample` (is a minibatch processed all at once?) and of `dtlab bench chain --dims "
           "8,2048,2048,2048,8 --threads 1,2` (does the order of a matrix chain matter?). Open one with File > Open, "
           "or `dtlab gui --open FILE.json` (or the directory holding result.json); a lesson's bench run shows here "
           "by itself.");
      break;
  }
}

}  // namespace

// ---- 4. the view ----

void draw_bench_view(const BenchResult& r, const BenchResult* twin, BenchViewState& st) {
  if (!twin) {
    draw_one(r, st);
    return;
  }
  if (ImGui::BeginTable("bench_columns", 2, ImGuiTableFlags_BordersInnerV | ImGuiTableFlags_SizingStretchSame)) {
    for (int c = 0; c < 2; ++c) {
      const BenchResult& b = c == 0 ? r : *twin;
      ImGui::TableNextColumn();
      ImGui::PushID(c);
      ImGui::PushFont(font(FontId::Bold));
      ImGui::TextUnformatted(describe_bench(b).c_str());
      ImGui::PopFont();
      draw_one(b, st);
      ImGui::PopID();
    }
    ImGui::EndTable();
  }
}

}  // namespace viz
