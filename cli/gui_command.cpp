#include "gui_command.h"

#include <cstdio>
#include <cstdlib>
#include <string>

#include "errors.h"
#include "mode.h"

#ifdef DTLAB_HAVE_GUI
#include "app.h"
#endif

#ifdef DTLAB_HAVE_GUI
namespace {

bool have_display() {
  const char* x = std::getenv("DISPLAY");
  const char* w = std::getenv("WAYLAND_DISPLAY");
  return (x && x[0]) || (w && w[0]);
}

}  // namespace
#endif

lab::RunConfig gui_default_config() {
  lab::RunConfig c;
  c.model = "mlp";
  c.world_size = 4;
  c.batch_size = 32;
  c.epochs = 5;
  c.eval_every = 50;
  c.eval_samples = 1000;
  return c;
}

void add_gui_flags(CLI::App& app, GuiOptions& o) {
  app.add_option("--open", o.open_dir, "show a finished run from its run directory (written by dtlab run --out DIR), or "
                                       "a bench train / bench chain result (its --json file, or the directory holding "
                                       "result.json) in the Benchmark view, or a dtlab simulate result in the Scale "
                                       "view");
  app.add_option("--screenshot", o.screenshot,
                 "when the run has done --steps iterations (or ended), save the window as PNG and exit 0; "
                 "with several --view names, FILE-<view>.png each");
  app.add_flag("--screenshot-items", o.screenshot_items,
               "with --screenshot: also write FILE.items.json beside each PNG, what that frame drew (buttons and "
               "whether greyed out, headings, values, notes, every chart's points; viz/data/drawn_items.h)");
  app.add_option("--frame-stats", o.frame_stats,
                 "write frame-time percentiles (p50, p95, p99, max) and training samples/s as JSON at exit");
  app.add_option("--view", o.view, "bring views to the front, full window: ring, batchnorm, batching, traineval, "
                                   "bench, memory, pipeline, grid, scale, layout (all panels), or a comma list");
  app.add_option("--ui-scale", o.ui_scale, "scale of text and widgets (default: the monitor's content scale)");
  app.add_option("--ring-steps", o.ring_steps,
                 "with --screenshot: after --steps iterations, stop K steps into the next gradient allreduce");
  app.add_flag("--paused", o.paused, "open with the run paused before its first step");
  app.add_flag("--compare-bn", o.compare_bn, "also train a twin run with the other BatchNorm mode (same seed, same data)");
  app.add_option("--delay-ms", o.delay_ms, "slow motion: milliseconds every rank waits at each ring step and iteration");
  app.add_option("--exit-after", o.exit_after, "close the window after this many seconds (0: never), e.g. for "
                                               "--frame-stats of an interactive session");
  app.add_option("--rank-nice", o.rank_nice,
                 "run the ranks this much nicer than the window (0-19; 0: the same priority): frames are drawn "
                 "first when both want the CPU, at some cost in throughput")
      ->capture_default_str();
  app.add_option("--lesson", o.lesson, "open with this lesson (id or .toml file) in the Lessons panel: predict, run, "
                                      "observe, check (dtlab lesson list shows the ids)");
  app.add_option("--answers", o.answers, "with --lesson: commit these predictions (ID=ANSWER,... or auto) and, with "
                                         "--screenshot, run the lesson by itself");
  app.add_option("--lesson-stage", o.lesson_stage, "with --lesson --screenshot: shoot at the question, observe or results "
                                                   "stage (default: question, or results with --answers)");
  app.add_option("--prepared", o.prepared, "with --lesson: replay runs prepared by `dtlab lesson prepare` from this folder "
                                           "('none': always train; default: the lesson's prepared folder when it exists)");
  app.add_flag("--teacher", o.teacher, "show the lessons' teacher notes");
  app.add_option("--fps", o.fps, "frame-rate cap while you interact (lower while you watch)")->capture_default_str();
  app.add_option_function<std::string>(
      "--window-size",
      [&o](const std::string& s) {
        int w = 0, h = 0;
        char x = 0;
        if (std::sscanf(s.c_str(), "%d%c%d", &w, &x, &h) != 3 || (x != 'x' && x != 'X') || w < 320 || h < 240)
          throw CLI::ValidationError("--window-size", "expected WxH, at least 320x240, e.g. 1600x1000");
        o.width = w;
        o.height = h;
      },
      "window size WxH in logical pixels (default 1600x1000)");
}

bool gui_available() {
#ifdef DTLAB_HAVE_GUI
  return have_display();
#else
  return false;
#endif
}

int cmd_gui(lab::RunConfig& cfg, GuiOptions& opt) {
  // Bad settings are bad with or without a window: refused first, in PyTorch's words.
  if (opt.open_dir.empty()) lab::validate(cfg);
  if (opt.ring_steps >= 0 && lab::mode_of(cfg).caps().master_device)
    throw lab::ConfigError("--ring-steps stops inside a gradient allreduce, and --mode " + cfg.mode + " has none",
                           std::string(lab::mode_of(cfg).title()) + " reduces the gradients into device 0; drop --ring-steps");
  if (opt.screenshot_items && opt.screenshot.empty())
    throw lab::ConfigError("--screenshot-items goes with --screenshot FILE.png", "it writes FILE.items.json beside it");
#ifndef DTLAB_HAVE_GUI
  (void)opt;
  std::fprintf(stderr,
               "dtlab gui: this build has no GUI (it needs libimgui-dev, libglfw3-dev and libstb-dev: tools/setup.sh "
               "installs them); train headless with `dtlab run` (see `dtlab run --help`)\n");
  return lab::kExitNoDisplay;
#else
  if (!have_display()) {
    std::fprintf(stderr,
                 "dtlab gui: no display (DISPLAY and WAYLAND_DISPLAY are unset); train headless with `dtlab run` "
                 "(see `dtlab run --help`)\n");
    return lab::kExitNoDisplay;
  }
  if (opt.fps < 1 || opt.fps > 240) throw lab::ConfigError("--fps must be between 1 and 240, got " + std::to_string(opt.fps));
  if (opt.ui_scale < 0 || opt.ui_scale > 8) throw lab::ConfigError("--ui-scale must be between 0 (auto) and 8");
  if (opt.ring_steps >= 0 && cfg.steps <= 0)
    throw lab::ConfigError("--ring-steps needs --steps N: the iteration whose allreduce to stop in");
  if (opt.rank_nice < 0 || opt.rank_nice > 19)
    throw lab::ConfigError("--rank-nice must be between 0 and 19, got " + std::to_string(opt.rank_nice));
  if (opt.delay_ms < 0 || opt.delay_ms > 2000) throw lab::ConfigError("--delay-ms must be between 0 and 2000");
  if (!opt.lesson_stage.empty() && opt.lesson_stage != "question" && opt.lesson_stage != "observe" && opt.lesson_stage != "results")
    throw lab::ConfigError("--lesson-stage: unknown stage '" + opt.lesson_stage + "'", "choose question, observe or results");
  if ((!opt.answers.empty() || !opt.lesson_stage.empty() || !opt.prepared.empty()) && opt.lesson.empty())
    throw lab::ConfigError("--answers, --lesson-stage and --prepared go with --lesson ID");
  if (!opt.lesson.empty() && !opt.open_dir.empty()) throw lab::ConfigError("--lesson and --open: choose one");
  if (!opt.lesson.empty() && cfg.steps > 0)
    std::fprintf(stderr, "dtlab gui: --steps does not apply to a lesson (its runs set their own length)\n");
  opt.steps_given = cfg.steps > 0 && opt.lesson.empty();
  return viz::run_app(cfg, opt);
#endif
}
