#include "backends.h"

#include "errors.h"
#include "threads/transport_threads.h"

namespace lab {

std::unique_ptr<World> make_world(const RunConfig& cfg) {
  if (cfg.comm == "threads") return std::make_unique<ThreadsWorld>(cfg.world_size);
  throw ConfigError("--comm: transport '" + cfg.comm + "' is not in this build", "available: threads");
}

std::vector<std::string> available_transports() { return {"threads"}; }

}  // namespace lab
