#include "drawn_items.h"

#include <cmath>

namespace viz {

namespace {

// ImGui's "label##id": the user reads the part before "##".
std::string visible(const std::string& label) { return label.substr(0, label.find("##")); }

// NaN and infinities have no JSON number: null, as metrics.jsonl writes them.
nlohmann::json numbers(const std::vector<float>& v) {
  nlohmann::json a = nlohmann::json::array();
  for (float f : v) a.push_back(std::isfinite(f) ? nlohmann::json(f) : nlohmann::json());
  return a;
}

}  // namespace

void DrawnItems::add(const std::string& kind, const std::string& label, bool enabled, const std::string& value) {
  DrawnItem it;
  it.window = window;
  it.kind = kind;
  it.label = visible(label);
  it.enabled = enabled;
  it.value = value;
  m_items.push_back(std::move(it));
}

void DrawnItems::add_chart(const std::string& id, bool empty) {
  DrawnItem it;
  it.window = window;
  it.kind = "chart";
  it.chart = id;
  it.empty = empty;
  m_items.push_back(std::move(it));
}

void DrawnItems::add_series(const std::string& chart, const std::string& label, const float* x, const float* y, int n) {
  DrawnItem it;
  it.window = window;
  it.kind = "series";
  it.chart = chart;
  it.label = label;
  it.n = n;
  if (n <= kMaxPoints && x && y) {
    it.x.assign(x, x + n);
    it.y.assign(y, y + n);
  }
  m_items.push_back(std::move(it));
}

nlohmann::json DrawnItems::to_json(const std::string& screenshot, const std::string& view) const {
  nlohmann::json items = nlohmann::json::array();
  for (const DrawnItem& it : m_items) {
    nlohmann::json j = {{"window", it.window}, {"kind", it.kind}};
    if (!it.label.empty()) j["label"] = it.label;
    if (it.kind == "button" || it.kind == "checkbox" || it.kind == "slider") j["enabled"] = it.enabled;
    if (it.kind == "value") j["value"] = it.value;
    if (!it.chart.empty()) j["chart"] = it.chart;
    if (it.kind == "chart") j["empty"] = it.empty;
    if (it.kind == "series") {
      j["n"] = it.n;
      if (static_cast<int>(it.x.size()) == it.n) {
        j["x"] = numbers(it.x);
        j["y"] = numbers(it.y);
      }
    }
    items.push_back(std::move(j));
  }
  return {{"format", "dtlab drawn items"}, {"version", 1}, {"screenshot", screenshot}, {"view", view}, {"items", items}};
}

std::string drawn_items_path(const std::string& screenshot) {
  std::string stem = screenshot;
  if (stem.size() > 4 && stem.compare(stem.size() - 4, 4, ".png") == 0) stem.resize(stem.size() - 4);
  return stem + ".items.json";
}

}  // namespace viz
