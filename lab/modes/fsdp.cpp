// FSDP's units, shards and gradient scaling: see fsdp.h.
#include "fsdp.h"

namespace lab {

std::vector<FsdpUnit> fsdp_units(const std::vector<std::string>& names, const std::vector<int64_t>& numels,
                                 const std::string& wrap, int world) {
  std::vector<FsdpUnit> units;
  for (size_t i = 0; i < names.size(); ++i) {
    const size_t dot = names[i].rfind('.');
    const std::string module = wrap == "layer" && dot != std::string::npos ? names[i].substr(0, dot) : "";
    if (units.empty() || units.back().name != module) {
      units.emplace_back();
      units.back().name = module;
    }
    units.back().params.push_back(static_cast<int>(i));
    units.back().numel += numels[i];
  }
  for (FsdpUnit& u : units) u.shard = (u.numel + world - 1) / world;
  return units;
}

int fsdp_predivide_factor(int world) {
  int factor = 1;
  while (world % factor == 0 && world / factor > factor) factor *= 2;
  return factor;
}

}  // namespace lab
