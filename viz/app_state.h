// AppState: everything the lab window remembers between frames, outside the draw functions
// (Dear ImGui's lesson: no function-local static UI state). Panels get the parts they need: the
// run data as const, their own view state, and a Commands object to ask for changes, which the
// app carries out after drawing (panels never own runs, and the GUI never blocks on training).
#pragma once

#include <array>
#include <map>
#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <imgui.h>

#include "app_options.h"
#include "batching_model.h"
#include "bench_result.h"
#include "catalog.h"
#include "frame_stats.h"
#include "lesson_driver.h"
#include "log.h"
#include "ring_model.h"
#include "run_data.h"
#include "run_host.h"
#include "settings_check.h"

namespace viz {

enum class ViewId { Ring = 0, BatchNorm, Batching, TrainEval, Bench, Memory, Pipeline, Grid, Scale };
constexpr int kViewCount = 9;
const char* view_key(ViewId v);    // "ring", "batchnorm", "batching", "traineval", "bench", "memory", "pipeline", "grid", "scale"
const char* view_title(ViewId v);  // tab titles

// Time and animation for one frame.
struct FrameClock {
  double now = 0;       // seconds since the app started
  bool frozen = false;  // screenshots: animations hold a fixed phase
};

// What panels ask the app to do; carried out after the frame is drawn.
struct Commands {
  bool play = false, pause = false, toggle_play = false, reset = false;
  bool step_ring = false, step_allreduce = false, step_iteration = false, step_epoch = false;
  bool screenshot = false, toggle_help = false, apply_settings = false;
  std::optional<double> delay_s;
  std::optional<bool> compare_bn;
  std::string open_dir;
  bool back_to_live = false;
  bool reset_layout = false;
  std::optional<ViewId> show_view;
  // lessons
  std::string lesson_start;          // a lesson file to start (from the list or the menu)
  bool lesson_run = false;           // Run: the predictions are committed
  bool lesson_continue = false;      // after an observation
  bool lesson_next_part = false;     // the next variation
  bool lesson_reset = false;         // the same lesson for the next learner
  bool lesson_close = false;         // back to the list
  bool show_lessons = false;         // open the Lessons panel (the list)
};

struct RingViewState {
  int filter = 0;            // 0: gradient buckets, 1: every allreduce, 2: every collective
  bool follow = true;        // show the newest collective (live) / replay the newest finished one
  bool have_shown = false;
  uint64_t shown_seq = 0;
  double anim_t0 = 0;        // when the shown step's animation started
  int anim_step = -1;        // global step being animated
  double replay_t0 = 0;      // replay of a finished collective: when it started
  int scrub_step = -1;       // user-chosen step (not following)
  // Not following and nothing chosen yet (a run just opened, a new filter): show the first
  // collective of this training iteration once the trace holds it (a lesson's observed
  // iteration; -1: none).
  int64_t want_iteration = -1;
  // cache of the shown collective, rebuilt when new events arrive
  CollectiveTrace trace;
  uint64_t trace_version = ~uint64_t{0};
  uint64_t trace_seq = ~uint64_t{0};
};

// The allreduce view of an async run (panel_async.cpp): staleness per worker over iterations.
struct AsyncViewState {
  struct Cache {
    int world = 0;
    size_t built = 0;
    std::vector<std::vector<float>> x, y;  // [worker] iteration, staleness
  } cache;
};

struct BnViewState {
  int layer = 0;             // index into StepRecord::bn
  int channel = 0;
  bool follow = true;        // show the newest step
  int64_t step = 0;          // when not following
  bool show_var = false;     // the over-time charts: running_var instead of running_mean
  // series caches (rebuilt incrementally): per run (0: this run, 1: twin), per rank
  struct Series {
    int layer = -1, channel = -1, world = 0;
    size_t built = 0;        // steps appended so far
    std::vector<float> x;    // (steps,) iteration
    std::vector<std::vector<float>> running_mean, running_var, local_mean, global_mean;  // [rank][step]
  };
  Series cache[2];
};

struct BatchingViewState {
  bool follow = true;        // the epoch the run is in
  int64_t epoch = 0;
  bool by_rank = true;       // each row: rank 0's batch, rank 1's, ... (else global order)
  // cache
  EpochLayout layout;
  DpEpochLayout dp_layout;   // --mode dp
  std::string layout_key;    // what the cached layout was computed for
  std::string layout_error;
};

// The Memory view (panel_memory.cpp).
struct MemoryViewState {
  bool follow = true;        // the newest iteration
  int64_t step = -1;         // the iteration shown
  int point = -1;            // the point of the step in the bars (-1: the step's peak)
  int rank = 0;              // whose points the step's chart shows
  int64_t first_step = -1, last_step = -1;  // iterations that still have their points
  std::string psi_model;     // Psi of this model (built once)
  int64_t psi = 0;
  std::string psi_r_key;     // the configuration psi_r was computed for
  std::vector<int64_t> psi_r;  // a mode that splits the model: each rank's parameters
};

// The Pipeline view (panel_pipeline.cpp).
struct GridViewCache;  // panel_grid.cpp: the traffic of the iteration drawn
struct GridViewState {
  bool follow = true;        // the newest iteration
  int64_t step = -1;         // the iteration drawn
  std::shared_ptr<GridViewCache> cache;
};

// The Scale view (panel_scale.cpp): its settings, the simulator's results (computed off the GUI
// thread) and the emulated run's allreduces.
struct ScaleViewCache;
struct ScaleSetup;   // scale_data.h
struct SimulateRun;  // scale_data.h
struct ScaleViewState {
  std::shared_ptr<ScaleViewCache> cache;
  // settings for the view to take on its next frame: a simulate run (a lesson's observation, --open)
  std::shared_ptr<const ScaleSetup> apply;
  // the simulate run last opened (a lesson's open_dirs), which its observation (show) sets up the view from
  std::shared_ptr<const SimulateRun> opened;
};

struct PipelineDiagramCache;  // panel_pipeline.cpp: what the events and the config give for the iteration drawn
struct PipelineViewState {
  bool follow = true;        // the newest iteration
  int64_t step = -1;         // the iteration drawn
  std::shared_ptr<PipelineDiagramCache> cache;
};

struct TrainEvalViewState {
  int eval_index = -1;       // which periodic evaluation the probe shows (-1: newest)
  bool log_x = true;         // iterations on a log scale: the first evaluations get room
  struct Cache {             // rank 0's running and batch mean of the BN view's channel
    int layer = -1, channel = -1;
    size_t built = 0;
    std::vector<float> x, running, batch;
  } cache;
};

// The Benchmark view (panel_bench.cpp): a bench train sweep or a bench chain result.
struct BenchViewState {
  bool sweep_log_y = false;  // the sweep's ms per sample on a log scale (else linear from 0)
};

struct TimelineState {
  float window_s = 0.5f;     // seconds shown
  bool follow = true;
  double t_end = 0;          // right edge when not following
};

struct RanksViewState {
  int smooth = 10;           // moving average over this many iterations
  struct Cache {
    int world = 0, smooth = 0;
    size_t built = 0;
    std::vector<float> x;
    std::vector<std::vector<float>> loss, acc;        // [rank][step], raw
    std::vector<std::vector<float>> loss_s, acc_s;    // moving averages over `smooth` iterations
  } cache;
};

// The Lessons panel: the list, and what the learner is typing before committing.
struct LessonPanelState {
  std::vector<lessons::CatalogEntry> catalog;  // loaded when the panel first shows the list
  bool catalog_loaded = false;
  std::string load_error;            // --lesson or a chosen file that could not be read: shown, app keeps working
  std::string load_error_file;
  // drafts of the current part's predictions (committed into the session by "Commit")
  std::map<std::string, int> choice;          // prediction id -> index of the chosen choice (-1: none)
  std::map<std::string, std::string> number;  // numeric answers as typed
  std::map<std::string, int> confidence;      // 1..5 (0: not given)
  std::map<std::string, std::string> why;
  std::string commit_error;
  bool committed = false;            // this part's predictions are locked
  size_t part_for_drafts = ~size_t{0};
  bool show_checks = true;
};

struct LogViewState {
  bool auto_scroll = true;
  size_t seen = 0;
};

struct ControlsState {
  lab::RunConfig pending;    // the settings being edited (applied by Reset/Apply)
  float delay_ms = 0;
  std::vector<SettingCheck> checks;
  std::string checks_key;    // the pending config the checks were made for
};

// The screenshot / benchmark script: what `--steps N --screenshot FILE` waits for.
struct Script {
  bool active = false;
  bool staged = false;       // run_into_allreduce sent
  bool warned = false;       // said that there was nothing to stage in
  int64_t target_steps = 0;
  int ring_steps = -1;
  std::vector<ViewId> views;   // views to capture, in order; empty: the whole layout
  bool layout_shot = false;
  size_t next_shot = 0;
  int settle_frames = 0;     // frames drawn since the view was switched
  double started = 0;
  std::string base;          // screenshot path
};

struct AppState {
  AppOptions opts;
  LogBuffer log;
  size_t log_echoed = 0;     // log entries already echoed to stderr
  FrameClock clock;
  std::string config_dir;    // where layout.ini lives ("" : not persisted)
  bool layout_loaded = false;

  // the live run, its twin (the other BN mode) and runs being stopped in the background
  std::unique_ptr<RunHost> host, twin;
  std::vector<std::unique_ptr<RunHost>> retiring;
  RunData data, twin_data;
  bool twin_shown = false;   // twin_data is shown beside data (a twin host, or a lesson's second run directory)
  std::string data_label, twin_label;  // a lesson names its runs; otherwise the labels say what differs
  bool compare_bn = false;
  lab::RunConfig live_cfg;   // configuration of the live run
  std::set<std::string> out_dirs_used;  // --out folders a run of this session wrote (start_live)
  HostStatus last_status;    // to log changes once
  RunPhase last_twin_phase = RunPhase::Empty;

  // windows and views
  ViewId view = ViewId::Ring;
  bool select_view = true;   // make `view` the selected tab next frame
  bool show_help = false;
  bool show_controls = true, show_timeline = true, show_ranks = true, show_log = true;
  std::optional<ViewId> solo;  // --view: one view fills the window
  bool layout_reset = false;
  std::string open_input;    // File > Open text field

  ControlsState controls;
  RingViewState ring, ring_twin;        // *_twin: the second column when two runs are shown side by side
  AsyncViewState async, async_twin;
  BnViewState bn;
  BatchingViewState batching, batching_twin;
  MemoryViewState memory, memory_twin;
  PipelineViewState pipeline, pipeline_twin;
  GridViewState grid, grid_twin;
  ScaleViewState scale;                 // one column: the simulator's charts, the shown run's points
  TrainEvalViewState train_eval, train_eval_twin;
  std::string bn_layer_wanted;          // a BatchNorm layer to select by name ("2") once the run has steps
  // a benchmark's result.json (--open, File > Open, a lesson's bench run), independent of the runs;
  // bench_twin: a second one beside it (a lesson's observation of two bench runs)
  BenchResult bench, bench_twin;
  bool bench_twin_shown = false;
  BenchViewState bench_view;

  // the lesson being taken (nullptr: none) and its panel
  std::unique_ptr<LessonDriver> lesson;
  LessonPanelState lesson_ui;
  bool show_lesson_panel = false;
  TimelineState timeline;
  RanksViewState ranks;
  LogViewState log_view;

  Script script;
  FrameStats frames;
  int64_t frames_skipped = 0;
  double drawn_fraction_sum = 0;  // over drawn frames: painted pixels / window pixels
  double frame_work_ema = 0;  // seconds a drawn frame takes (moving average)
  struct WindowRect {
    ImVec2 min{0, 0}, max{0, 0};
    bool visible = false;
  };
  std::array<WindowRect, 5> window_rects;  // last frame's tiled windows (controls, views, ...)
  double last_input = 0;     // clock.now of the last key or mouse event
  int exit_code = 0;
  bool quit = false;
};

}  // namespace viz
