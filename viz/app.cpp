// The lab window: sections
//   1. names of the views, fonts and style
//   2. runs: start, reset, twin, retire; their news in the log
//   3. commands and keys
//   4. windows and their default layout
//   5. the screenshot / benchmark script (--screenshot, --frame-stats with --steps)
//   6. layout persistence (layout.ini under the user's config directory)
//   7. run_app: the frame loop
#include "app.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <sstream>

#include <GLFW/glfw3.h>
#include <imgui.h>
#include <imgui_stdlib.h>

#include "app_glfw.h"
#include "app_state.h"
#include "draw.h"
#include "errors.h"
#include "panels.h"
#include "paths.h"
#include "run_dir.h"
#include "scale_data.h"

namespace viz {

// ---- 1. names, fonts, style ----

const char* view_key(ViewId v) {
  switch (v) {
    case ViewId::Ring: return "ring";
    case ViewId::BatchNorm: return "batchnorm";
    case ViewId::Batching: return "batching";
    case ViewId::TrainEval: return "traineval";
    case ViewId::Bench: return "bench";
    case ViewId::Memory: return "memory";
    case ViewId::Pipeline: return "pipeline";
    case ViewId::Grid: return "grid";
    case ViewId::Scale: return "scale";
  }
  return "?";
}

const char* view_title(ViewId v) {
  switch (v) {
    case ViewId::Ring: return "Allreduce";
    case ViewId::BatchNorm: return "BatchNorm";
    case ViewId::Batching: return "Batching & drop_last";
    case ViewId::TrainEval: return "Train vs eval";
    case ViewId::Bench: return "Benchmark";
    case ViewId::Memory: return "Memory";
    case ViewId::Pipeline: return "Pipeline";
    case ViewId::Grid: return "Grid";
    case ViewId::Scale: return "Scale";
  }
  return "?";
}

namespace {

// Latin-1, Greek, punctuation, super/subscripts, arrows, maths, box drawing and geometric
// shapes, dingbats: what the labels use (x, ->, play and pause symbols).
constexpr ImWchar kGlyphRanges[] = {0x0020, 0x00FF, 0x0370, 0x03FF, 0x2000, 0x206F, 0x2070, 0x209F, 0x2190,
                                    0x21FF, 0x2200, 0x22FF, 0x2500, 0x25FF, 0x2700, 0x27BF, 0};

double since_start(double t0) { return lab::now_seconds() - t0; }

// Share of the wall clock the GUI's frames may take while a run trains and nobody interacts.
constexpr double kWatchDuty = 0.10;

void setup_fonts(float scale, LogBuffer& log) {
  ImGuiIO& io = ImGui::GetIO();
  const std::string regular = find_font("DejaVuSans.ttf");
  const std::string bold = find_font("DejaVuSans-Bold.ttf");
  const std::string mono = find_font("DejaVuSansMono.ttf");
  // The order is FontId's: regular, bold, small, mono.
  auto add = [&](const std::string& path, float px) {
    if (!path.empty()) {
      ImFontConfig c;
      c.OversampleH = 2;
      if (io.Fonts->AddFontFromFileTTF(path.c_str(), std::round(px * scale), &c, kGlyphRanges)) return;
    }
    ImFontConfig c;
    c.SizePixels = std::round(13.0f * scale * px / 16.0f);
    io.Fonts->AddFontDefault(&c);
  };
  if (regular.empty())
    log.add(LogLevel::Warning,
            "DejaVu Sans not found (apt-get install fonts-dejavu-core): using ImGui's built-in bitmap font", 0);
  add(regular, 16);
  add(bold.empty() ? regular : bold, 16);
  add(regular, 13);
  add(mono.empty() ? regular : mono, 14);
}

void setup_style(float scale) {
  ImGui::StyleColorsDark();
  ImGuiStyle& s = ImGui::GetStyle();
  s.WindowRounding = 4;
  s.FrameRounding = 3;
  s.GrabRounding = 3;
  s.TabRounding = 3;
  s.ItemSpacing = ImVec2(8, 5);
  s.Colors[ImGuiCol_WindowBg] = ImVec4(kClearColor[0], kClearColor[1], kClearColor[2], 1.0f);
  s.Colors[ImGuiCol_TitleBgActive] = ImVec4(0.16f, 0.22f, 0.32f, 1.0f);
  s.Colors[ImGuiCol_Tab] = ImVec4(0.16f, 0.2f, 0.27f, 1.0f);
  s.Colors[ImGuiCol_TabActive] = ImVec4(0.2f, 0.36f, 0.56f, 1.0f);
  s.ScaleAllSizes(scale);
}

std::string other_bn(const std::string& bn) { return bn == "sync" ? "local" : "sync"; }

// ---- 2. runs ----

void retire(AppState& app, std::unique_ptr<RunHost>& h) {
  if (!h) return;
  h->request_stop();  // the host's own thread lets go of the run; we never wait for it here
  app.retiring.push_back(std::move(h));
}

void reap(AppState& app) {
  app.retiring.erase(std::remove_if(app.retiring.begin(), app.retiring.end(),
                                    [](const std::unique_ptr<RunHost>& h) { return h->done(); }),
                     app.retiring.end());
}

// View caches describe the old run; the user's choices (layer, channel, filters, a lesson's
// iteration and ring step: the runs it observes may open after it chose them) stay.
void reset_view_caches(AppState& app) {
  RingViewState ring;
  ring.filter = app.ring.filter;
  ring.follow = app.ring.follow;
  ring.want_iteration = app.ring.want_iteration;
  ring.scrub_step = app.ring.scrub_step;
  app.ring = ring;
  app.ring_twin = ring;
  app.async = app.async_twin = AsyncViewState{};
  app.batching_twin = BatchingViewState{};
  app.train_eval_twin = TrainEvalViewState{};
  for (auto& c : app.bn.cache) c = BnViewState::Series{};
  app.ranks.cache = RanksViewState::Cache{};
  app.train_eval.cache = TrainEvalViewState::Cache{};
}

// Replaces the live run. The twin trains beside it: twin_cfg when given (a lesson's second run),
// else the other BatchNorm mode when compare_bn is on.
// A run of the session with --out (run directories are never replaced unasked, run_dir.h): the
// first writes there by the usual rule; every later one (Reset, Apply) gets a fresh name beside
// it. A lesson's runs (lesson_run) go where its session puts them.
void start_live(AppState& app, const lab::RunConfig& cfg, bool paused, double t0, const lab::RunConfig* twin_cfg = nullptr,
                bool lesson_run = false) {
  retire(app, app.host);
  retire(app, app.twin);
  app.live_cfg = cfg;
  lab::RunConfig run_cfg = cfg;
  if (!lesson_run && !cfg.out_dir.empty()) {
    if (app.out_dirs_used.count(cfg.out_dir)) {
      run_cfg.out_dir = lab::fresh_dir_name(cfg.out_dir);
      run_cfg.overwrite = false;
      app.log.add(LogLevel::Info, fmt("this run's directory: %s (%s holds this session's first run)", run_cfg.out_dir.c_str(),
                                      cfg.out_dir.c_str()),
                  since_start(t0));
    }
    app.out_dirs_used.insert(cfg.out_dir);
  }
  app.data.reset_live(run_cfg);
  app.data.gate_delay_s = app.controls.delay_ms / 1000.0;
  app.host = std::make_unique<RunHost>(run_cfg, paused, app.opts.rank_nice);
  app.host->set_delay(app.data.gate_delay_s);
  app.twin_data = RunData();
  app.data_label.clear();
  app.twin_label.clear();
  std::optional<lab::RunConfig> twin;
  if (twin_cfg) twin = *twin_cfg;
  else if (app.compare_bn && cfg.world_size > 1 && lab::mode_of(cfg).caps().sync_bn) {  // the twin trains the other BN mode
    twin = cfg;
    twin->bn = other_bn(cfg.bn);
    twin->out_dir.clear();  // one run directory per run
  }
  if (twin) {
    app.twin_data.reset_live(*twin);
    app.twin_data.gate_delay_s = app.data.gate_delay_s;
    app.twin = std::make_unique<RunHost>(*twin, paused, app.opts.rank_nice);
    app.twin->set_delay(app.data.gate_delay_s);
  }
  app.twin_shown = app.twin != nullptr;
  reset_view_caches(app);
  app.train_eval.eval_index = -1;
  app.last_status = HostStatus{};
  app.last_twin_phase = RunPhase::Loading;
  app.log.add(LogLevel::Info,
              fmt("new run: %s, %s, %s, bn %s%s, seed %llu%s", cfg.model.c_str(), describe_parallelism(cfg).c_str(),
                  describe_batch(cfg).c_str(), cfg.bn.c_str(), cfg.broadcast_buffers ? "" : ", broadcast_buffers off",
                  static_cast<unsigned long long>(cfg.seed),
                  app.twin ? (twin_cfg ? std::string(" (+ a twin run)") : fmt(" (+ twin with bn %s)", other_bn(cfg.bn).c_str())).c_str() : ""),
              since_start(t0));
}

// Tells the log what changed in the live run's life: started, failed (with the hint), finished.
void log_run_news(AppState& app, double t0) {
  if (!app.host) return;
  const HostStatus st = app.host->status();
  const double t = since_start(t0);
  if (st.phase != app.last_status.phase) {
    if ((st.phase == RunPhase::Running || st.phase == RunPhase::Paused) && app.last_status.phase == RunPhase::Loading)
      app.log.add(LogLevel::Info,
                  fmt("data loaded: %lld training and %lld test samples", static_cast<long long>(st.train_size),
                      static_cast<long long>(st.test_size)),
                  t);
    if ((st.phase == RunPhase::Running || st.phase == RunPhase::Paused) && app.last_status.phase == RunPhase::Loading)
      for (const std::string& n : st.notes) app.log.add(LogLevel::Info, n, t);
    if (st.phase == RunPhase::Failed) {
      app.log.add(LogLevel::Error, "run failed: " + st.error, t);
      if (!st.hint.empty()) app.log.add(LogLevel::Warning, "hint: " + st.hint, t);
      app.log.add(LogLevel::Info, "the lab keeps working: change the settings and press Reset (R)", t);
    }
    if (st.phase == RunPhase::Finished && st.summary.valid)
      app.log.add(LogLevel::Info,
                  fmt("run finished: %lld iterations, %.0f samples/s; test accuracy %.4f eval mode, %.4f train mode",
                      static_cast<long long>(st.summary.steps), st.summary.samples_per_s, st.summary.eval_mode.acc,
                      st.summary.train_mode.acc),
                  t);
    app.last_status = st;
  }
  if (app.twin) {
    const RunPhase p = app.twin_data.phase;
    if (p != app.last_twin_phase && p == RunPhase::Failed)
      app.log.add(LogLevel::Error, "twin run failed: " + app.twin_data.error, t);
    app.last_twin_phase = p;
  }
}

// Warnings and errors also go to stderr: someone who started the app from a terminal (or a
// test) sees them without the log panel.
void echo_log(AppState& app) {
  if (app.log.size() == app.log_echoed) return;
  const std::vector<LogEntry> entries = app.log.entries();
  for (size_t i = app.log_echoed; i < entries.size(); ++i)
    if (entries[i].level != LogLevel::Info)
      std::fprintf(stderr, "dtlab gui: %s: %s\n", entries[i].level == LogLevel::Error ? "error" : "warning",
                   entries[i].text.c_str());
  app.log_echoed = entries.size();
}

// A bench result (result.json, or a bench run's directory) opens in the Benchmark view; the runs
// are left as they are.
bool open_bench(AppState& app, const std::string& path, double t0) {
  try {
    app.bench = load_bench_result(path);
    app.bench_twin = BenchResult();
    app.bench_twin_shown = false;
    app.view = ViewId::Bench;
    app.select_view = true;
    app.log.add(LogLevel::Info, fmt("opened %s: %s", path.c_str(), describe_bench(app.bench).c_str()), since_start(t0));
    return true;
  } catch (const lab::Error& e) {
    app.log.add(LogLevel::Error, fmt("cannot open %s: %s", path.c_str(), e.what()), since_start(t0));
    if (!e.hint().empty()) app.log.add(LogLevel::Warning, "hint: " + e.hint(), since_start(t0));
    return false;
  }
}

// A simulate result (result.json, or a simulate run's directory) sets up the Scale view: its
// topology, collective, protocol, channels and algorithms, and of its node counts and sizes the
// ones nearest the view's default; the runs are left as they are.
void show_simulate_run(AppState& app, SimulateRun r, int nodes = 0, uint64_t bytes = 0) {
  auto run = std::make_shared<const SimulateRun>(std::move(r));
  app.scale.apply = std::make_shared<const ScaleSetup>(scale_setup(*run, nodes, bytes));
  app.scale.opened = std::move(run);
}

bool open_simulate(AppState& app, const std::string& path, double t0) {
  try {
    show_simulate_run(app, load_simulate_result(path));
    app.view = ViewId::Scale;
    app.select_view = true;
    if (app.solo) app.solo = ViewId::Scale;
    app.log.add(LogLevel::Info, fmt("opened %s: %s", path.c_str(), app.scale.apply->line.c_str()), since_start(t0));
    return true;
  } catch (const lab::Error& e) {
    app.log.add(LogLevel::Error, fmt("cannot open %s: %s", path.c_str(), e.what()), since_start(t0));
    if (!e.hint().empty()) app.log.add(LogLevel::Warning, "hint: " + e.hint(), since_start(t0));
    return false;
  }
}

bool open_run_dir(AppState& app, const std::string& dir, double t0) {
  if (looks_like_simulate_result(dir)) return open_simulate(app, dir, t0);
  if (looks_like_bench_result(dir)) return open_bench(app, dir, t0);
  try {
    RunData d = load_run_dir(dir);
    retire(app, app.host);
    retire(app, app.twin);
    app.data = std::move(d);
    app.twin_data = RunData();
    app.twin_shown = false;
    app.data_label.clear();
    app.twin_label.clear();
    app.controls.pending = app.data.cfg;
    reset_view_caches(app);
    app.log.add(LogLevel::Info,
                fmt("opened %s: %lld iterations, %zu events of rank 0", dir.c_str(),
                    static_cast<long long>(app.data.steps_done()), app.data.events.empty() ? size_t{0} : app.data.events[0].size()),
                since_start(t0));
    return true;
  } catch (const lab::Error& e) {
    app.log.add(LogLevel::Error, fmt("cannot open %s: %s", dir.c_str(), e.what()), since_start(t0));
    if (!e.hint().empty()) app.log.add(LogLevel::Warning, "hint: " + e.hint(), since_start(t0));
    return false;
  }
}

// ---- 2b. lessons: the app's side of a LessonDriver ----

// The driver's view of the lab: the live run and its twin, the views.
class AppLab : public LabHooks {
 public:
  AppLab(AppState& app, double t0) : m_app(app), m_t0(t0) {}
  void start_live(const lab::RunConfig& cfg, const lab::RunConfig* twin, bool paused) override {
    viz::start_live(m_app, cfg, paused, m_t0, twin, true);
    label_from_dirs();
  }
  const RunData* live(int which) const override {
    if (which == 0) return m_app.host ? &m_app.data : nullptr;
    return m_app.twin ? &m_app.twin_data : nullptr;
  }
  void stage(int64_t iteration, int ring_step) override {
    for (RunHost* h : {m_app.host.get(), m_app.twin.get()}) {
      if (!h) continue;
      if (ring_step < 0) h->run_to_step(iteration);
      else if (h->config().world_size > 1 && !lab::mode_of(h->config()).caps().master_device)
        h->run_into_allreduce(iteration, ring_step);
      else h->run_to_step(iteration + 1);  // no gradient allreduce to stop in: after the iteration
    }
  }
  void resume() override {
    if (m_app.host) m_app.host->resume();
    if (m_app.twin) m_app.twin->resume();
  }
  std::string open_dirs(const std::string& dir, const std::string& twin_dir) override {
    try {
      if (looks_like_simulate_result(dir)) {  // a simulate run: the Scale view, set up by show() (the training runs stay)
        show_simulate_run(m_app, load_simulate_result(dir));
        return "";
      }
      if (looks_like_bench_result(dir)) {  // a bench run: the Benchmark view (the training runs stay)
        BenchResult b = load_bench_result(dir);
        BenchResult t;
        if (!twin_dir.empty()) t = load_bench_result(twin_dir);
        m_app.bench = std::move(b);
        m_app.bench_twin = std::move(t);
        m_app.bench_twin_shown = !twin_dir.empty();
        return "";
      }
      RunData d = load_run_dir(dir);
      RunData t;
      if (!twin_dir.empty()) t = load_run_dir(twin_dir);
      retire(m_app, m_app.host);
      retire(m_app, m_app.twin);
      m_app.data = std::move(d);
      m_app.twin_data = std::move(t);
      m_app.twin_shown = !twin_dir.empty();
      reset_view_caches(m_app);
      label_from_dirs();
      return "";
    } catch (const lab::Error& e) {
      m_app.log.add(LogLevel::Error, std::string("lesson: ") + e.what(), since_start(m_t0));
      return e.what();
    }
  }
  void show(const lessons::Observe& o) override {
    for (int i = 0; i < kViewCount; ++i)
      if (o.view == view_key(static_cast<ViewId>(i))) {
        m_app.view = static_cast<ViewId>(i);
        m_app.select_view = true;
        if (m_app.solo) m_app.solo = m_app.view;
      }
    // a simulate run (opened just before): the Scale view at the observation's node count and size
    if (o.view == "scale" && m_app.scale.opened)
      m_app.scale.apply = std::make_shared<const ScaleSetup>(
          scale_setup(*m_app.scale.opened, static_cast<int>(std::max<int64_t>(o.nodes, 0)), o.bytes));
    if (!o.layer.empty()) m_app.bn_layer_wanted = o.layer;
    if (o.channel >= 0) m_app.bn.channel = static_cast<int>(o.channel);
    if (!m_app.data.live && o.step >= 0) {  // finished runs: show the observed iteration
      m_app.bn.follow = false;
      m_app.bn.step = o.step;
      // the allreduce view: the iteration's first gradient collective, after o.ring_step of its
      // steps (all of them without one)
      for (RingViewState* r : {&m_app.ring, &m_app.ring_twin}) {
        r->follow = false;
        r->have_shown = false;
        r->want_iteration = o.step;
        r->scrub_step = o.ring_step >= 0 ? static_cast<int>(o.ring_step) : 1 << 20;
      }
    } else {
      m_app.bn.follow = true;
      for (RingViewState* r : {&m_app.ring, &m_app.ring_twin}) {
        r->follow = true;
        r->want_iteration = -1;
      }
    }
  }

 private:
  // the lesson's run names label the columns (the run directory's name is the run's)
  void label_from_dirs() {
    auto name = [](const lab::RunConfig& c, const std::string& source) {
      const std::string dir = !c.out_dir.empty() ? c.out_dir : source;
      const size_t slash = dir.find_last_of('/');
      return "run " + (slash == std::string::npos ? dir : dir.substr(slash + 1));
    };
    m_app.data_label = name(m_app.data.cfg, m_app.data.source);
    m_app.twin_label = m_app.twin_shown ? name(m_app.twin_data.cfg, m_app.twin_data.source) : "";
  }
  AppState& m_app;
  double m_t0;
};

// The prepared folder a lesson replays: --prepared DIR, else the lesson's own prepared folder when
// it was prepared from this version of the lesson ("none": always train).
std::string lesson_prepared_dir(const AppState& app, const lessons::Lesson& l) {
  if (app.opts.prepared == "none") return "";
  if (!app.opts.prepared.empty()) return app.opts.prepared;
  const std::string dir = lessons::prepared_dir(l.id);
  std::ifstream f(dir + "/prepared.json");
  if (!f) return "";
  try {
    const nlohmann::json j = nlohmann::json::parse(f);
    if (j.value("lesson", "") == l.id && j.value("version", -1) == l.version) return dir;
  } catch (const nlohmann::json::exception&) {
  }
  return "";
}

// Opens a lesson in the Lessons panel. A lesson that cannot be read is shown with its error; the
// app keeps working.
void start_lesson(AppState& app, const std::string& id_or_file, double t0, bool from_command_line) {
  LessonPanelState& st = app.lesson_ui;
  st.load_error.clear();
  app.show_lesson_panel = true;
  app.show_controls = false;
  try {
    const std::string path = lessons::resolve_lesson(id_or_file);
    lessons::Lesson l = lessons::load_lesson(path);
    const std::string prepared = lesson_prepared_dir(app, l);
    const std::string session = lessons::new_session_dir(l.id);
    const std::string record = lessons::records_dir() + "/" + session.substr(session.find_last_of('/') + 1) + ".json";
    app.lesson = std::make_unique<LessonDriver>(std::move(l), session, prepared, record);
    app.scale.opened.reset();  // a simulate run is shown again once this lesson's observation opens it
    st.part_for_drafts = ~size_t{0};
    app.log.add(LogLevel::Info,
                fmt("lesson %s: %s%s", app.lesson->lesson().id.c_str(), app.lesson->lesson().title.c_str(),
                    prepared.empty() ? "" : (" (replaying the runs prepared in " + prepared + ")").c_str()),
                since_start(t0));
    if (from_command_line && !app.opts.answers.empty()) {
      lessons::Session& s = app.lesson->session();
      if (app.opts.answers == "auto") {
        s.set_auto_answers(true);
      } else {
        std::stringstream in(app.opts.answers);
        std::string item;
        while (std::getline(in, item, ',')) {
          const size_t eq = item.find('=');
          if (eq == std::string::npos) throw lab::ConfigError("--answers: expected ID=ANSWER pairs, got '" + item + "'");
          s.answer(item.substr(0, eq), item.substr(eq + 1), 3);
        }
      }
    }
  } catch (const lab::Error& e) {
    app.lesson.reset();
    st.load_error = e.what();
    st.load_error_file = id_or_file;
    st.catalog_loaded = false;
    app.log.add(LogLevel::Error, "cannot open lesson " + id_or_file + ": " + e.what(), since_start(t0));
  }
}

// Once per frame: the lesson moves on; a BatchNorm layer asked for by name is selected when the
// run has steps; a scripted lesson (--answers) runs and continues by itself.
void update_lesson(AppState& app, double t0) {
  if (!app.bn_layer_wanted.empty() && !app.data.by_step.empty()) {
    for (const lab::StepRecord& r : app.data.by_step.front())
      for (size_t i = 0; i < r.bn.size(); ++i)
        if (r.bn[i].layer == app.bn_layer_wanted) app.bn.layer = static_cast<int>(i);
    app.bn_layer_wanted.clear();
  }
  if (!app.lesson) return;
  LessonDriver& d = *app.lesson;
  AppLab lab(app, t0);
  if (!app.opts.answers.empty() && app.script.active) {
    if (d.stage() == LessonStage::Question && d.can_run()) d.run();
    const bool stop_at_observe = app.opts.lesson_stage == "observe";
    if (d.stage() == LessonStage::Observing && !stop_at_observe) d.continue_after_observe(lab);
  }
  const LessonStage before = d.stage();
  d.update(lab);
  if (d.stage() != before && d.stage() == LessonStage::Results) {
    const lessons::PartResult* r = d.result();
    app.log.add(r && r->passed() ? LogLevel::Info : LogLevel::Warning,
                fmt("lesson %s, part %s: %d of %zu checks hold%s; record %s", d.lesson().id.c_str(), d.part().id.c_str(),
                    r ? static_cast<int>(r->checks.size()) - r->failed_checks() - r->unjudged_checks() : 0,
                    r ? r->checks.size() : 0,
                    r && r->unjudged_checks() ? fmt(", %d not judged (machine too busy)", r->unjudged_checks()).c_str() : "",
                    d.record_path().c_str()),
                since_start(t0));
  }
  if (!d.error().empty() && app.lesson_ui.commit_error != d.error()) {
    app.log.add(LogLevel::Error, "lesson: " + d.error(), since_start(t0));
    app.lesson_ui.commit_error = d.error();
  }
}

// ---- 3. commands and keys ----

// Shortcuts, from the platform layer's queue of presses: holding Right keeps stepping, the other
// keys act once per press. Not while the user types into a field.
void handle_keys(const std::vector<GlfwWindow::KeyPress>& keys, Commands& cmd) {
  if (ImGui::GetIO().WantTextInput) return;
  for (const GlfwWindow::KeyPress& k : keys) {
    const bool shift = (k.mods & GLFW_MOD_SHIFT) != 0;
    if (k.key == GLFW_KEY_RIGHT) (shift ? cmd.step_iteration : cmd.step_ring) = true;
    if (k.repeat) continue;
    if (k.key == GLFW_KEY_SPACE) cmd.toggle_play = !cmd.toggle_play;
    if (k.key == GLFW_KEY_R) cmd.reset = true;
    if (k.key == GLFW_KEY_S) cmd.screenshot = true;
    if (k.key == GLFW_KEY_F1) cmd.toggle_help = !cmd.toggle_help;
    if (k.key >= GLFW_KEY_1 && k.key < GLFW_KEY_1 + kViewCount) cmd.show_view = static_cast<ViewId>(k.key - GLFW_KEY_1);
  }
}

void apply_commands(AppState& app, Commands& cmd, double t0) {
  auto both = [&](void (RunHost::*f)()) {
    if (app.host) (app.host.get()->*f)();
    if (app.twin) (app.twin.get()->*f)();
  };
  if (cmd.toggle_play) {
    if (app.data.phase == RunPhase::Paused) cmd.play = true;
    else if (app.data.phase == RunPhase::Running) cmd.pause = true;
  }
  if (cmd.play) both(&RunHost::resume);
  if (cmd.pause) both(&RunHost::pause);
  if (cmd.step_ring) both(&RunHost::step_ring);
  if (cmd.step_allreduce) both(&RunHost::step_allreduce);
  if (cmd.step_iteration) both(&RunHost::step_iteration);
  if (cmd.step_epoch) both(&RunHost::step_epoch);
  if (cmd.delay_s) {
    if (app.host) app.host->set_delay(*cmd.delay_s);
    if (app.twin) app.twin->set_delay(*cmd.delay_s);
    app.data.gate_delay_s = app.twin_data.gate_delay_s = *cmd.delay_s;
  }
  if (cmd.compare_bn) {
    app.compare_bn = *cmd.compare_bn;
    if (app.data.live) {
      app.log.add(LogLevel::Info,
                  app.compare_bn ? "twin run on: both runs restart, so they see the same data in the same order"
                                 : "twin run off",
                  since_start(t0));
      start_live(app, app.live_cfg, false, t0);
    }
  }
  const bool lesson_busy = app.lesson && (app.lesson->stage() == LessonStage::Running || app.lesson->stage() == LessonStage::Observing);
  if ((cmd.reset || cmd.apply_settings || !cmd.open_dir.empty()) && lesson_busy) {
    app.log.add(LogLevel::Warning, "the lesson is running its runs: a new run would replace them (close the lesson first)",
                since_start(t0));
    cmd.reset = cmd.apply_settings = false;
    cmd.open_dir.clear();
  }
  if (!cmd.lesson_start.empty()) start_lesson(app, cmd.lesson_start, t0, false);
  if (app.lesson) {
    AppLab lab(app, t0);
    if (cmd.lesson_run) app.lesson->run();
    if (cmd.lesson_continue) app.lesson->continue_after_observe(lab);
    if (cmd.lesson_next_part) app.lesson->next_part();
    if (cmd.lesson_reset) start_lesson(app, app.lesson->lesson().file, t0, false);
    if (cmd.lesson_close) {
      app.lesson.reset();
      app.lesson_ui.catalog_loaded = false;
    }
  }
  if (cmd.show_lessons) {
    app.show_lesson_panel = true;
    app.show_controls = false;
  }
  if (cmd.reset || cmd.apply_settings) {
    const std::vector<SettingCheck>& checks = app.controls.checks;
    const auto err = std::find_if(checks.begin(), checks.end(), [](const SettingCheck& c) { return c.severity == Severity::Error; });
    if (err != checks.end()) app.log.add(LogLevel::Error, "cannot start a run with these settings: " + err->message, since_start(t0));
    else start_live(app, app.controls.pending, false, t0);
  }
  if (!cmd.open_dir.empty()) open_run_dir(app, cmd.open_dir, t0);
  if (cmd.show_view) {
    app.view = *cmd.show_view;
    app.select_view = true;
  }
  if (cmd.toggle_help) app.show_help = !app.show_help;
  if (cmd.reset_layout) app.layout_reset = true;
}

// ---- 4. windows ----

void draw_menu(AppState& app, Commands& cmd) {
  bool open_popup = false;
  if (ImGui::BeginMainMenuBar()) {
    if (ImGui::BeginMenu("File")) {
      if (ImGui::MenuItem("Open run directory...")) open_popup = true;
      if (ImGui::MenuItem("New live run", "R")) cmd.reset = true;
      if (ImGui::MenuItem("Screenshot", "S")) cmd.screenshot = true;
      ImGui::Separator();
      if (ImGui::MenuItem("Quit")) app.quit = true;
      ImGui::EndMenu();
    }
    if (ImGui::BeginMenu("View")) {
      for (int i = 0; i < kViewCount; ++i)
        if (ImGui::MenuItem(view_title(static_cast<ViewId>(i)), fmt("%d", i + 1).c_str(), app.view == static_cast<ViewId>(i)))
          cmd.show_view = static_cast<ViewId>(i);
      ImGui::Separator();
      ImGui::MenuItem("Controls", nullptr, &app.show_controls);
      ImGui::MenuItem("Timeline", nullptr, &app.show_timeline);
      ImGui::MenuItem("Ranks", nullptr, &app.show_ranks);
      ImGui::MenuItem("Log", nullptr, &app.show_log);
      ImGui::Separator();
      if (ImGui::MenuItem("Reset layout")) cmd.reset_layout = true;
      ImGui::EndMenu();
    }
    if (ImGui::BeginMenu("Lessons")) {
      if (ImGui::MenuItem("All lessons...", nullptr, app.show_lesson_panel && !app.lesson)) {
        cmd.show_lessons = true;
        cmd.lesson_close = app.lesson != nullptr;
      }
      ImGui::Separator();
      if (!app.lesson_ui.catalog_loaded) {
        app.lesson_ui.catalog = lessons::load_catalog();
        app.lesson_ui.catalog_loaded = true;
      }
      for (const lessons::CatalogEntry& c : app.lesson_ui.catalog) {
        if (!c.lesson) {
          ImGui::MenuItem((c.id + " (cannot be used)").c_str(), nullptr, false, false);
          continue;
        }
        if (ImGui::MenuItem(c.lesson->title.c_str(), nullptr, app.lesson && app.lesson->lesson().id == c.id)) cmd.lesson_start = c.path;
      }
      ImGui::Separator();
      ImGui::MenuItem("Lessons panel", nullptr, &app.show_lesson_panel);
      ImGui::EndMenu();
    }
    if (ImGui::BeginMenu("Help")) {
      if (ImGui::MenuItem("Keys and views", "F1")) cmd.toggle_help = true;
      ImGui::EndMenu();
    }
    const RunData& d = app.data;
    const std::string run = fmt("%s | %s, %s, %s, bn %s | %s", d.live ? "live" : d.source.c_str(), d.cfg.model.c_str(),
                                describe_parallelism(d.cfg).c_str(), describe_batch(d.cfg).c_str(), d.cfg.bn.c_str(),
                                d.state_text().c_str());
    ImGui::TextDisabled("  %s", run.c_str());
    note_item("value", "run", true, run);
    ImGui::EndMainMenuBar();
  }
  if (open_popup) ImGui::OpenPopup("Open run directory");
  if (ImGui::BeginPopupModal("Open run directory", nullptr, ImGuiWindowFlags_AlwaysAutoResize)) {
    ImGui::TextUnformatted("A directory written by `dtlab run --out DIR`, or the --json file of `dtlab bench train` or "
                           "`dtlab bench chain`:");
    ImGui::SetNextItemWidth(ImGui::GetFontSize() * 28);
    const bool enter = ImGui::InputText("##dir", &app.open_input, ImGuiInputTextFlags_EnterReturnsTrue);
    if (ImGui::Button("Open") || enter) {
      cmd.open_dir = app.open_input;
      ImGui::CloseCurrentPopup();
    }
    ImGui::SameLine();
    if (ImGui::Button("Cancel")) ImGui::CloseCurrentPopup();
    ImGui::EndPopup();
  }
}

// What a column of two runs side by side is called: the lesson's run name, else what differs.
std::string column_label(const AppState& app, bool twin) {
  const std::string& l = twin ? app.twin_label : app.data_label;
  if (!l.empty()) return l;
  const RunData& d = twin ? app.twin_data : app.data;
  return fmt("%s, %s, bn %s", describe_parallelism(d.cfg).c_str(), describe_batch(d.cfg).c_str(), d.cfg.bn.c_str());
}

void draw_view(AppState& app, ViewId v, Commands& cmd) {
  if (v == ViewId::Bench) {  // its own data, and its own columns for two results
    draw_bench_view(app.bench, app.bench_twin_shown ? &app.bench_twin : nullptr, app.bench_view);
    return;
  }
  if (v == ViewId::Scale) {  // the simulator's charts, once; the points of the run shown (not its twin)
    draw_scale_view(app.data, app.scale, app.clock);
    return;
  }
  if (v == ViewId::BatchNorm) {  // the BatchNorm view lays out its own twin columns
    draw_batchnorm_view(app.data, app.twin_shown ? &app.twin_data : nullptr, app.bn, cmd);
    return;
  }
  auto one = [&](bool twin) {
    const RunData& d = twin ? app.twin_data : app.data;
    switch (v) {
      case ViewId::Ring:
        if (d.caps().parameter_server) draw_async_view(d, twin ? app.async_twin : app.async, app.clock);
        else draw_ring_view(d, twin ? app.ring_twin : app.ring, app.clock);
        break;
      case ViewId::Batching: draw_batching_view(d, twin ? app.batching_twin : app.batching); break;
      case ViewId::TrainEval: draw_train_eval_view(d, twin ? app.train_eval_twin : app.train_eval, app.bn); break;
      case ViewId::Memory: draw_memory_view(d, twin ? app.memory_twin : app.memory); break;
      case ViewId::Pipeline: draw_pipeline_view(d, twin ? app.pipeline_twin : app.pipeline); break;
      case ViewId::Grid: draw_grid_view(d, twin ? app.grid_twin : app.grid); break;
      case ViewId::BatchNorm:
      case ViewId::Bench:
      case ViewId::Scale: break;
    }
  };
  if (!app.twin_shown) {
    one(false);
    return;
  }
  // two runs side by side (a lesson's contrast, or the twin of --compare-bn)
  if (ImGui::BeginTable("twin_columns", 2, ImGuiTableFlags_BordersInnerV | ImGuiTableFlags_SizingStretchSame)) {
    for (int c = 0; c < 2; ++c) {
      ImGui::TableNextColumn();
      ImGui::PushID(c);
      ImGui::PushFont(font(FontId::Bold));
      ImGui::TextUnformatted(column_label(app, c == 1).c_str());
      ImGui::PopFont();
      one(c == 1);
      ImGui::PopID();
    }
    ImGui::EndTable();
  }
}

// The views' shared header: what runs, and a missing dataset said plainly.
void draw_views_header(const AppState& app) {
  const RunData& d = app.data;
  if (d.phase == RunPhase::Failed && d.error_code == lab::kExitData) {
    heading("The Fashion-MNIST dataset is missing");
    text_wrapped_colored(col::kError, d.error);
    text_wrapped_colored(col::kWarn, d.error_hint.empty() ? "Install it: apt-get install dataset-fashion-mnist, or "
                                                            "point --data-dir at the four .gz files."
                                                          : "hint: " + d.error_hint);
    ImGui::TextDisabled("The views below stay empty until a run has data. Reset (R) after installing it.");
    ImGui::Separator();
  }
}

void draw_views_window(AppState& app, Commands& cmd) {
  if (app.solo != ViewId::Bench) draw_views_header(app);  // a benchmark needs no dataset
  if (app.lesson && !app.host && app.data.phase == RunPhase::Empty && app.bench.kind == BenchKind::None &&
      !app.scale.opened) {
    // nothing is shown before the learner has predicted
    ImGui::Spacing();
    heading(app.lesson->lesson().title.c_str());
    ImGui::TextDisabled("The lesson's runs train here once your prediction is committed (Lessons panel, left).");
    return;
  }
  if (app.solo) {
    heading(*app.solo == ViewId::Ring && app.data.caps().parameter_server ? "Parameter server" : view_title(*app.solo));
    ImGui::SameLine();
    if (*app.solo == ViewId::Bench) {
      ImGui::TextDisabled("  %s", describe_bench(app.bench).c_str());
      if (!app.bench.source.empty()) tooltip("read from " + app.bench.source);
      ImGui::Separator();
      draw_view(app, *app.solo, cmd);
      return;
    }
    const RunData& d = app.data;
    if (*app.solo == ViewId::Scale && app.scale.opened && d.phase == RunPhase::Empty) {  // a simulate result, no run
      ImGui::TextDisabled("  dtlab simulate's result %s", app.scale.opened->file.c_str());
      ImGui::Separator();
      draw_view(app, *app.solo, cmd);
      return;
    }
    ImGui::TextDisabled("  %s, %s, %s, bn %s%s, %lld iteration%s done | %s", d.cfg.model.c_str(),
                        describe_parallelism(d.cfg).c_str(), describe_batch(d.cfg).c_str(), d.cfg.bn.c_str(),
                        app.twin_shown ? fmt(" (twin: %s)", column_label(app, true).c_str()).c_str() : "",
                        static_cast<long long>(d.steps_done()), d.steps_done() == 1 ? "" : "s", d.state_text().c_str());
    ImGui::Separator();
    draw_view(app, *app.solo, cmd);
    return;
  }
  if (ImGui::BeginTabBar("views")) {
    for (int i = 0; i < kViewCount; ++i) {
      const ViewId v = static_cast<ViewId>(i);
      const ImGuiTabItemFlags f = app.select_view && app.view == v ? ImGuiTabItemFlags_SetSelected : 0;
      if (ImGui::BeginTabItem(view_title(v), nullptr, f)) {
        if (!app.select_view) app.view = v;
        draw_view(app, v, cmd);
        ImGui::EndTabItem();
      }
    }
    app.select_view = false;
    ImGui::EndTabBar();
  }
}

// Tiled windows draw no background (the clear colour shows through, at no cost); one that
// overlaps another of them (the user moved it) gets its background back.
ImGuiWindowFlags tiled_flags(const AppState& app, int self) {
  const AppState::WindowRect& me = app.window_rects[static_cast<size_t>(self)];
  for (size_t i = 0; i < app.window_rects.size(); ++i) {
    const AppState::WindowRect& o = app.window_rects[i];
    if (static_cast<int>(i) == self || !o.visible || !me.visible) continue;
    const bool overlap = me.min.x < o.max.x - 1 && o.min.x < me.max.x - 1 && me.min.y < o.max.y - 1 && o.min.y < me.max.y - 1;
    if (overlap) return 0;
  }
  return me.visible ? ImGuiWindowFlags_NoBackground : 0;
}

void remember_rect(AppState& app, int self) {
  AppState::WindowRect& r = app.window_rects[static_cast<size_t>(self)];
  r.min = ImGui::GetWindowPos();
  r.max = ImVec2(r.min.x + ImGui::GetWindowSize().x, r.min.y + ImGui::GetWindowSize().y);
  r.visible = true;
}

void draw_windows(AppState& app, Commands& cmd) {
  for (auto& r : app.window_rects) r.visible = false;
  const ImGuiViewport* vp = ImGui::GetMainViewport();
  if (app.solo) {
    ImGui::SetNextWindowPos(vp->WorkPos, ImGuiCond_Always);
    ImGui::SetNextWindowSize(vp->WorkSize, ImGuiCond_Always);
    ImGui::Begin("##solo", nullptr,
                 ImGuiWindowFlags_NoDecoration | ImGuiWindowFlags_NoMove | ImGuiWindowFlags_NoSavedSettings |
                     ImGuiWindowFlags_NoBringToFrontOnFocus | ImGuiWindowFlags_NoBackground);
    note_window("Views");
    draw_views_window(app, cmd);
    ImGui::End();
    return;
  }
  note_window("Menu");
  draw_menu(app, cmd);
  // Default layout (first start, or View > Reset layout): controls on the left, the views in the
  // middle, timeline / ranks / log below them. The user's arrangement is kept in layout.ini.
  const ImVec2 o = vp->WorkPos, s = vp->WorkSize;
  const ImGuiCond cond = app.layout_reset ? ImGuiCond_Always : ImGuiCond_FirstUseEver;
  const float left = std::round(std::max(s.x * 0.235f, std::min(s.x * 0.4f, ImGui::GetFontSize() * 22)));
  const float top_h = std::round(s.y * 0.66f);
  const float rest_w = s.x - left;
  auto place = [&](float x, float y, float w, float h) {
    ImGui::SetNextWindowPos(ImVec2(o.x + x, o.y + y), cond);
    ImGui::SetNextWindowSize(ImVec2(w, h), cond);
  };
  // index into app.window_rects: 0 controls, 1 views, 2 timeline, 3 ranks, 4 log
  if (app.show_lesson_panel) {
    // the left column, where the controls are (they come back from the View menu)
    ImGui::SetNextWindowPos(ImVec2(o.x, o.y), app.layout_reset ? ImGuiCond_Always : ImGuiCond_Appearing);
    ImGui::SetNextWindowSize(ImVec2(left, s.y), app.layout_reset ? ImGuiCond_Always : ImGuiCond_Appearing);
    note_window("Lessons");
    if (ImGui::Begin("Lessons", &app.show_lesson_panel))
      draw_lessons_panel(app.lesson.get(), app.lesson_ui, app.opts.teacher, cmd);
    ImGui::End();
  }
  if (app.show_controls) {
    place(0, 0, left, s.y);
    note_window("Controls");
    if (ImGui::Begin("Controls", &app.show_controls, tiled_flags(app, 0)))
      draw_controls_panel(app.data, app.controls, app.compare_bn, app.data.gate_delay_s, cmd);
    remember_rect(app, 0);
    ImGui::End();
  }
  place(left, 0, rest_w, top_h);
  note_window("Views");
  if (ImGui::Begin("Views", nullptr, tiled_flags(app, 1))) draw_views_window(app, cmd);
  remember_rect(app, 1);
  ImGui::End();
  const float bw = rest_w;
  if (app.show_timeline) {
    place(left, top_h, bw * 0.46f, s.y - top_h);
    note_window("Timeline");
    if (ImGui::Begin("Timeline", &app.show_timeline, tiled_flags(app, 2))) draw_timeline_panel(app.data, app.timeline);
    remember_rect(app, 2);
    ImGui::End();
  }
  if (app.show_ranks) {
    place(left + bw * 0.46f, top_h, bw * 0.29f, s.y - top_h);
    note_window("Ranks");
    if (ImGui::Begin("Ranks", &app.show_ranks, tiled_flags(app, 3))) draw_ranks_panel(app.data, app.ranks);
    remember_rect(app, 3);
    ImGui::End();
  }
  if (app.show_log) {
    place(left + bw * 0.75f, top_h, bw * 0.25f, s.y - top_h);
    note_window("Log");
    if (ImGui::Begin("Log", &app.show_log, tiled_flags(app, 4))) draw_log_panel(app.log, app.log_view);
    remember_rect(app, 4);
    ImGui::End();
  }
  draw_help_window(&app.show_help);
  app.layout_reset = false;
}

// The checks of the settings being edited, recomputed only when they change.
void update_checks(AppState& app) {
  ControlsState& c = app.controls;
  const std::string key = lab::to_toml(c.pending, {});
  if (key == c.checks_key) return;
  c.checks_key = key;
  const int64_t full = app.data.live && app.data.train_size > 0 && app.data.cfg.limit_train == 0 ? app.data.train_size
                                                                                                : kFashionTrainSize;
  c.checks = check_settings(c.pending, train_samples(c.pending, full));
}

// ---- 5. the script ----

std::vector<std::pair<std::string, std::optional<ViewId>>> parse_views(const std::string& list) {
  std::vector<std::pair<std::string, std::optional<ViewId>>> out;
  std::stringstream in(list);
  std::string name;
  while (std::getline(in, name, ',')) {
    if (name.empty()) continue;
    if (name == "layout" || name == "all-panels") {
      out.push_back({"layout", std::nullopt});
      continue;
    }
    bool found = false;
    for (int i = 0; i < kViewCount; ++i)
      if (name == view_key(static_cast<ViewId>(i))) {
        out.push_back({name, static_cast<ViewId>(i)});
        found = true;
      }
    if (!found)
      throw lab::ConfigError("--view: unknown view '" + name + "'",
                             "choose ring, batchnorm, batching, traineval, bench, memory, pipeline, grid, scale or layout (a comma list for "
                             "several)");
  }
  return out;
}

bool terminal(RunPhase p) { return p == RunPhase::Finished || p == RunPhase::Failed || p == RunPhase::Stopped; }

// Whether what the script waits for has happened.
bool script_ready(AppState& app) {
  Script& sc = app.script;
  const RunData& d = app.data;
  if (!app.opts.lesson.empty()) {
    // a lesson: the stage --lesson-stage names (default: the question without --answers, the
    // results with them); a lesson that could not be opened, or stopped with an error, at once
    if (!app.lesson || !app.lesson->error().empty()) return true;
    const LessonStage st = app.lesson->stage();
    std::string want = app.opts.lesson_stage;
    if (want.empty()) want = app.opts.answers.empty() ? "question" : "results";
    if (want == "question") return st == LessonStage::Question;
    if (want == "observe") return st == LessonStage::Observing || st == LessonStage::Results || st == LessonStage::Finished;
    return st == LessonStage::Results || st == LessonStage::Finished;
  }
  if (!d.live) return true;
  if (d.phase == RunPhase::Failed) return true;
  if (sc.ring_steps >= 0) {
    if (!sc.staged && app.host && (d.phase == RunPhase::Running || d.phase == RunPhase::Paused)) {
      app.host->run_into_allreduce(sc.target_steps, sc.ring_steps);
      if (app.twin) app.twin->run_into_allreduce(sc.target_steps, sc.ring_steps);
      sc.staged = true;
    }
    if (!sc.staged) return false;
    bool passed = false;
    staged_in_allreduce(d, sc.target_steps, sc.ring_steps, &passed);
    if (passed) {
      if (!sc.warned)
        std::fprintf(stderr, "dtlab gui: iteration %lld has no gradient allreduce to stop in (--ring-steps)\n",
                     static_cast<long long>(sc.target_steps));
      sc.warned = true;
      return true;
    }
    auto staged_in = [&](const RunData& r) { return staged_in_allreduce(r, sc.target_steps, sc.ring_steps); };
    return staged_in(d) && (!app.twin || staged_in(app.twin_data) || app.twin_data.phase == RunPhase::Failed);
  }
  if (!app.opts.steps_given) {
    if (app.opts.paused) return d.phase == RunPhase::Paused;
    return d.phase != RunPhase::Loading;
  }
  return terminal(d.phase) && (!app.twin || terminal(app.twin_data.phase));
}

std::string shot_path(const Script& sc, const std::string& key, size_t count) {
  if (count <= 1) return sc.base;
  std::string stem = sc.base;
  if (stem.size() > 4 && stem.compare(stem.size() - 4, 4, ".png") == 0) stem.resize(stem.size() - 4);
  return stem + "-" + key + ".png";
}

// ---- 6. layout persistence ----

std::string layout_path(const AppState& app) { return app.config_dir.empty() ? "" : app.config_dir + "/layout.ini"; }

void load_layout(AppState& app) {
  const std::string path = layout_path(app);
  std::string text;
  if (path.empty() || !read_text_file(path, text)) return;
  const std::string problem = check_layout_ini(text);
  if (!problem.empty()) {
    app.log.add(LogLevel::Warning,
                "ignoring the window layout file " + path + " (" + problem + "): using the default layout; the file "
                "is replaced when the layout is saved",
                0);
    return;
  }
  ImGui::LoadIniSettingsFromMemory(text.data(), text.size());
  app.layout_loaded = true;
}

void save_layout(AppState& app) {
  const std::string path = layout_path(app);
  if (path.empty()) return;
  size_t n = 0;
  const char* ini = ImGui::SaveIniSettingsToMemory(&n);
  const std::string err = write_text_file_atomic(path, std::string(ini, n));
  if (!err.empty()) app.log.add(LogLevel::Warning, "cannot save the window layout: " + err, 0);
}

}  // namespace

// ---- 7. run_app ----

int run_app(const lab::RunConfig& cfg_in, const AppOptions& opts) {
  const auto shots = parse_views(opts.view);  // throws before any window for a bad --view
  // --open: a run directory, a simulate result or a bench result (read before any window: a bad one is exit 4)
  RunData opened;
  BenchResult opened_bench;
  std::optional<SimulateRun> opened_sim;
  const bool open_sim_result = !opts.open_dir.empty() && looks_like_simulate_result(opts.open_dir);
  const bool open_bench_result = !open_sim_result && !opts.open_dir.empty() && looks_like_bench_result(opts.open_dir);
  if (open_sim_result) opened_sim = load_simulate_result(opts.open_dir);
  else if (open_bench_result) opened_bench = load_bench_result(opts.open_dir);
  else if (!opts.open_dir.empty()) opened = load_run_dir(opts.open_dir);

  // The GUI thread asks for a higher priority than the ranks (before GL starts its rasterizer
  // threads, which inherit it): a frame takes the same CPU either way, but it is drawn when it is
  // due instead of queueing behind eight busy ranks. The run hosts' threads go back to the
  // normal priority (RunHost), so training competes as it does headless. Not permitted (most
  // desktops without rtkit): frames just take longer while the ranks train.
  const bool raised = raise_ui_priority();
  GlfwWindow win;
  std::string err = win.init();
  const float scale = err.empty() ? (opts.ui_scale > 0 ? static_cast<float>(opts.ui_scale) : win.monitor_scale()) : 1.0f;
  if (err.empty()) err = win.open("dtlab: the Distributed Training Lab", opts.width, opts.height, scale);
  if (!err.empty()) {
    std::fprintf(stderr, "dtlab gui: cannot open a window (%s); train headless with `dtlab run` (see `dtlab run --help`)\n",
                 err.c_str());
    return lab::kExitNoDisplay;
  }
  const double t0 = lab::now_seconds();
  AppState app;
  app.opts = opts;
  ImGuiIO& io = ImGui::GetIO();
  io.IniFilename = nullptr;  // saved by us, under the config directory, never the current one
  setup_fonts(scale, app.log);
  setup_style(scale);

  // The script: screenshots and benchmark runs use the default layout and never save one.
  Script& sc = app.script;
  sc.active = !opts.screenshot.empty() || (!opts.frame_stats.empty() && (opts.steps_given || !opts.open_dir.empty()));
  sc.base = opts.screenshot;
  sc.ring_steps = opts.ring_steps;
  sc.target_steps = cfg_in.steps;
  sc.started = 0;
  const bool persist = !sc.active;
  if (persist) {
    app.config_dir = config_dir();
    load_layout(app);
  }
  if (!shots.empty() && !sc.active && shots.front().second) app.solo = shots.front().second;  // --view alone
  if (!shots.empty() && shots.front().second) {
    app.view = *shots.front().second;
    app.select_view = true;
  }

  app.compare_bn = opts.compare_bn;
  app.controls.delay_ms = static_cast<float>(opts.delay_ms);
  if (opened_sim) {
    // no run to watch or control: the Scale view, set up from the simulation, fills the window
    show_simulate_run(app, std::move(*opened_sim));
    app.controls.pending = cfg_in;
    app.view = ViewId::Scale;
    app.select_view = true;
    if (shots.empty()) app.solo = ViewId::Scale;
    app.log.add(LogLevel::Info, "opened " + opts.open_dir + ": " + app.scale.apply->line, 0);
  } else if (open_bench_result) {
    // no run to watch or control: the Benchmark view fills the window (as --view bench)
    app.bench = std::move(opened_bench);
    app.controls.pending = cfg_in;
    app.view = ViewId::Bench;
    app.select_view = true;
    if (shots.empty()) app.solo = ViewId::Bench;
    app.log.add(LogLevel::Info, "opened " + opts.open_dir + ": " + describe_bench(app.bench), 0);
  } else if (!opts.open_dir.empty()) {
    app.data = std::move(opened);
    app.controls.pending = app.data.cfg;
    app.log.add(LogLevel::Info, "opened " + opts.open_dir, 0);
  } else if (!opts.lesson.empty()) {
    // a lesson: nothing trains before the learner has predicted
    app.controls.pending = cfg_in;
    start_lesson(app, opts.lesson, t0, true);
  } else {
    lab::RunConfig cfg = cfg_in;
    // Staging a mid-allreduce picture: the run must go on past --steps, and must not pass the
    // gate before the staging predicate is in place.
    if (sc.active && opts.ring_steps >= 0) cfg.steps = cfg_in.steps + 1;
    app.controls.pending = cfg_in;
    start_live(app, cfg, opts.paused || (sc.active && opts.ring_steps >= 0), t0);
  }
  if (!raised)
    app.log.add(LogLevel::Info, "the window runs at the ranks' priority (raising it is not permitted here)", 0);

  double prev_start = 0;
  double due = 0;  // when the last wait was to end (0: it did not wait)
  bool prev_training = false;  // the last drawn frame was drawn while the ranks trained
  while (!app.quit && !win.should_close()) {
    const double frame_start = lab::now_seconds();
    const double late = due > 0 ? frame_start - due : 0;
    const bool training_before = app.data.live && app.data.phase == RunPhase::Running;
    // the parts of this frame (FrameStats): wall and thread-CPU time at each boundary
    std::array<FrameStats::Part, kFrameParts> parts{};
    double mark_wall = frame_start, mark_cpu = thread_cpu_seconds();
    auto mark = [&](FramePart p) {
      const double w = lab::now_seconds(), c = thread_cpu_seconds();
      parts[static_cast<size_t>(p)].wall_ms += (w - mark_wall) * 1e3;
      parts[static_cast<size_t>(p)].cpu_ms += (c - mark_cpu) * 1e3;
      mark_wall = w;
      mark_cpu = c;
    };
    app.clock.now = frame_start - t0;
    // Screenshots hold animations at a fixed phase; a benchmark (--frame-stats) animates as the
    // user would see it, or it would measure less than a user gets.
    app.clock.frozen = sc.active && !opts.screenshot.empty();

    // the script picks what to show before the frame is drawn
    const bool ready = sc.active && script_ready(app);
    if (ready && !shots.empty() && sc.next_shot < shots.size()) {
      const auto& want = shots[sc.next_shot].second;
      if (app.solo != want) {
        app.solo = want;
        sc.settle_frames = 0;
      }
      if (want && app.view != *want) {
        app.view = *want;
        app.select_view = true;
      }
    }

    // news from the runs: incremental copies, never a wait on training
    if (app.host) app.data.update_from(*app.host);
    if (app.twin) app.twin_data.update_from(*app.twin);
    log_run_news(app, t0);
    echo_log(app);
    reap(app);
    update_checks(app);
    update_lesson(app, t0);
    mark(FramePart::News);

    win.new_frame(sc.active);
    const ImGuiIO& cio = ImGui::GetIO();
    if (cio.MouseDelta.x != 0 || cio.MouseDelta.y != 0 || cio.MouseWheel != 0 || ImGui::IsAnyMouseDown() ||
        cio.InputQueueCharacters.Size > 0)
      app.last_input = app.clock.now;
    Commands cmd;
    handle_keys(win.take_key_presses(), cmd);
    // a few frames before a scripted capture, so that layouts settle (ImGui sizes some windows
    // from the previous frame)
    const bool capture = ready && sc.settle_frames + 1 >= 4;
    DrawnItems items;  // --screenshot-items: what the captured frame draws
    const bool record = capture && opts.screenshot_items && !opts.screenshot.empty();
    if (record) record_drawn_items(&items);
    draw_windows(app, cmd);
    record_drawn_items(nullptr);
    mark(FramePart::Ui);
    const bool drawn = win.render(cmd.screenshot || capture);
    mark(FramePart::Render);

    if (cmd.screenshot) {
      char name[64];
      const std::time_t now = std::time(nullptr);
      std::strftime(name, sizeof name, "dtlab-%Y%m%d-%H%M%S.png", std::localtime(&now));
      const std::string e = win.save_png(name);
      app.log.add(e.empty() ? LogLevel::Info : LogLevel::Error, e.empty() ? std::string("screenshot saved: ") + name : e,
                  app.clock.now);
    }
    if (ready) {
      ++sc.settle_frames;
      if (capture) {
        if (!opts.screenshot.empty()) {
          const size_t count = std::max<size_t>(1, shots.size());
          const std::string key = shots.empty() ? "layout" : shots[sc.next_shot].first;
          const std::string path = shot_path(sc, key, count);
          std::string e = win.save_png(path);
          if (e.empty() && record) {
            const std::string items_path = drawn_items_path(path);
            e = write_text_file_atomic(items_path, items.to_json(path, key).dump(1) + "\n");
            if (!e.empty()) e = "cannot write " + items_path + ": " + e;
          }
          if (!e.empty()) {
            std::fprintf(stderr, "dtlab gui: %s\n", e.c_str());
            app.exit_code = lab::kExitIo;
            app.quit = true;
          } else {
            std::printf("screenshot: %s\n", path.c_str());
          }
        }
        ++sc.next_shot;
        sc.settle_frames = 0;
        if (sc.next_shot >= std::max<size_t>(1, shots.size())) app.quit = true;
      }
    }
    if (opts.exit_after > 0 && app.clock.now >= opts.exit_after) app.quit = true;
    if (sc.active && app.clock.now > 1800) {
      std::fprintf(stderr, "dtlab gui: the script did not finish within 30 minutes (run phase: %s)\n",
                   run_phase_name(app.data.phase));
      app.exit_code = lab::kExitFailure;
      app.quit = true;
    }
    if (drawn) win.swap();
    mark(FramePart::Swap);
    apply_commands(app, cmd, t0);
    if (persist && io.WantSaveIniSettings) {
      save_layout(app);
      io.WantSaveIniSettings = false;
    }

    const double end = lab::now_seconds();
    if (drawn) {
      int fw = 0, fh = 0;
      win.framebuffer_size(fw, fh);
      // a frame drawn while the ranks train (FrameStats); the interval only between two of them
      const bool training = app.data.live && app.data.phase == RunPhase::Running && training_before;
      if (training)
        app.drawn_fraction_sum += fw > 0 && fh > 0 ? win.drawn_pixels() / (static_cast<double>(fw) * fh) : 1.0;
      app.frames.add((end - frame_start) * 1e3,
                     prev_start > 0 && training && prev_training ? (frame_start - prev_start) * 1e3 : 0, late * 1e3,
                     parts, training);
      prev_training = training;
      prev_start = frame_start;
    } else {
      ++app.frames_skipped;
    }
    // Frame pacing: the GUI must not take the ranks' CPU. Full rate while the user interacts,
    // 15 fps while a run moves (what changes then is numbers and curves), 10 when nothing does
    // (and then identical frames are not drawn at all); input wakes the loop at once.
    const bool moving = app.data.phase == RunPhase::Running || app.data.phase == RunPhase::Loading ||
                        app.data.phase == RunPhase::Finishing || (app.data.live && app.data.gate_delay_s > 0);
    // While the user only watches a moving run, the GUI keeps within a budget: its frames may
    // take at most kWatchDuty of the wall clock (a frame that took 20 ms waits 180 ms).
    const bool interacting = app.clock.now - app.last_input < 1.0;
    double fps = interacting ? opts.fps : moving ? 15 : 10;
    if (win.iconified()) fps = 4;
    fps = std::min<double>(fps, opts.fps);
    double interval = 1.0 / fps;
    if (drawn) app.frame_work_ema = 0.8 * app.frame_work_ema + 0.2 * (end - frame_start);
    if (!interacting && moving) interval = std::max(interval, app.frame_work_ema / kWatchDuty);
    const double wait = interval - (lab::now_seconds() - frame_start);
    due = wait > 0 ? lab::now_seconds() + wait : 0;
    win.wait_events(wait > 0 ? wait : 0);
  }
  if (persist) save_layout(app);

  if (!opts.frame_stats.empty()) {
    int fw = 0, fh = 0;
    win.framebuffer_size(fw, fh);
    const RunData& d = app.data;
    nlohmann::json extra = {
        {"samples_per_s", d.summary.valid ? d.summary.samples_per_s : d.samples_per_s},
        {"samples_per_s_source", d.summary.valid ? "summary (as dtlab run reports it)" : "snapshot"},
        {"steps", d.steps_done()},
        {"seconds", lab::now_seconds() - t0},
        {"model", d.cfg.model},
        {"world_size", d.cfg.world_size},
        {"batch_size", d.cfg.batch_size},
        {"window", fmt("%dx%d", fw, fh)},
        {"renderer", win.renderer()},
        {"run_phase", run_phase_name(d.phase)},
        {"frames_skipped", app.frames_skipped},
        {"partial_redraw", win.partial_redraw()},
        {"ui_priority_raised", raised},
        {"rank_nice", opts.rank_nice},
        {"drawn_fraction_mean", app.frames.frames() ? app.drawn_fraction_sum / static_cast<double>(app.frames.frames()) : 0.0},
        {"note", "frames, frame_ms, interval_ms, late_ms, parts_mean_ms: over the frames drawn while the ranks "
                 "train (all_frames, all_frame_ms: every drawn frame). frame_ms: time to produce a drawn frame, "
                 "from waking up to handing it to the window system (run news, UI, rendering, swap); "
                 "interval_ms: time between the starts of drawn frames (includes the pacing wait); late_ms: how "
                 "long after its due time a frame started (waiting for a CPU); parts_mean_ms: wall and thread-CPU "
                 "ms per part; frames identical to the one on screen are not drawn (frames_skipped); "
                 "drawn_fraction_mean: share of the window's pixels a drawn frame painted (partial redraws paint "
                 "only what changed)"}};
    std::ofstream f(opts.frame_stats, std::ios::trunc);
    f << app.frames.to_json(extra).dump(2) << "\n";
    if (!f) {
      std::fprintf(stderr, "dtlab gui: cannot write %s\n", opts.frame_stats.c_str());
      if (app.exit_code == 0) app.exit_code = lab::kExitIo;
    }
  }
  // Stop every run, then wait for them (their threads end at the next gate).
  if (app.host) app.host->request_stop();
  if (app.twin) app.twin->request_stop();
  for (auto& h : app.retiring) h->request_stop();
  app.host.reset();
  app.twin.reset();
  app.retiring.clear();
  return app.exit_code;
}

}  // namespace viz
