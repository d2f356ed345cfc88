// Fuzzes the check of the lab window's layout file (viz/data/paths.h: check_layout_ini), which
// decides whether $XDG_CONFIG_HOME/dtlab/layout.ini is handed to ImGui or ignored with a warning.
// It returns a message and throws nothing: any exception is a finding.
#include <cstdint>
#include <string>

#include "paths.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  (void)viz::check_layout_ini(text);
  return 0;
}
