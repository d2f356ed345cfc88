// The backend registry: which transports this build has. Front ends (CLI, GUI, tests) pass
// make_world to lab::Run; lab/ itself never names a backend.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "config.h"
#include "transport.h"

namespace lab {

// The World for cfg.comm ("threads"). Throws ConfigError for a transport this build lacks.
std::unique_ptr<World> make_world(const RunConfig& cfg);
// Names of the transports compiled in, e.g. {"threads"}.
std::vector<std::string> available_transports();

}  // namespace lab
