// AppOptions: what `dtlab gui` was asked to do, besides the run configuration. Plain data, no GUI
// headers: the CLI fills it in every build, with or without the GUI.
#pragma once

#include <string>

namespace viz {

struct AppOptions {
  std::string open_dir;        // --open RUN_DIR: show a finished run instead of training; or a
                               //   bench result (result.json, or its directory): the Benchmark view
  std::string screenshot;      // --screenshot FILE.png: save the window, then exit 0
  bool screenshot_items = false;  // --screenshot-items: also FILE.items.json, what was drawn (drawn_items.h)
  std::string frame_stats;     // --frame-stats FILE.json: frame times and samples/s, at exit
  std::string view;            // --view ring|batchnorm|batching|traineval|bench|memory|pipeline|grid|scale|layout (comma list)
  double ui_scale = 0;         // --ui-scale: 0 means the monitor's content scale
  int ring_steps = -1;         // --ring-steps K: with --screenshot, K ring steps into the next
                               //   gradient allreduce after --steps iterations
  bool paused = false;         // --paused: open with the run paused before its first step
  bool compare_bn = false;     // --compare-bn: also run the other BatchNorm mode (same seed)
  double delay_ms = 0;         // --delay-ms: slow motion, wait per gate (ring step, iteration)
  int fps = 60;                // --fps: frame-rate cap while interacting
  int width = 1600, height = 1000;  // --window-size WxH (logical pixels before scaling)
  // --rank-nice: the run's threads at the process's nice value + this (run_host.h): frames go
  // first when both want the CPU (a rank at nice 5 weighs a third of the GUI thread). Measured
  // with tools/gui_perf.sh (8 ranks, 2 shared cores, GUI thread not raised): nice 0, 5, 10 gave
  // frame p95 of 15-18, 15-16, 14-15 ms and gui/headless 0.94-1.02, 0.94-1.01, 0.90-0.95. The
  // likely cost of more: a frame preempts a rank mid-collective and every rank waits for it.
  int rank_nice = 5;
  double exit_after = 0;       // --exit-after S: close the window after S seconds (benchmarks)
  bool steps_given = false;    // --steps was on the command line (screenshots wait for it)
  // Lessons (viz/panel_lessons.cpp, viz/data/lesson_driver.h)
  std::string lesson;          // --lesson ID|FILE: open with this lesson in the Lessons panel
  std::string answers;         // --answers K=V,...|auto: commit these predictions and run (scripts)
  std::string lesson_stage;    // --lesson-stage question|observe|results: when --screenshot shoots
  std::string prepared;        // --prepared DIR: replay these runs ("": the lesson's prepared folder if
                               //   it matches, else train; "none": always train)
  bool teacher = false;        // --teacher: show the lessons' teacher notes
};

}  // namespace viz
