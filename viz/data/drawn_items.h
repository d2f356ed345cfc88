// DrawnItems: what one frame of the lab window drew, in words and numbers, for
// `dtlab gui --screenshot FILE.png --screenshot-items`: FILE.items.json beside the PNG says which
// buttons, sliders and checkboxes were there (and whether greyed out), the headings, labelled values
// and notes, and every chart's series with its points. Tests assert on it ("no Pause button for a
// run opened from its run directory", "test accuracy at iterations 32 and 64") instead of on pixels.
//
// The file (format "dtlab drawn items", version 1):
//   {"format": "dtlab drawn items", "version": 1, "screenshot": "FILE.png", "view": "traineval",
//    "items": [{"window": "Controls", "kind": "button", "label": "Run these settings", "enabled": true},
//              {"window": "Views", "kind": "series", "chart": "te_acc", "label": "...", "n": 2,
//               "x": [32, 64], "y": [0.76, 0.80]}, ...]}
// kind: button, checkbox, slider (a control; "enabled" false when greyed out), heading, value
// (label and "value"), text (a note or message), chart (a chart's id in "chart", "empty" true when it
// said "no data yet"), series (one line or set of dots of a chart: n points, x and y when n <= 256).
// Plain data: the panels fill it through draw.h while the app records a frame.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace viz {

struct DrawnItem {
  std::string window;      // the window it was drawn in: Controls, Views, Timeline, Ranks, Log, Lessons
  std::string kind;        // see above
  std::string label;       // what the user reads (a control's label without ImGui's "##id")
  std::string value;       // kind value: the value shown
  bool enabled = true;     // controls: false when greyed out
  std::string chart;       // chart, series: the chart's id
  bool empty = false;      // chart: nothing to draw ("no data yet")
  int n = 0;               // series: points
  std::vector<float> x, y; // series: the points, when n <= kMaxPoints
};

class DrawnItems {
 public:
  static constexpr int kMaxPoints = 256;
  std::string window;  // where the next items are drawn (the app sets it before each window)

  void add(const std::string& kind, const std::string& label, bool enabled = true, const std::string& value = "");
  void add_chart(const std::string& id, bool empty);
  void add_series(const std::string& chart, const std::string& label, const float* x, const float* y, int n);
  const std::vector<DrawnItem>& items() const { return m_items; }
  void clear() { m_items.clear(); }

  nlohmann::json to_json(const std::string& screenshot, const std::string& view) const;

 private:
  std::vector<DrawnItem> m_items;
};

// FILE.png -> FILE.items.json (any other name: NAME.items.json).
std::string drawn_items_path(const std::string& screenshot);

}  // namespace viz
