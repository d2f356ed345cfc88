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
      {"link-per-pair",
       "the simulated network gives every ordered pair of ranks a link of its own instead of one link per rank "
       "to a switch: a rank's messages to different ranks leave at the same time, so sending to N-1 ranks costs "
       "one message time"},
      {"naive-relay",
       "the naive allreduce's rank 0 sends the sum to rank 1 only, and each rank passes it on to the next: rank 0 "
       "sends S instead of (N-1) S (the same sum, the same bits)"},
      {"dp-replicate-chain",
       "DataParallel's replicate passes the parameters and buffers from device to device (0 -> 1 -> 2 ...) "
       "instead of device 0 sending a copy to every device: device 0 is no longer at one end of every transfer"},
      {"async-no-interleaving",
       "the parameter server serves a worker that pulled again until it has pushed: no other push comes between a "
       "worker's pull and its push, so no gradient is ever stale"},
      {"async-take-turns",
       "the seeded parameter server serves the workers in turn, each worker's push followed by its next pull: "
       "the N-1 other workers push between any worker's pull and its push (staleness N-1 once under way)"},
      {"ddp-launch-after-backward",
       "DDP with overlap on launches every bucket's allreduce after the whole backward, as --no-overlap does"},
      {"ddp-no-overlap-in-hook",
       "DDP with --no-overlap launches each bucket's allreduce inside backward, on the backward thread, as soon "
       "as the bucket is ready (InHook) instead of after backward"},
      {"ddp-launch-unfinished-bucket",
       "DDP with overlap launches a bucket's allreduce at the first of its gradients to be ready, reducing the "
       "others before backward has computed them"},
      {"naive-drops-last-rank",
       "the naive allreduce's rank 0 receives the last rank's buffer but leaves it out of the sum"},
      {"bench-busbw-own-traffic",
       "dtlab bench allreduce reports naive's busbw from its rank 0's traffic, algbw x 2(N-1), instead of "
       "nccl-tests' algbw x 2(N-1)/N for every algorithm"},
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
