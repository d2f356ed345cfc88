// `dtlab gui`: the lab window. Its settings flags are `dtlab run`'s (main.cpp adds them with the
// same add_run_flags), as its starting configuration; its own flags are below. Built without the
// GUI, or run without a display, it says so in one line and exits with kExitNoDisplay (7).
#pragma once

#include <CLI/CLI.hpp>

#include "app_options.h"
#include "config.h"

using GuiOptions = viz::AppOptions;

// The lab's opening configuration: a run that is lively on a laptop and makes every view speak
// (mlp, 4 ranks, per-rank batch 32, periodic train/eval evaluation).
lab::RunConfig gui_default_config();
void add_gui_flags(CLI::App& app, GuiOptions& opt);
// True when this build has the GUI and DISPLAY or WAYLAND_DISPLAY is set: then `dtlab` alone
// opens the lab instead of printing help.
bool gui_available();
// Opens the window; returns the exit code. Throws lab::Error for bad settings (before any window).
int cmd_gui(lab::RunConfig& cfg, GuiOptions& opt);
