// Fuzzes the reader of bn_stats.bin (lab/run/bn_stats.h: parse_bn_stats), the BatchNorm
// statistics that `dtlab gui --open`, lessons and tools/read_bn_stats.py read back.
// Input: the file's bytes. Expected errors: lab::IoError (any lab::Error). Anything else is a
// finding.
#include <cstdint>
#include <string>

#include "bn_stats.h"
#include "errors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  try {
    const lab::BnStatsFile f = lab::parse_bn_stats(bytes, "bn_stats.bin");
    // what a reader does next: walk every step's records
    size_t values = 0;
    for (const auto& step : f.steps)
      for (const auto& r : step)
        for (const auto& l : r.bn) values += l.batch_mean.size() + l.running_var.size();
    (void)values;
  } catch (const lab::Error&) {
  }
  return 0;
}
