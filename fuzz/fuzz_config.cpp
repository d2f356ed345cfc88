// Fuzzes config.toml reading (lab/core/config.h: config_from_toml_file), as `dtlab gui --open`
// and lessons read a run directory's configuration, then its validation.
// Expected errors: lab::ConfigError (any lab::Error). Anything else is a finding.
#include <cstdint>
#include <string>

#include "config.h"
#include "errors.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = fuzz::scratch().file("config.toml");
  fuzz::write_file(path, data, size);
  try {
    const lab::RunConfig c = lab::config_from_toml_file(path);
    (void)lab::to_toml(c, {{"sgemm", "reference"}});
  } catch (const lab::Error&) {
  }
  return 0;
}
