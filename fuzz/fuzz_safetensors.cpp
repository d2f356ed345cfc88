// Fuzzes the safetensors reader (lab/nn/safetensors.h: read_safetensors), as `dtlab run --init`,
// `dtlab eval --weights` and lessons read weights files.
// Expected errors: lab::IoError (any lab::Error). Anything else is a finding.
#include <cstdint>
#include <map>
#include <string>

#include "errors.h"
#include "fuzz_util.h"
#include "safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = fuzz::scratch().file("weights.safetensors");
  fuzz::write_file(path, data, size);
  try {
    std::map<std::string, std::string> metadata;
    (void)lab::read_safetensors(path, &metadata);
  } catch (const lab::Error&) {
  }
  return 0;
}
