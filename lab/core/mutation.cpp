#include "mutation.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "errors.h"

namespace lab {

const std::vector<MutationInfo>& known_mutations() {
  static const std::vector<MutationInfo> k = {
      {"ddp-broadcast-once",
       "DDP broadcasts rank 0's buffers at construction only, not before every training forward "
       "(broadcast_buffers then changes nothing during training)"},
      {"gemm-one-thread",
       "sgemm ignores the thread count it is given and computes every product on one thread "
       "(gemm_set_threads: a product no longer uses the cores it may)"},
      {"chain-dp-costliest",
       "the matrix-chain dynamic program keeps the costliest split instead of the cheapest "
       "(bench chain's \"optimal\" order is then the most expensive one)"},
  };
  return k;
}

std::vector<std::string> active_mutations() {
  std::vector<std::string> out;
  const char* env = std::getenv("DTLAB_MUTATE");
  if (!env || !*env) return out;
  const std::string list = env;
  size_t at = 0;
  while (at <= list.size()) {
    const size_t comma = list.find(',', at);
    const std::string name = list.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
    at = comma == std::string::npos ? list.size() + 1 : comma + 1;
    if (name.empty()) continue;
    const auto& known = known_mutations();
    if (std::none_of(known.begin(), known.end(), [&](const MutationInfo& m) { return name == m.name; })) {
      std::string names;
      for (const MutationInfo& m : known) names += (names.empty() ? "" : ", ") + std::string(m.name);
      throw ConfigError("DTLAB_MUTATE: unknown mutation '" + name + "'", "known: " + names);
    }
    out.push_back(name);
  }
  return out;
}

bool mutated(const char* name) {
  const char* env = std::getenv("DTLAB_MUTATE");
  if (!env || !*env) return false;  // the usual case: one getenv
  const std::vector<std::string> on = active_mutations();
  return std::find(on.begin(), on.end(), std::string(name)) != on.end();
}

}  // namespace lab
