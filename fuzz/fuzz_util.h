// What the harnesses share: a scratch directory for the parsers that read files, and the rule they
// check.
//
// The rule is the project's: bad input gets a clear, typed error, never a crash. Every harness
// calls its parser and catches only the error type the parser's header promises (lab::Error and
// its subclasses, lessons::ExprError). Anything else that escapes (std::out_of_range, a JSON
// library exception, std::bad_alloc), an abort, a sanitizer report, a timeout or running out of
// memory is a finding: libFuzzer stops and writes the input as crash-<sha1> (tools/fuzz.sh).
#pragma once

#include <stdlib.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <stdexcept>
#include <string>

namespace fuzz {

// A fresh directory under $TMPDIR (else /tmp) for this process, removed at exit. tools/fuzz.sh
// points TMPDIR at a folder of its own (in memory when it can), which it removes itself: a crash
// skips this clean-up.
class ScratchDir {
 public:
  ScratchDir() {
    const char* tmp = std::getenv("TMPDIR");
    std::string tmpl = std::string(tmp && tmp[0] ? tmp : "/tmp") + "/dtlab-fuzz-XXXXXX";
    if (!mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed for " + tmpl);
    m_path = tmpl;
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(m_path, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  const std::string& path() const { return m_path; }
  std::string file(const std::string& name) const { return m_path + "/" + name; }

 private:
  std::string m_path;
};

inline const ScratchDir& scratch() {
  static ScratchDir dir;
  return dir;
}

// Writes bytes to path, replacing the file. A failure is the harness's own problem: abort.
inline void write_file(const std::string& path, const void* data, size_t size) {
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f || (size && std::fwrite(data, 1, size, f) != size) || std::fclose(f) != 0) {
    std::perror(path.c_str());
    std::abort();
  }
}

inline void write_file(const std::string& path, const std::string& text) {
  write_file(path, text.data(), text.size());
}

}  // namespace fuzz
