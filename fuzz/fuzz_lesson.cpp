// Fuzzes the lesson file reader (lessons/runner/lesson.h: parse_lesson, in memory): TOML syntax,
// every part of a lesson, the run flags parsed by the CLI's own definitions, the expressions and
// placeholders, the cross-references; and reflow() of the raw text.
// Expected errors: lessons::LessonError (a lab::ConfigError). Anything else is a finding.
#include <cstdint>
#include <string>

#include "errors.h"
#include "lesson.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const lessons::Lesson l = lessons::parse_lesson(text, "lessons/fuzz.toml");
    (void)l.parts();
  } catch (const lab::Error&) {
  }
  (void)lessons::reflow(text);
  return 0;
}
