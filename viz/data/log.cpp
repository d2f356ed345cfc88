#include "log.h"

namespace viz {

void LogBuffer::add(LogLevel level, const std::string& text, double t) {
  std::lock_guard<std::mutex> lock(m_mu);
  if (!m_entries.empty() && m_entries.back().text == text && m_entries.back().level == level) {
    ++m_entries.back().repeats;
    m_entries.back().t = t;
    return;
  }
  m_entries.push_back(LogEntry{t, level, text, 1});
}

std::vector<LogEntry> LogBuffer::entries() const {
  std::lock_guard<std::mutex> lock(m_mu);
  return m_entries;
}

size_t LogBuffer::size() const {
  std::lock_guard<std::mutex> lock(m_mu);
  return m_entries.size();
}

int LogBuffer::count(LogLevel level) const {
  std::lock_guard<std::mutex> lock(m_mu);
  int n = 0;
  for (const LogEntry& e : m_entries) n += e.level == level;
  return n;
}

}  // namespace viz
