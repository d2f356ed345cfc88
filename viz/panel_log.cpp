// Log: warnings and errors of the app and of the runs (a failed run's error with its hint, a
// corrupt layout file, a missing dataset or font). The app keeps working after any of them.
#include "draw.h"
#include "panels.h"

namespace viz {

void draw_log_panel(const LogBuffer& log, LogViewState& st) {
  const std::vector<LogEntry> entries = log.entries();
  ImGui::Checkbox("follow", &st.auto_scroll);
  tooltip("Scroll to the newest message when one arrives.");
  ImGui::SameLine();
  ImGui::TextDisabled("%d error(s), %d warning(s)", log.count(LogLevel::Error), log.count(LogLevel::Warning));
  ImGui::BeginChild("log_lines", ImVec2(0, 0), false);
  for (const LogEntry& e : entries) {
    const ImU32 c = e.level == LogLevel::Error ? col::kError : e.level == LogLevel::Warning ? col::kWarn : col::kText;
    ImGui::TextDisabled("%6.1fs", e.t);
    ImGui::SameLine();
    ImGui::PushStyleColor(ImGuiCol_Text, c);
    ImGui::PushTextWrapPos(0);
    if (e.repeats > 1) ImGui::TextUnformatted(fmt("%s (x%d)", e.text.c_str(), e.repeats).c_str());
    else ImGui::TextUnformatted(e.text.c_str());
    ImGui::PopTextWrapPos();
    ImGui::PopStyleColor();
  }
  if (st.auto_scroll && entries.size() != st.seen) ImGui::SetScrollHereY(1.0f);
  st.seen = entries.size();
  ImGui::EndChild();
}

}  // namespace viz
