// The lab window: `dtlab gui`. Runs until the window is closed (or, with --screenshot or
// --frame-stats and --steps, until the script is done) and returns the exit code.
#pragma once

#include "app_options.h"
#include "config.h"

namespace viz {

// cfg: the starting configuration (validated by the caller). Throws lab::Error for bad options
// or an unreadable --open directory before any window opens; returns kExitNoDisplay when no
// window can be opened.
int run_app(const lab::RunConfig& cfg, const AppOptions& opts);

}  // namespace viz
