// LogBuffer: the messages of the log panel (warnings, errors, notes), with a time stamp. Repeated
// messages are counted instead of repeated. Thread-safe: the run host may add from its thread.
#pragma once

#include <mutex>
#include <string>
#include <vector>

namespace viz {

enum class LogLevel { Info, Warning, Error };

struct LogEntry {
  double t = 0;  // seconds since the app started
  LogLevel level = LogLevel::Info;
  std::string text;
  int repeats = 1;
};

class LogBuffer {
 public:
  void add(LogLevel level, const std::string& text, double t);
  // A copy of every entry (the log stays short: repeats are counted, not stored).
  std::vector<LogEntry> entries() const;
  size_t size() const;
  int count(LogLevel level) const;

 private:
  mutable std::mutex m_mu;
  std::vector<LogEntry> m_entries;
};

}  // namespace viz
