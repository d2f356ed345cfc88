// Drawing helpers shared by the panels: the colour-blind-safe palette (Okabe-Ito), number
// formatting, tooltips that explain a number with its formula, and a line chart drawn with
// ImDrawList (ImGui 1.86 has no plotting widget). No state lives here between frames (the recorder
// of --screenshot-items is set for one frame and cleared).
#pragma once

#include <cmath>
#include <string>
#include <vector>

#include <imgui.h>

#include "drawn_items.h"

namespace viz {

// ---- colours ----
// Okabe & Ito (2008), distinguishable with every common colour-vision deficiency. Ranks 0..6 get
// the seven colours; ranks 7..15 reuse them lighter, and charts add a marker to tell them apart.
ImU32 rank_color(int rank, float alpha = 1.0f);
ImVec4 rank_color_vec(int rank);
bool rank_color_is_repeat(int rank);  // rank >= 7: same hue as rank - 7, lighter
ImU32 with_alpha(ImU32 c, float alpha);
ImU32 mix(ImU32 a, ImU32 b, float t);  // t = 0: a, 1: b
// Text that stays readable on top of a fill colour.
ImU32 text_on(ImU32 fill);

namespace col {
constexpr ImU32 kText = IM_COL32(230, 230, 230, 255);
constexpr ImU32 kDim = IM_COL32(150, 150, 150, 255);
constexpr ImU32 kFaint = IM_COL32(90, 90, 95, 255);
constexpr ImU32 kGrid = IM_COL32(70, 70, 75, 255);
constexpr ImU32 kPanel = IM_COL32(32, 33, 36, 255);
constexpr ImU32 kWarn = IM_COL32(240, 228, 66, 255);    // Okabe-Ito yellow
constexpr ImU32 kError = IM_COL32(213, 94, 0, 255);     // Okabe-Ito vermillion
constexpr ImU32 kGood = IM_COL32(0, 158, 115, 255);     // Okabe-Ito bluish green
constexpr ImU32 kEval = IM_COL32(86, 180, 233, 255);    // sky blue: eval mode, running statistics
constexpr ImU32 kTrain = IM_COL32(230, 159, 0, 255);    // orange: train mode, batch statistics
constexpr ImU32 kGlobal = IM_COL32(245, 245, 245, 255);  // white: global / synchronized values
}  // namespace col

// ---- formatting ----
std::string fmt_bytes(double bytes);         // "940 KB", "1.41 MB" (decimal units, like nccl-tests)
std::string fmt_rate(double bytes_per_s);    // "1.23 GB/s"
std::string fmt_count(double n);             // "12,345"
std::string fmt(const char* f, ...) IM_FMTARGS(1);

// ---- explained numbers ----
// Shows a tooltip with `text` when the last item is hovered (also when it is disabled).
void tooltip(const std::string& text);
// "label value" on one line; hovering it shows what it is and the formula with the live operands.
void labeled_value(const char* label, const std::string& value, const std::string& explanation);
// A "(?)" marker with a tooltip.
void help_marker(const std::string& text);
// A heading in the bold font.
void heading(const char* text);
// Wrapped text in a colour.
void text_wrapped_colored(ImU32 color, const std::string& text);
// "[x] newest iteration  [----slider----] iteration": which of the iterations 0..newest a view
// shows (step), following the newest while `follow` is on; moving the slider turns it off. Draws
// nothing while newest < 0 (step is then -1).
void iteration_picker(bool& follow, int64_t& step, int64_t newest);

// Fonts, in the order the app adds them to the atlas (ImGui's font atlas is the only place they
// live): the default font when the atlas has fewer.
enum class FontId { Regular = 0, Bold = 1, Small = 2, Mono = 3 };
ImFont* font(FontId id);

// ---- what was drawn (--screenshot-items) ----
// While a frame is recorded (the app sets `items` for the frame a scripted screenshot captures,
// nullptr for every other frame), the helpers above and line_chart note what they drew, and
// panels note their controls and messages with note_item; otherwise these cost a pointer test.
void record_drawn_items(DrawnItems* items);
bool recording_drawn_items();
void note_window(const char* name);  // the window the next items are drawn in
void note_item(const char* kind, const std::string& label, bool enabled = true, const std::string& value = "");

// ---- line chart ----
struct ChartSeries {
  std::string name;
  ImU32 color = col::kText;
  const float* x = nullptr;  // ascending
  const float* y = nullptr;
  int n = 0;
  float thickness = 1.5f;
  bool dots = false;         // points instead of a line
  bool markers = false;      // a small square on each point (repeat colours)
};

struct ChartOptions {
  const char* id = "chart";
  ImVec2 size{0, 160};      // 0 width: all available
  const char* title = nullptr;
  const char* x_label = "iteration";
  const char* value_fmt = "%.4f";
  float y_min = NAN, y_max = NAN;  // NAN: from the data
  float x_min = NAN, x_max = NAN;
  std::vector<float> x_marks;      // vertical ticks at these x (e.g. buffer broadcasts, epochs)
  ImU32 mark_color = IM_COL32(204, 121, 167, 160);
  const char* marks_label = nullptr;
  bool legend = true;
  bool log_x = false;              // logarithmic x axis (x > 0): early iterations get room
  bool integer_x = true;           // x ticks at whole numbers (iterations)
  std::string hover_note;          // extra tooltip line
};

// Draws the chart; returns the x under the mouse (NAN when not hovered).
float line_chart(const ChartOptions& opt, const std::vector<ChartSeries>& series);

}  // namespace viz
