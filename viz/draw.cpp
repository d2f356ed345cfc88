// Drawing helpers: sections
//   1. palette   2. formatting   3. explained numbers   4. line chart
#include "draw.h"

#include <algorithm>
#include <cstdarg>
#include <cstdio>

namespace viz {

// ---- 1. palette ----

namespace {
// Okabe-Ito without black (the background is dark): orange, sky blue, bluish green, yellow,
// vermillion, reddish purple, blue.
constexpr ImU32 kOkabeIto[7] = {IM_COL32(230, 159, 0, 255),   IM_COL32(86, 180, 233, 255),
                                IM_COL32(0, 158, 115, 255),   IM_COL32(240, 228, 66, 255),
                                IM_COL32(213, 94, 0, 255),    IM_COL32(204, 121, 167, 255),
                                IM_COL32(40, 130, 220, 255)};  // blue #0072B2, lifted for a dark background
}  // namespace

ImU32 mix(ImU32 a, ImU32 b, float t) {
  auto ch = [&](int shift) {
    const float x = static_cast<float>((a >> shift) & 0xFF), y = static_cast<float>((b >> shift) & 0xFF);
    return static_cast<ImU32>(x + (y - x) * t + 0.5f) << shift;
  };
  return ch(IM_COL32_R_SHIFT) | ch(IM_COL32_G_SHIFT) | ch(IM_COL32_B_SHIFT) | ch(IM_COL32_A_SHIFT);
}

ImU32 with_alpha(ImU32 c, float alpha) {
  const ImU32 a = static_cast<ImU32>(std::clamp(alpha, 0.0f, 1.0f) * static_cast<float>((c >> IM_COL32_A_SHIFT) & 0xFF));
  return (c & ~IM_COL32_A_MASK) | (a << IM_COL32_A_SHIFT);
}

ImU32 rank_color(int rank, float alpha) {
  if (rank < 0) return with_alpha(col::kDim, alpha);
  const ImU32 base = kOkabeIto[rank % 7];
  const int round = rank / 7;
  const ImU32 c = round == 0 ? base : mix(base, IM_COL32(255, 255, 255, 255), round == 1 ? 0.45f : 0.7f);
  return with_alpha(c, alpha);
}

ImVec4 rank_color_vec(int rank) { return ImGui::ColorConvertU32ToFloat4(rank_color(rank)); }

bool rank_color_is_repeat(int rank) { return rank >= 7; }

ImU32 text_on(ImU32 fill) {
  const float r = static_cast<float>((fill >> IM_COL32_R_SHIFT) & 0xFF);
  const float g = static_cast<float>((fill >> IM_COL32_G_SHIFT) & 0xFF);
  const float b = static_cast<float>((fill >> IM_COL32_B_SHIFT) & 0xFF);
  return 0.299f * r + 0.587f * g + 0.114f * b > 140 ? IM_COL32(0, 0, 0, 255) : IM_COL32(255, 255, 255, 255);
}

ImFont* font(FontId id) {
  ImFontAtlas* atlas = ImGui::GetIO().Fonts;
  const int i = static_cast<int>(id);
  return i < atlas->Fonts.Size ? atlas->Fonts[i] : ImGui::GetFont();
}

// ---- 2. formatting ----

std::string fmt(const char* f, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, f);
  std::vsnprintf(buf, sizeof buf, f, ap);
  va_end(ap);
  return buf;
}

std::string fmt_bytes(double b) {
  if (b < 1e3) return fmt("%.0f B", b);
  if (b < 1e6) return fmt("%.3g KB", b / 1e3);
  if (b < 1e9) return fmt("%.3g MB", b / 1e6);
  return fmt("%.3g GB", b / 1e9);
}

std::string fmt_rate(double r) { return fmt_bytes(r) + "/s"; }

std::string fmt_count(double n) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.0f", n);
  std::string s = buf, out;
  const size_t start = s[0] == '-' ? 1 : 0;
  for (size_t i = 0; i < s.size(); ++i) {
    if (i > start && (s.size() - i) % 3 == 0) out += ',';
    out += s[i];
  }
  return out;
}

// ---- 3. explained numbers ----

namespace {
DrawnItems* g_drawn = nullptr;  // the frame being recorded for --screenshot-items (nullptr: none)
}  // namespace

void record_drawn_items(DrawnItems* items) { g_drawn = items; }
bool recording_drawn_items() { return g_drawn != nullptr; }
void note_window(const char* name) {
  if (g_drawn) g_drawn->window = name;
}
void note_item(const char* kind, const std::string& label, bool enabled, const std::string& value) {
  if (g_drawn) g_drawn->add(kind, label, enabled, value);
}

void tooltip(const std::string& text) {
  if (!ImGui::IsItemHovered(ImGuiHoveredFlags_AllowWhenDisabled)) return;
  ImGui::BeginTooltip();
  ImGui::PushTextWrapPos(ImGui::GetFontSize() * 32.0f);
  ImGui::TextUnformatted(text.c_str());
  ImGui::PopTextWrapPos();
  ImGui::EndTooltip();
}

void labeled_value(const char* label, const std::string& value, const std::string& explanation) {
  ImGui::BeginGroup();
  ImGui::TextColored(ImGui::ColorConvertU32ToFloat4(col::kDim), "%s", label);
  ImGui::SameLine();
  ImGui::TextUnformatted(value.c_str());
  ImGui::EndGroup();
  tooltip(explanation);
  note_item("value", label, true, value);
}

void help_marker(const std::string& text) {
  ImGui::SameLine();
  ImGui::TextDisabled("(?)");
  tooltip(text);
}

void heading(const char* text) {
  ImGui::PushFont(font(FontId::Bold));
  ImGui::TextUnformatted(text);
  ImGui::PopFont();
  note_item("heading", text);
}

void iteration_picker(bool& follow, int64_t& step, int64_t newest) {
  if (follow || step > newest) step = newest;
  if (newest < 0) return;
  ImGui::Checkbox("newest iteration", &follow);
  ImGui::SameLine();
  int s = static_cast<int>(std::max<int64_t>(0, step));
  ImGui::SetNextItemWidth(ImGui::GetFontSize() * 14);
  if (ImGui::SliderInt("iteration", &s, 0, static_cast<int>(newest))) {
    step = s;
    follow = false;
  }
}

void text_wrapped_colored(ImU32 color, const std::string& text) {
  ImGui::PushStyleColor(ImGuiCol_Text, color);
  ImGui::TextWrapped("%s", text.c_str());
  ImGui::PopStyleColor();
  note_item("text", text);
}

// ---- 4. line chart ----

namespace {

// 1, 2, 5 x 10^k steps giving about `target` ticks over [lo, hi].
double nice_step(double lo, double hi, int target) {
  const double raw = (hi - lo) / std::max(1, target);
  if (!(raw > 0)) return 1;
  const double p = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (raw <= m * p) return m * p;
  return 10 * p;
}

int lower_bound_x(const float* x, int n, float v) {
  return static_cast<int>(std::lower_bound(x, x + n, v) - x);
}

}  // namespace

float line_chart(const ChartOptions& opt, const std::vector<ChartSeries>& series) {
  ImDrawList* dl = ImGui::GetWindowDrawList();
  const float fs = ImGui::GetFontSize();
  if (opt.title) {
    ImGui::TextUnformatted(opt.title);
  }
  ImVec2 size = opt.size;
  if (size.x <= 0) size.x = std::max(50.0f, ImGui::GetContentRegionAvail().x);
  if (size.y <= 0) size.y = std::max(50.0f, ImGui::GetContentRegionAvail().y);
  const ImVec2 p0 = ImGui::GetCursorScreenPos();
  ImGui::InvisibleButton(opt.id, size);
  const bool hovered = ImGui::IsItemHovered();
  const ImVec2 p1(p0.x + size.x, p0.y + size.y);
  dl->AddRect(p0, p1, col::kGrid, 3.0f);  // no fill: every filled pixel costs on a software renderer

  // ranges
  float x0 = opt.x_min, x1 = opt.x_max, y0 = opt.y_min, y1 = opt.y_max;
  const bool auto_x0 = std::isnan(x0), auto_x1 = std::isnan(x1), auto_y0 = std::isnan(y0), auto_y1 = std::isnan(y1);
  for (const ChartSeries& s : series) {
    for (int i = 0; i < s.n; ++i) {
      if (!std::isfinite(s.y[i])) continue;
      if (auto_x0 && (std::isnan(x0) || s.x[i] < x0)) x0 = s.x[i];
      if (auto_x1 && (std::isnan(x1) || s.x[i] > x1)) x1 = s.x[i];
      if (auto_y0 && (std::isnan(y0) || s.y[i] < y0)) y0 = s.y[i];
      if (auto_y1 && (std::isnan(y1) || s.y[i] > y1)) y1 = s.y[i];
    }
  }
  const bool no_data = std::isnan(x0) || std::isnan(x1) || std::isnan(y0) || std::isnan(y1);
  if (g_drawn) {
    g_drawn->add_chart(opt.id, no_data);
    for (const ChartSeries& s : series) g_drawn->add_series(opt.id, s.name, s.x, s.y, s.n);
  }
  if (no_data) {
    const char* msg = "no data yet";
    const ImVec2 ts = ImGui::CalcTextSize(msg);
    dl->AddText(ImVec2((p0.x + p1.x - ts.x) / 2, (p0.y + p1.y - ts.y) / 2), col::kDim, msg);
    return NAN;
  }
  if (x1 <= x0) x1 = x0 + 1;
  if (y1 <= y0) {
    const float pad = std::max(1e-6f, std::fabs(y0) * 0.05f);
    y0 -= pad;
    y1 += pad;
  } else if (auto_y0 || auto_y1) {
    const float pad = (y1 - y0) * 0.03f;
    if (auto_y0) y0 -= pad;
    if (auto_y1) y1 += pad;
  }

  // plot area: room for y tick labels on the left and x labels below
  const float left = fs * 3.6f, bottom = fs * 1.3f, top = fs * 0.4f, right = fs * 0.6f;
  const ImVec2 a(p0.x + left, p0.y + top), b(p1.x - right, p1.y - bottom);
  if (b.x - a.x < 10 || b.y - a.y < 10) return NAN;
  const bool lx = opt.log_x && x0 > 0;
  // Automatic ranges end on a tick: while a run adds points the axes then stay put most frames,
  // and so does every point already drawn (a partial redraw paints only the new segment).
  const int y_ticks = std::max(2, static_cast<int>((b.y - a.y) / (fs * 2.2f)));
  const int x_ticks = std::max(2, static_cast<int>((b.x - a.x) / (fs * 5.0f)));
  if (auto_y0 || auto_y1) {
    const double step = nice_step(y0, y1, y_ticks);
    if (auto_y0) y0 = static_cast<float>(std::floor(y0 / step) * step);
    if (auto_y1) y1 = static_cast<float>(std::ceil(y1 / step) * step);
  }
  if (auto_x1 && lx) {
    double p = std::pow(10.0, std::floor(std::log10(x1)));
    const double m = x1 / p;
    x1 = static_cast<float>(p * (m <= 1 ? 1 : m <= 2 ? 2 : m <= 5 ? 5 : 10));
  } else if (auto_x1) {
    double step = nice_step(x0, x1, x_ticks);
    if (opt.integer_x) step = std::max(step, 1.0);
    x1 = static_cast<float>(std::ceil(x1 / step) * step);
  }
  if (x1 <= x0) x1 = x0 + 1;
  auto X = [&](float x) {
    if (lx) return a.x + std::log(std::max(x, x0) / x0) / std::log(x1 / x0) * (b.x - a.x);
    return a.x + (x - x0) / (x1 - x0) * (b.x - a.x);
  };
  auto Y = [&](float y) { return b.y - (y - y0) / (y1 - y0) * (b.y - a.y); };

  // grid and ticks
  ImFont* small = font(FontId::Small);
  const float sfs = small->FontSize;
  const double ys = nice_step(y0, y1, y_ticks);
  for (double v = std::ceil(y0 / ys) * ys; v <= y1 + 1e-9; v += ys) {
    const float y = Y(static_cast<float>(v));
    dl->AddLine(ImVec2(a.x, y), ImVec2(b.x, y), col::kGrid);
    const std::string t = fmt("%.4g", std::fabs(v) < ys * 1e-6 ? 0.0 : v);
    const ImVec2 ts = small->CalcTextSizeA(sfs, FLT_MAX, 0, t.c_str());
    dl->AddText(small, sfs, ImVec2(a.x - ts.x - 4, y - ts.y / 2), col::kDim, t.c_str());
  }
  std::vector<double> xticks;
  if (lx) {
    for (double p = std::pow(10.0, std::floor(std::log10(x0))); p <= x1; p *= 10)
      for (double m : {1.0, 2.0, 5.0})
        if (p * m >= x0 && p * m <= x1) xticks.push_back(p * m);
  } else {
    double xs = nice_step(x0, x1, x_ticks);
    if (opt.integer_x) xs = std::max(xs, 1.0);
    for (double v = std::ceil(x0 / xs) * xs; v <= x1 + 1e-9; v += xs) xticks.push_back(v);
  }
  for (double v : xticks) {
    const float x = X(static_cast<float>(v));
    dl->AddLine(ImVec2(x, b.y), ImVec2(x, b.y + 3), col::kDim);
    const std::string t = fmt("%.4g", v);
    const ImVec2 ts = small->CalcTextSizeA(sfs, FLT_MAX, 0, t.c_str());
    dl->AddText(small, sfs, ImVec2(x - ts.x / 2, b.y + 3), col::kDim, t.c_str());
  }
  if (opt.x_label) {
    const ImVec2 ts = small->CalcTextSizeA(sfs, FLT_MAX, 0, opt.x_label);
    dl->AddText(small, sfs, ImVec2(b.x - ts.x, b.y - ts.y - 2), col::kFaint, opt.x_label);
  }
  dl->AddRect(a, b, col::kGrid);
  dl->PushClipRect(a, b, true);
  for (float m : opt.x_marks)
    if (m >= x0 && m <= x1) dl->AddLine(ImVec2(X(m), a.y), ImVec2(X(m), b.y), opt.mark_color, 1.0f);

  // Series: at most about one point per pixel column is drawn (every k-th point), with a whole
  // pixel width: ImGui draws those anti-aliased from its font texture in 2 triangles per
  // segment, where a width of 1.5 takes 6. Mesa's software renderer pays per triangle: eight
  // ranks' curves at 2 points per column and width 1.5 were 58,000 triangles per frame.
  const int budget = static_cast<int>(b.x - a.x);
  std::vector<ImVec2> pts;
  for (const ChartSeries& s : series) {
    if (s.n <= 0) continue;
    const int first = std::max(0, lower_bound_x(s.x, s.n, x0) - 1);
    const int last = std::min(s.n, lower_bound_x(s.x, s.n, x1) + 1);
    // a power of two, and points at its multiples: as points are added, those drawn stay the same
    int stride = 1;
    while (stride * std::max(1, budget) < last - first) stride *= 2;
    pts.clear();
    for (int i = first - first % stride; i < last; i += stride)
      if (std::isfinite(s.y[i])) pts.emplace_back(X(s.x[i]), Y(s.y[i]));
    if (last - 1 > first && (last - 1 - first) % stride != 0 && std::isfinite(s.y[last - 1]))
      pts.emplace_back(X(s.x[last - 1]), Y(s.y[last - 1]));
    if (s.dots) {
      for (const ImVec2& p : pts) dl->AddCircleFilled(p, s.thickness + 0.5f, s.color, 6);
    } else if (pts.size() >= 2) {
      dl->AddPolyline(pts.data(), static_cast<int>(pts.size()), s.color, 0, std::max(1.0f, std::round(s.thickness)));
    } else if (pts.size() == 1) {
      dl->AddCircleFilled(pts[0], s.thickness + 1.5f, s.color, 8);
    }
    if (s.markers && pts.size() < 400)
      for (const ImVec2& p : pts) dl->AddRect(ImVec2(p.x - 2, p.y - 2), ImVec2(p.x + 2, p.y + 2), s.color);
  }
  dl->PopClipRect();

  // legend
  if (opt.legend && series.size() > 1 && series.size() <= 10) {
    float lx = b.x - 4, ly = a.y + 3;
    for (auto it = series.rbegin(); it != series.rend(); ++it) {
      if (it->name.empty()) continue;
      const ImVec2 ts = small->CalcTextSizeA(sfs, FLT_MAX, 0, it->name.c_str());
      lx -= ts.x + sfs * 1.6f;
      dl->AddRectFilled(ImVec2(lx, ly + ts.y * 0.3f), ImVec2(lx + sfs * 0.8f, ly + ts.y * 0.7f), it->color);
      dl->AddText(small, sfs, ImVec2(lx + sfs, ly), col::kText, it->name.c_str());
    }
  }

  // hover: a vertical line and every series' value at the nearest x
  float hover_x = NAN;
  if (hovered) {
    const float mx = ImGui::GetIO().MousePos.x;
    if (mx >= a.x && mx <= b.x) {
      const float f = (mx - a.x) / (b.x - a.x);
      hover_x = lx ? x0 * std::exp(f * std::log(x1 / x0)) : x0 + f * (x1 - x0);
      dl->AddLine(ImVec2(mx, a.y), ImVec2(mx, b.y), col::kDim);
      ImGui::BeginTooltip();
      bool any = false;
      for (const ChartSeries& s : series) {
        if (s.n <= 0) continue;
        int i = lower_bound_x(s.x, s.n, hover_x);
        if (i >= s.n) i = s.n - 1;
        if (i > 0 && std::fabs(s.x[i - 1] - hover_x) < std::fabs(s.x[i] - hover_x)) --i;
        if (!any) ImGui::Text("%s %.6g", opt.x_label ? opt.x_label : "x", s.x[i]);
        any = true;
        ImGui::TextColored(ImGui::ColorConvertU32ToFloat4(s.color), "%s", s.name.c_str());
        ImGui::SameLine();
        ImGui::Text(opt.value_fmt, s.y[i]);
      }
      if (opt.marks_label && !opt.x_marks.empty()) ImGui::TextDisabled("%s", opt.marks_label);
      if (!opt.hover_note.empty()) {
        ImGui::PushTextWrapPos(fs * 30);
        ImGui::TextDisabled("%s", opt.hover_note.c_str());
        ImGui::PopTextWrapPos();
      }
      ImGui::EndTooltip();
    }
  }
  return hover_x;
}

}  // namespace viz
