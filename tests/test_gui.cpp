// The lab window, end to end through `dtlab gui` under Xvfb (xvfb-run -a): every view renders
// with an empty run (no dataset) and a busy one, a run directory opens, screenshots are not blank
// and differ per view, a corrupt layout file is ignored with a warning, and without a display
// the command says so in one line and exits with code 7. Skipped where xvfb-run is missing.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "errors.h"
#include "paths.h"
#include "test_util.h"

#ifdef DTLAB_HAVE_GUI
#include <stb_image.h>
#endif

namespace {

bool contains(const std::string& s, const std::string& what) { return s.find(what) != std::string::npos; }

bool have_xvfb() { return std::system("command -v xvfb-run > /dev/null 2>&1") == 0; }

#define DTLAB_REQUIRE_GUI()                                                               \
  do {                                                                                    \
    if (!kHaveGui) GTEST_SKIP() << "this build has no GUI";                                \
    if (!have_xvfb()) GTEST_SKIP() << "xvfb-run is not installed (apt-get install xvfb)"; \
  } while (0)

#ifdef DTLAB_HAVE_GUI
constexpr bool kHaveGui = true;
#else
constexpr bool kHaveGui = false;
#endif

// dtlab gui ARGS under a fresh virtual display of 1600x1000, with its own config directory.
testutil::CliResult run_gui(const std::string& args, const std::string& config_home) {
  return testutil::run_cli_with_prefix("XDG_CONFIG_HOME=" + config_home + " xvfb-run -a -s \"-screen 0 1600x1000x24\"",
                                       "gui " + args);
}

struct Png {
  int w = 0, h = 0;
  double variance = 0;
  std::vector<unsigned char> px;
};

Png load_png(const std::string& path) {
  Png p;
#ifdef DTLAB_HAVE_GUI
  int n = 0;
  unsigned char* data = stbi_load(path.c_str(), &p.w, &p.h, &n, 3);
  if (!data) return p;
  p.px.assign(data, data + static_cast<size_t>(p.w) * p.h * 3);
  stbi_image_free(data);
  double sum = 0, sq = 0;
  for (unsigned char v : p.px) {
    sum += v;
    sq += static_cast<double>(v) * v;
  }
  const double m = sum / static_cast<double>(p.px.size());
  p.variance = sq / static_cast<double>(p.px.size()) - m * m;
#else
  (void)path;
#endif
  return p;
}

// Fraction of pixels that differ between two images of the same size.
double differing(const Png& a, const Png& b) {
  if (a.px.size() != b.px.size() || a.px.empty()) return 1.0;
  size_t diff = 0;
  for (size_t i = 0; i < a.px.size(); i += 3)
    diff += a.px[i] != b.px[i] || a.px[i + 1] != b.px[i + 1] || a.px[i + 2] != b.px[i + 2];
  return static_cast<double>(diff) / static_cast<double>(a.px.size() / 3);
}

const char* kViews[] = {"ring", "batchnorm", "batching", "traineval", "grid", "scale", "layout"};

// Every view's screenshot exists, is not blank, and differs from the others.
void expect_views(const std::string& stem) {
  std::vector<Png> shots;
  for (const char* v : kViews) {
    const std::string f = stem + "-" + v + ".png";
    ASSERT_TRUE(std::filesystem::exists(f)) << f;
    Png p = load_png(f);
    EXPECT_EQ(p.w, 1600) << f;
    EXPECT_EQ(p.h, 1000) << f;
    EXPECT_GT(p.variance, 100.0) << f << " looks blank";
    shots.push_back(std::move(p));
  }
  for (size_t i = 0; i < shots.size(); ++i)
    for (size_t j = i + 1; j < shots.size(); ++j)
      EXPECT_GT(differing(shots[i], shots[j]), 0.02) << kViews[i] << " and " << kViews[j] << " look the same";
}

// --screenshot-items: what a captured frame drew (viz/data/drawn_items.h).
struct Drawn {
  nlohmann::json items = nlohmann::json::array();
  // Items of this kind whose label contains `label` (in `window` when given).
  std::vector<nlohmann::json> find(const std::string& kind, const std::string& label, const std::string& window = "") const {
    std::vector<nlohmann::json> out;
    for (const auto& it : items)
      if (it["kind"] == kind && contains(it.value("label", ""), label) && (window.empty() || it["window"] == window))
        out.push_back(it);
    return out;
  }
  // The series of chart `chart` called `label`; null when it was not drawn.
  nlohmann::json series(const std::string& chart, const std::string& label) const {
    for (const auto& it : items)
      if (it["kind"] == "series" && it["chart"] == chart && it["label"] == label) return it;
    return nullptr;
  }
  std::string dump() const { return items.dump(1); }
};

// The lessons' tests: the user's data and settings in `d`, a virtual display.
std::string lesson_env(const testutil::TempDir& d) {
  return "XDG_DATA_HOME=" + d.file("data") + " XDG_CONFIG_HOME=" + d.file("config") +
         " xvfb-run -a -s \"-screen 0 1600x1000x24\"";
}

Drawn load_drawn(const std::string& png) {
  Drawn d;
  const std::string path = png.substr(0, png.size() - 4) + ".items.json";
  if (!std::filesystem::exists(path)) {
    ADD_FAILURE() << path << " was not written";
    return d;
  }
  const auto j = nlohmann::json::parse(testutil::read_file(path));
  EXPECT_EQ(j["format"], "dtlab drawn items");
  d.items = j["items"];
  return d;
}

// The buttons, sliders and checkboxes that make a live run move.
const char* kRunMovers[] = {"Pause", "Play", "ring step", "allreduce", "iteration", "epoch", "speed", "Reset"};

}  // namespace

TEST(GuiNoDisplay, OneLineAndExitCodeSeven) {
  const auto r = testutil::run_cli_with_prefix("env -u DISPLAY -u WAYLAND_DISPLAY", "gui");
  EXPECT_EQ(r.exit_code, lab::kExitNoDisplay) << r.out;
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;
  EXPECT_TRUE(contains(r.out, "dtlab run")) << r.out;
  EXPECT_TRUE(contains(r.out, kHaveGui ? "no display" : "no GUI")) << r.out;
  // dtlab alone without a display prints the help (nothing went wrong: exit 0)
  const auto h = testutil::run_cli_with_prefix("env -u DISPLAY -u WAYLAND_DISPLAY", "");
  EXPECT_EQ(h.exit_code, lab::kExitOk);
  EXPECT_TRUE(contains(h.out, "gui")) << h.out;
}

TEST(GuiNoDisplay, BadSettingsAreRefusedBeforeAnyWindow) {
  const auto r = testutil::run_cli("gui --batch-size 0");
  EXPECT_EQ(r.exit_code, lab::kExitUsage) << r.out;
  EXPECT_TRUE(contains(r.out, "batch_size should be a positive integer value, but got batch_size=0")) << r.out;
}

TEST(Gui, EveryViewRendersWithAnEmptyRun) {
  DTLAB_REQUIRE_GUI();
  testutil::TempDir d;
  // no dataset: the run fails to load, the window says so and every view renders empty
  const auto r = run_gui("--data-dir " + d.file("nowhere") + " --view ring,batchnorm,batching,traineval,grid,scale,layout "
                         "--screenshot " + d.file("empty.png"), d.file("config"));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  expect_views(d.file("empty"));
  EXPECT_TRUE(contains(r.out, "nowhere")) << "the missing dataset is named:\n" << r.out;
}

TEST(Gui, EveryViewRendersWithABusyRun) {
  DTLAB_REQUIRE_GUI();
  DTLAB_REQUIRE_DATASET();
  testutil::TempDir d;
  const auto r = run_gui("--model mlp --world-size 4 --batch-size 16 --limit-train 1000 --limit-test 200 --steps 20 "
                         "--eval-every 5 --eval-samples 100 --compare-bn --frame-stats " + d.file("frames.json") +
                         " --view ring,batchnorm,batching,traineval,grid,scale,layout --screenshot " + d.file("busy.png"),
                         d.file("config"));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  expect_views(d.file("busy"));
  const auto j = nlohmann::json::parse(testutil::read_file(d.file("frames.json")));
  EXPECT_GT(j["all_frames"].get<int>(), 5);
  for (const char* k : {"p50", "p95", "p99", "max"}) EXPECT_GT(j["all_frame_ms"][k].get<double>(), 0) << k;
  EXPECT_LE(j["frames"].get<int>(), j["all_frames"].get<int>()) << "frames counts those drawn while the ranks train";
  EXPECT_GT(j["samples_per_s"].get<double>(), 0);
  EXPECT_FALSE(std::filesystem::exists(d.file("config/dtlab/layout.ini"))) << "scripted runs never save a layout";
}

// The parallelism modes in every view: DataParallel (no allreduce, one DataLoader, a chunk of one
// sample in the last batch) and local SGD (gradients, then parameter averages).
TEST(Gui, EveryViewRendersForDataParallelAndLocalSgd) {
  DTLAB_REQUIRE_GUI();
  DTLAB_REQUIRE_DATASET();
  testutil::TempDir d;
  const char* modes[][2] = {{"dp", "--mode dp --batch-size 30"},
                            {"lsgd", "--mode local-sgd --average-every 3 --warmup-steps 2 --allreduce tree"}};
  for (const auto& m : modes) {
    const auto r = run_gui(std::string("--model mlp --world-size 4 --limit-train 1000 --limit-test 200 --steps 12 ") + m[1] +
                               " --eval-every 5 --eval-samples 100 --view ring,batchnorm,batching,traineval,grid,scale,layout "
                               "--frame-stats " + d.file(std::string(m[0]) + ".json") + " --screenshot " +
                               d.file(std::string(m[0]) + ".png"),
                           d.file("config"));
    ASSERT_EQ(r.exit_code, 0) << m[0] << "\n" << r.out;
    EXPECT_FALSE(contains(r.out, "error")) << m[0] << "\n" << r.out;
    expect_views(d.file(m[0]));
    const auto j = nlohmann::json::parse(testutil::read_file(d.file(std::string(m[0]) + ".json")));
    EXPECT_EQ(j["run_phase"].get<std::string>(), "finished") << m[0];
  }
}

// The allreduce view mid-collective for the other algorithms: naive (everything through rank 0)
// and tree (six ranks: two fold into the power-of-two core first). Different traffic, different
// pictures.
TEST(Gui, StopsMidNaiveAndTreeAllreduce) {
  DTLAB_REQUIRE_GUI();
  DTLAB_REQUIRE_DATASET();
  testutil::TempDir d;
  std::vector<Png> shots;
  for (const char* a : {"naive --world-size 4", "tree --world-size 6"}) {
    const std::string name = std::string(a).substr(0, std::string(a).find(' '));
    const auto r = run_gui(std::string("--model mlp --allreduce ") + a + " --limit-train 1000 --limit-test 200 --steps 3 "
                           "--ring-steps 2 --view ring --screenshot " + d.file(name + ".png"), d.file("config"));
    ASSERT_EQ(r.exit_code, 0) << a << "\n" << r.out;
    EXPECT_FALSE(contains(r.out, "no gradient allreduce")) << r.out;
    shots.push_back(load_png(d.file(name + ".png")));
    EXPECT_GT(shots.back().variance, 100.0) << a;
  }
  EXPECT_GT(differing(shots[0], shots[1]), 0.02) << "naive and tree look the same";
  // DataParallel has no allreduce to stop in: refused before any window
  const auto dp = testutil::run_cli("gui --mode dp --steps 3 --ring-steps 2");
  EXPECT_EQ(dp.exit_code, lab::kExitUsage) << dp.out;
  EXPECT_TRUE(contains(dp.out, "--mode dp has none")) << dp.out;
}

TEST(Gui, StopsMidRingAllreduce) {
  DTLAB_REQUIRE_GUI();
  DTLAB_REQUIRE_DATASET();
  testutil::TempDir d;
  const auto r = run_gui("--world-size 4 --limit-train 1000 --limit-test 200 --steps 3 --ring-steps 2 --view ring "
                         "--screenshot " + d.file("ring.png"), d.file("config"));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_GT(load_png(d.file("ring.png")).variance, 100.0);
}

TEST(Gui, OpensARunDirectory) {
  DTLAB_REQUIRE_GUI();
  DTLAB_REQUIRE_DATASET();
  testutil::TempDir d;
  const auto run = testutil::run_cli("run --model mlp --world-size 2 --batch-size 16 --limit-train 320 --limit-test 64 "
                                     "--steps 10 --eval-every 5 --threads 1 --out " + d.file("run"));
  ASSERT_EQ(run.exit_code, 0) << run.out;
  const auto r = run_gui("--open " + d.file("run") + " --view ring,batchnorm,batching,traineval,grid,scale,layout --screenshot " +
                         d.file("open.png"), d.file("config"));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  expect_views(d.file("open"));
  const auto bad = run_gui("--open " + d.file("nothing-here"), d.file("config"));
  EXPECT_EQ(bad.exit_code, lab::kExitIo) << bad.out;
  EXPECT_TRUE(contains(bad.out, "config.toml")) << bad.out;
}

// The Memory view: every rank's bar at the step's peak point and the step's columns. Opened from a
// run directory without --record-memory it shows each rank's peak iteration from summary.json; live
// (and with --record-memory) the newest iteration's. The bars' totals are summary.json's peaks.
TEST(Gui, TheMemoryViewDrawsEveryRanksPeakAndTheStep) {
  DTLAB_REQUIRE_GUI();
  DTLAB_REQUIRE_DATASET();
  testutil::TempDir d;
  const std::string flags = "--model mlp --world-size 4 --batch-size 16 --limit-train 320 --limit-test 64 --steps 4 "
                            "--threads 1 --mode fsdp --sharding-strategy full_shard --fsdp-wrap layer --optimizer adam "
                            "--lr 0.001";
  const auto run = testutil::run_cli("run " + flags + " --out " + d.file("run"));
  ASSERT_EQ(run.exit_code, 0) << run.out;
  const auto summary = nlohmann::json::parse(testutil::read_file(d.file("run/summary.json")));
  for (const std::string& how : {std::string("--open ") + d.file("run"), flags + " --eval-every 0"}) {
    SCOPED_TRACE(how);
    const auto r = run_gui(how + " --view memory --screenshot-items --screenshot " + d.file("m.png"), d.file("config"));
    ASSERT_EQ(r.exit_code, 0) << r.out;
    const Drawn m = load_drawn(d.file("m.png"));
    for (int rank = 0; rank < 4; ++rank) {
      const auto bar = m.find("value", "memory: rank " + std::to_string(rank));
      ASSERT_EQ(bar.size(), 1u) << m.dump();
      const double peak = summary["memory"]["per_rank"][rank]["peak"]["bytes"].get<double>();
      char want[32];
      std::snprintf(want, sizeof want, "%.2f MiB", peak / (1024.0 * 1024.0));
      EXPECT_EQ(bar[0]["value"], want) << "rank " << rank;
    }
    const auto point = m.find("value", "memory: the point shown");
    ASSERT_EQ(point.size(), 1u) << m.dump();
    EXPECT_EQ(point[0]["value"], summary["memory"]["per_rank"][0]["peak"]["at"]);
    const auto chart = m.find("value", "memory: points of the step");
    ASSERT_EQ(chart.size(), 1u);
    EXPECT_EQ(chart[0]["value"], std::to_string(summary["memory"]["per_rank"][0]["peak_step_points"].size()));
    EXPECT_EQ(m.find("value", "memory: formula").at(0)["value"], "(8+K)Psi/N");
  }
}

// The Grid view: a run's ranks on the grid of data and tensor parallelism, opened from its run
// directory and live. Its groups are Megatron-LM's placement; the bytes each kind of group carried
// in the iteration shown are summary.json's per iteration (every iteration of --mode tensor moves
// the same bytes).
TEST(Gui, TheGridViewDrawsTheGroupsAndTheirBytes) {
  DTLAB_REQUIRE_GUI();
  DTLAB_REQUIRE_DATASET();
  testutil::TempDir d;
  const std::string flags = "--model mlp --mode tensor --tp 2 --dp 2 --batch-size 16 --limit-train 320 --limit-test 64 "
                            "--steps 3 --threads 1";
  const auto run = testutil::run_cli("run " + flags + " --out " + d.file("run"));
  ASSERT_EQ(run.exit_code, 0) << run.out;
  const auto summary = nlohmann::json::parse(testutil::read_file(d.file("run/summary.json")));
  const auto& bytes = summary["grid"]["bytes_per_iteration_by_group"];
  for (const std::string& how : {std::string("--open ") + d.file("run"), flags + " --eval-every 0"}) {
    SCOPED_TRACE(how);
    const auto r = run_gui(how + " --view grid --screenshot-items --screenshot " + d.file("g.png"), d.file("config"));
    ASSERT_EQ(r.exit_code, 0) << r.out;
    const Drawn g = load_drawn(d.file("g.png"));
    ASSERT_EQ(g.find("value", "grid: shape").size(), 1u) << g.dump();
    EXPECT_EQ(g.find("value", "grid: shape")[0]["value"], "2 x 1 x 2");
    EXPECT_EQ(g.find("value", "grid: tp groups").at(0)["value"], "{0, 1}  {2, 3}");
    EXPECT_EQ(g.find("value", "grid: dp groups").at(0)["value"], "{0, 2}  {1, 3}");
    EXPECT_TRUE(g.find("value", "grid: pp groups").empty());
    for (const char* kind : {"dp", "tp"})
      EXPECT_EQ(g.find("value", std::string("grid: ") + kind + " bytes").at(0)["value"],
                std::to_string(static_cast<uint64_t>(bytes[kind].get<double>())))
          << kind;
  }
}

// The Scale view: the simulator's charts at its default settings (128 DGX H100 nodes, 16 MiB
// allreduce, NCCL's simple protocol) are complete in a screenshot, its busbw series are `dtlab
// simulate`'s, dbtree stays faster than ring up to 8 GiB on 1,024 GPUs (as NCCL's own model); a run
// trained with the link model adds its gradient allreduces as measured, beside the wire prediction
// for its link; one without says so in one line.
TEST(Gui, TheScaleViewDrawsTheSimulatorAndTheRunsAllreduces) {
  DTLAB_REQUIRE_GUI();
  DTLAB_REQUIRE_DATASET();
  testutil::TempDir d;
  const auto run = testutil::run_cli("run --model mlp --world-size 4 --batch-size 16 --limit-train 640 --limit-test 64 "
                                     "--steps 4 --threads 1 --link-gbps 1 --link-latency-us 50 --out " + d.file("run"));
  ASSERT_EQ(run.exit_code, 0) << run.out;
  const auto r = run_gui("--open " + d.file("run") + " --view scale --screenshot-items --screenshot " + d.file("s.png"),
                         d.file("config"));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const Drawn g = load_drawn(d.file("s.png"));
  ASSERT_EQ(g.find("value", "scale: settings").size(), 1u) << g.dump();
  EXPECT_EQ(g.find("value", "scale: settings")[0]["value"], "dgx-h100 allreduce simple 128 nodes 16777216 bytes");
  EXPECT_EQ(g.find("value", "scale: missing").at(0)["value"], "0") << "a screenshot waits for every point";
  EXPECT_EQ(g.find("value", "scale: crossover").at(0)["value"], "none");
  // the ring's busbw at 8 .. 4,096 GPUs, as `dtlab simulate` prints it (GB/s, two decimals)
  const auto sim = testutil::run_cli("simulate --topology dgx-h100 --nodes 1,8,512 --sizes 16M --algorithm ring");
  ASSERT_EQ(sim.exit_code, 0) << sim.out;
  const std::string ring = g.find("value", "scale: busbw by GPUs ring").at(0)["value"];
  std::vector<double> busbw;
  for (size_t at = 0; at < ring.size();) {
    size_t used = 0;
    busbw.push_back(std::stod(ring.substr(at), &used) / 1e9);
    at += used;
  }
  ASSERT_EQ(busbw.size(), 10u) << ring;
  for (size_t i : {size_t{0}, size_t{3}, size_t{9}}) {
    char text[32];
    std::snprintf(text, sizeof text, " %.2f ", busbw[i]);
    EXPECT_TRUE(contains(sim.out, text)) << text << " not in\n" << sim.out;
  }
  // this run's bucket (the mlp's gradients fit DDP's one 25 MB bucket): an allreduce per iteration,
  // measured and predicted, milliseconds on a 1 Gbit/s link (a loose band: the machine may be busy)
  int points = 0;
  for (const auto& it : g.find("value", "scale: this run ")) {
    double measured = 0, predicted = 0;
    int n = 0;
    ASSERT_EQ(std::sscanf(it["value"].get<std::string>().c_str(), "measured %lf predicted %lf n %d", &measured, &predicted,
                          &n),
              3)
        << it;
    EXPECT_GT(predicted, 1e-3);
    EXPECT_GT(measured, predicted * 0.5);
    EXPECT_LT(measured, predicted * 20);
    EXPECT_EQ(n, 4);
    ++points;
  }
  EXPECT_EQ(points, 1) << g.dump();

  // a run without the link model: one line says why its points are missing
  const auto plain = testutil::run_cli("run --model mlp --world-size 2 --batch-size 16 --limit-train 320 --limit-test 64 "
                                       "--steps 2 --threads 1 --out " + d.file("plain"));
  ASSERT_EQ(plain.exit_code, 0) << plain.out;
  const auto r2 = run_gui("--open " + d.file("plain") + " --view scale --screenshot-items --screenshot " + d.file("p.png"),
                          d.file("config"));
  ASSERT_EQ(r2.exit_code, 0) << r2.out;
  const Drawn p = load_drawn(d.file("p.png"));
  ASSERT_EQ(p.find("value", "scale: this run").size(), 1u) << p.dump();
  EXPECT_TRUE(contains(p.find("value", "scale: this run")[0]["value"], "no link model")) << p.dump();
}

// A finished run opened from its run directory cannot move: the controls offer no play, pause, step
// or speed, but say what the run is and offer to train its settings live. Trained without
// --eval-every, its Train vs eval view draws the epoch ends where they were (iterations 10 and 20,
// as summary.json's per_epoch says) and says what --eval-every would add; the other views draw
// what the directory holds. The same live run keeps its buttons.
TEST(Gui, AnOpenedRunOffersNoRunButtonsAndDrawsItsEpochEnds) {
  DTLAB_REQUIRE_GUI();
  DTLAB_REQUIRE_DATASET();
  testutil::TempDir d;
  const std::string flags = "--model mlp --world-size 2 --batch-size 16 --limit-train 320 --limit-test 64 --epochs 2 "
                            "--threads 1";
  const auto run = testutil::run_cli("run " + flags + " --out " + d.file("run"));
  ASSERT_EQ(run.exit_code, 0) << run.out;
  const auto summary = nlohmann::json::parse(testutil::read_file(d.file("run/summary.json")));
  std::vector<double> epoch_ends, epoch_acc;
  for (const auto& e : summary["per_epoch"]) {
    epoch_ends.push_back(e["steps"].get<double>());
    epoch_acc.push_back(e["test_accuracy"].get<double>());
  }
  ASSERT_EQ(epoch_ends, (std::vector<double>{10, 20}));

  const auto r = run_gui("--open " + d.file("run") + " --view layout,traineval,batchnorm,batching --screenshot-items "
                         "--screenshot " + d.file("open.png"), d.file("config"));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const Drawn layout = load_drawn(d.file("open-layout.png"));
  for (const char* b : kRunMovers) {
    EXPECT_TRUE(layout.find("button", b, "Controls").empty()) << b << "\n" << layout.dump();
    EXPECT_TRUE(layout.find("slider", b, "Controls").empty()) << b;
  }
  EXPECT_EQ(layout.find("heading", "finished run, opened from " + d.file("run") + ": 20 iterations, 2 epochs of 10 "
                                   "iterations", "Controls").size(), 1u)
      << layout.dump();
  const auto train = layout.find("button", "Train these settings live", "Controls");
  ASSERT_EQ(train.size(), 1u);
  EXPECT_TRUE(train[0]["enabled"].get<bool>());
  EXPECT_EQ(layout.find("button", "Apply (starts a live run)", "Controls").size(), 1u);
  EXPECT_EQ(layout.find("checkbox", "last collective", "Views").size(), 1u) << "the Allreduce view replays the last one";
  for (const char* chart : {"ranks_loss", "ranks_acc"}) {  // every iteration of both ranks
    const auto rank1 = layout.series(chart, "rank 1");
    ASSERT_FALSE(rank1.is_null()) << chart;
    EXPECT_EQ(rank1["n"], 20) << chart;
  }
  EXPECT_TRUE(layout.find("text", "no events", "Timeline").empty()) << "the trace is there";

  const Drawn te = load_drawn(d.file("open-traineval.png"));
  const auto acc = te.series("te_acc", "end of epoch, all test samples, eval mode");
  ASSERT_FALSE(acc.is_null()) << te.dump();
  EXPECT_EQ(acc["x"], nlohmann::json(epoch_ends));
  for (size_t i = 0; i < epoch_acc.size(); ++i) EXPECT_NEAR(acc["y"][i].get<double>(), epoch_acc[i], 1e-6);
  const auto loss = te.series("te_loss", "end of epoch, eval mode");
  ASSERT_FALSE(loss.is_null()) << "test loss is drawn, not \"no data yet\"";
  EXPECT_EQ(loss["x"], nlohmann::json(epoch_ends));
  for (const auto& chart : te.find("chart", "")) EXPECT_FALSE(chart["empty"].get<bool>()) << chart.dump();
  const auto end_train = te.series("te_acc", "end of run, train mode");
  ASSERT_FALSE(end_train.is_null());
  EXPECT_EQ(end_train["x"], nlohmann::json({20.0}));
  EXPECT_NEAR(end_train["y"][0].get<double>(), summary["test_train_mode"]["accuracy"].get<double>(), 1e-6);
  EXPECT_TRUE(te.series("te_acc", "eval mode (running stats)").is_null()) << "no periodic curve to draw";
  EXPECT_EQ(te.find("text", "Without --eval-every this run was tested only where each epoch ended", "Views").size(), 1u)
      << te.dump();

  const Drawn bn = load_drawn(d.file("open-batchnorm.png"));
  const auto running = bn.series("bn_main_run", "rank 1");  // running_mean over the recorded iterations
  ASSERT_FALSE(running.is_null()) << bn.dump();
  EXPECT_GE(running["n"].get<int>(), 10) << "every iteration of epoch 1 is recorded (--record-bn auto)";
  EXPECT_TRUE(bn.find("button", "Compare").empty()) << "no twin run can start beside a finished one";

  // live, the same settings: the buttons are there, and the Train vs eval view follows the same rule
  // (the app's own default is --eval-every 50: turned off here as the run had it)
  const auto live = run_gui(flags + " --eval-every 0 --steps 20 --view layout,traineval --screenshot-items --screenshot " +
                            d.file("live.png"), d.file("config"));
  ASSERT_EQ(live.exit_code, 0) << live.out;
  const Drawn live_layout = load_drawn(d.file("live-layout.png"));
  EXPECT_EQ(live_layout.find("button", "Pause", "Controls").size(), 1u) << live_layout.dump();
  EXPECT_EQ(live_layout.find("slider", "speed", "Controls").size(), 1u);
  EXPECT_TRUE(live_layout.find("heading", "finished run, opened from").empty());
  const Drawn live_te = load_drawn(d.file("live-traineval.png"));
  const auto live_acc = live_te.series("te_acc", "end of epoch, all test samples, eval mode");
  ASSERT_FALSE(live_acc.is_null()) << live_te.dump();
  EXPECT_EQ(live_acc["x"], nlohmann::json(epoch_ends));
  EXPECT_EQ(live_te.find("text", "Without --eval-every this run is tested only where each epoch ended", "Views").size(), 1u)
      << live_te.dump();

  const auto lonely = testutil::run_cli("gui --screenshot-items");
  EXPECT_EQ(lonely.exit_code, lab::kExitUsage) << lonely.out;
  EXPECT_TRUE(contains(lonely.out, "--screenshot-items goes with --screenshot")) << lonely.out;
}

TEST(Gui, CorruptLayoutFileIsIgnoredWithAWarning) {
  DTLAB_REQUIRE_GUI();
  testutil::TempDir d;
  std::filesystem::create_directories(d.file("config/dtlab"));
  std::ofstream(d.file("config/dtlab/layout.ini")) << "this is not a layout\n\x01\x02";
  const auto r = run_gui("--data-dir " + d.file("nowhere") + " --exit-after 1.5", d.file("config"));
  EXPECT_EQ(r.exit_code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "ignoring the window layout file")) << r.out;
  std::string saved;
  ASSERT_TRUE(viz::read_text_file(d.file("config/dtlab/layout.ini"), saved));
  EXPECT_EQ(viz::check_layout_ini(saved), "") << "replaced by a valid layout:\n" << saved;
  EXPECT_TRUE(contains(saved, "[Window][Views]")) << saved;
}

TEST(Gui, PartialRedrawsEqualFullOnes) {
  DTLAB_REQUIRE_GUI();
  DTLAB_REQUIRE_DATASET();
  testutil::TempDir d;
  // Every partial frame is compared with a full redraw: in slow motion (the newest collective as
  // it happens), and at full speed with eight ranks (a finished collective replayed, curves and
  // the timeline moving every frame).
  for (const std::string flags : {"--world-size 4 --delay-ms 20", "--world-size 8"}) {
    const auto r = testutil::run_cli_with_prefix(
        "DTLAB_VERIFY_REDRAW=1 XDG_CONFIG_HOME=" + d.file("config") + " xvfb-run -a -s \"-screen 0 1600x1000x24\"",
        "gui " + flags + " --limit-train 4000 --limit-test 200 --eval-every 5 --eval-samples 100 --exit-after 4 "
        "--frame-stats " + d.file("frames.json"));
    ASSERT_EQ(r.exit_code, 0) << r.out;
    EXPECT_FALSE(contains(r.out, "partial redraw differs")) << flags << "\n" << r.out;
    const auto j = nlohmann::json::parse(testutil::read_file(d.file("frames.json")));
    EXPECT_GT(j["all_frames"].get<int>(), 2) << flags;
    if (j["partial_redraw"].get<bool>()) {
      EXPECT_LT(j["drawn_fraction_mean"].get<double>(), 1.0) << flags;
    }
  }
}

// Real key presses (xdotool) reach the shortcuts: Space pauses, S saves a screenshot.
TEST(Gui, KeysPauseAndTakeAScreenshot) {
  DTLAB_REQUIRE_GUI();
  DTLAB_REQUIRE_DATASET();
  if (std::system("command -v xdotool > /dev/null 2>&1") != 0) GTEST_SKIP() << "xdotool is not installed";
  testutil::TempDir d;
  const std::string gui = std::string(DTLAB_BINARY) + " gui --limit-test 200 --epochs 20 --exit-after 7 --frame-stats " +
                          d.file("frames.json");
  const std::string script = "cd " + d.path() + " && (" + gui + " & sleep 4; xdotool key space; sleep 1; xdotool key s; wait)";
  const auto r = testutil::run_shell("XDG_CONFIG_HOME=" + d.file("config") +
                                     " xvfb-run -a -s \"-screen 0 1600x1000x24\" sh -c '" + script + "'");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const auto j = nlohmann::json::parse(testutil::read_file(d.file("frames.json")));
  EXPECT_EQ(j["run_phase"].get<std::string>(), "paused") << "Space pauses the run";
  bool shot = false;
  for (const auto& e : std::filesystem::directory_iterator(d.path()))
    shot = shot || e.path().filename().string().rfind("dtlab-", 0) == 0;
  EXPECT_TRUE(shot) << "S saves dtlab-<time>.png in the current directory";
}

// Lessons in the window: the question with Run locked, the observed moment (two runs side by
// side, paused), the results with the record written under the user's data directory; the three
// screenshots differ. (The gating itself is tested without a display: test_lesson_driver.cpp.)
TEST(GuiLessons, QuestionObservedMomentAndResults) {
  DTLAB_REQUIRE_GUI();
  DTLAB_REQUIRE_DATASET();
  testutil::TempDir d;
  const std::string env = lesson_env(d);
  const std::vector<std::pair<std::string, std::string>> stages = {
      {"question", "--lesson bn-ddp"},
      {"observe", "--lesson bn-ddp --answers whose_batch=b,sync_equals_global=a --lesson-stage observe"},
      {"results", "--lesson bn-ddp --answers whose_batch=b,sync_equals_global=a"}};
  std::vector<Png> shots;
  for (const auto& [name, flags] : stages) {
    const auto r = testutil::run_cli_with_prefix(env, "gui " + flags + " --screenshot " + d.file(name + ".png"));
    ASSERT_EQ(r.exit_code, 0) << name << "\n" << r.out;
    EXPECT_FALSE(contains(r.out, "error")) << name << "\n" << r.out;
    shots.push_back(load_png(d.file(name + ".png")));
    EXPECT_GT(shots.back().variance, 100.0) << name;
  }
  for (size_t i = 0; i < shots.size(); ++i)
    for (size_t j = i + 1; j < shots.size(); ++j) EXPECT_GT(differing(shots[i], shots[j]), 0.02) << i << " and " << j;
  // the results run left a record (the question and observe runs ended before any part finished)
  int records = 0;
  for (const auto& e : std::filesystem::directory_iterator(d.file("data/dtlab/lessons/records"))) {
    const auto j = nlohmann::json::parse(testutil::read_file(e.path().string()));
    EXPECT_EQ(j["lesson"]["id"], "bn-ddp");
    EXPECT_EQ(j["front_end"], "app");
    EXPECT_TRUE(j["passed"].get<bool>());
    EXPECT_EQ(j["parts"][0]["predictions"][0]["answer"], "b");
    ++records;
  }
  EXPECT_EQ(records, 1);
  EXPECT_FALSE(std::filesystem::exists(d.file("config/dtlab/layout.ini")));
}

// A lesson's prepared runs replay in the window from their run directories: the observed moment
// shows the two runs side by side at the observed iteration, through the views' own navigation
// (there is no run to pause or step, and none is offered).
TEST(GuiLessons, PreparedRunsReplayAtTheObservedIteration) {
  DTLAB_REQUIRE_GUI();
  DTLAB_REQUIRE_DATASET();
  testutil::TempDir d;
  const auto prep = testutil::run_cli("lesson prepare bn-ddp --out " + d.file("prepared"));
  ASSERT_EQ(prep.exit_code, 0) << prep.out;
  const std::string env = lesson_env(d);
  const auto r = testutil::run_cli_with_prefix(
      env, "gui --lesson bn-ddp --prepared " + d.file("prepared") + " --answers whose_batch=b,sync_equals_global=a "
           "--lesson-stage observe --screenshot-items --screenshot " + d.file("observe.png"));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_FALSE(contains(r.out, "error")) << r.out;
  const Drawn o = load_drawn(d.file("observe.png"));
  const auto bar = o.find("value", "run", "Menu");
  ASSERT_EQ(bar.size(), 1u) << o.dump();
  EXPECT_TRUE(contains(bar[0]["value"], "finished run, from its run directory")) << bar[0].dump();
  EXPECT_EQ(o.find("heading", "bn=local", "Views").size(), 1u) << o.dump();
  EXPECT_EQ(o.find("heading", "bn=sync", "Views").size(), 1u) << o.dump();
  // the observation's iteration (step = 0), not the runs' last: the BatchNorm view was moved there
  const auto it = o.find("value", "iteration", "Views");
  ASSERT_FALSE(it.empty()) << o.dump();
  for (const auto& v : it) EXPECT_EQ(v["value"], "0") << o.dump();
  for (const char* b : kRunMovers) EXPECT_TRUE(o.find("button", b, "Controls").empty()) << b;
}

// The Allreduce view of prepared runs goes to the observed iteration's gradient allreduce, at the
// observed ring step: why-ring's first observation (iteration 1, 3 ring steps of 4 ranks). The
// runs open after the observation chose them, and the view still shows it (before, it showed no
// collective at all: "This run directory's trace holds none of the collectives chosen here").
TEST(GuiLessons, PreparedRunsShowTheObservedCollectiveAndRingStep) {
  DTLAB_REQUIRE_GUI();
  DTLAB_REQUIRE_DATASET();
  testutil::TempDir d;
  const auto prep = testutil::run_cli("lesson prepare why-ring --out " + d.file("prepared"));
  ASSERT_EQ(prep.exit_code, 0) << prep.out;
  const std::string env = lesson_env(d);
  const auto r = testutil::run_cli_with_prefix(
      env, "gui --lesson why-ring --prepared " + d.file("prepared") +
               " --answers auto --lesson-stage observe --screenshot-items --screenshot " + d.file("observe.png"));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const Drawn o = load_drawn(d.file("observe.png"));
  const auto which = o.find("value", "collective", "Views");
  ASSERT_EQ(which.size(), 1u) << o.dump();
  EXPECT_EQ(which[0]["value"], "grad bucket 0, iteration 1, ring") << o.dump();
  const auto step = o.find("value", "step", "Views");
  ASSERT_EQ(step.size(), 1u) << o.dump();
  EXPECT_TRUE(contains(step[0]["value"], "reduce-scatter step 3 of 3  (step 3 of 6 overall)")) << step[0].dump();
  EXPECT_TRUE(o.find("text", "This run directory's trace holds none of the collectives chosen here.", "Views").empty())
      << o.dump();
}

// The busbw of the Scale view's series `label` ("scale: busbw by GPUs ring": 1 to 512 nodes), bytes/s.
std::vector<double> scale_busbw(const Drawn& g, const std::string& label) {
  std::vector<double> out;
  const auto it = g.find("value", label, "Views");
  if (it.empty()) return out;
  const std::string v = it[0]["value"];
  for (size_t at = 0; at < v.size();) {
    size_t used = 0;
    out.push_back(v.compare(at, 1, "-") == 0 ? -1 : std::stod(v.substr(at), &used));
    at += used ? used : 2;
  }
  return out;
}

// The one value item `label` of the Views window ("" when not drawn once).
std::string views_value(const Drawn& g, const std::string& label) {
  const auto it = g.find("value", label, "Views");
  return it.size() == 1 ? it[0]["value"].get<std::string>() : "";
}

// A lesson's simulate run observed in the app, through the Lessons panel's path (the runs run, the
// observation opens the run's directory): the Scale view comes to the front set up from the run
// (fsdp-at-scale's all-gather: dgx-h100, allgather, ll128, ring) at the observation's node count and
// size (128 nodes, 16 MiB), and its busbw at 16 and 1,024 GPUs is the run's own points'. Prepared
// ahead (ring-or-tree), the observation's 2 nodes show the ring / tree crossover at the size the
// run's points put it.
TEST(GuiLessons, ASimulateRunsObservationSetsUpTheScaleView) {
  DTLAB_REQUIRE_GUI();
  testutil::TempDir d;
  const std::string env = lesson_env(d);
  const auto r = testutil::run_cli_with_prefix(
      env, "gui --lesson fsdp-at-scale --answers auto --lesson-stage observe --screenshot-items --screenshot " +
               d.file("gather.png"));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_FALSE(contains(r.out, "error")) << r.out;
  const Drawn g = load_drawn(d.file("gather.png"));
  EXPECT_EQ(views_value(g, "scale: settings"), "dgx-h100 allgather ll128 128 nodes 16777216 bytes") << g.dump();
  EXPECT_EQ(views_value(g, "scale: algorithms"), "ring");
  EXPECT_EQ(views_value(g, "scale: split"), "ring");
  EXPECT_EQ(views_value(g, "scale: channels"), "0");
  EXPECT_EQ(views_value(g, "scale: missing"), "0");
  EXPECT_TRUE(contains(views_value(g, "scale: from"), "From the simulate run gather: allgather as ring on dgx-h100"))
      << views_value(g, "scale: from");
  // the run's points (its directory in this learner's session) are the view's
  std::string result;
  for (const auto& e : std::filesystem::directory_iterator(d.file("data/dtlab/lessons/runs")))
    if (std::filesystem::exists(e.path() / "gather" / "result.json")) result = (e.path() / "gather" / "result.json").string();
  ASSERT_FALSE(result.empty());
  const auto j = nlohmann::json::parse(testutil::read_file(result));
  const std::vector<double> ring = scale_busbw(g, "scale: busbw by GPUs ring");
  ASSERT_EQ(ring.size(), 10u) << g.dump();
  int matched = 0;
  for (const auto& p : j["points"]) {
    const int nodes = p["nodes"];
    if (nodes != 2 && nodes != 128) continue;
    const double want = p["busbw_GBps"].get<double>() * 1e9;
    EXPECT_NEAR(ring[static_cast<size_t>(std::log2(nodes))], want, want * 1e-6) << nodes << " nodes";
    ++matched;
  }
  EXPECT_EQ(matched, 2);

  const auto prep = testutil::run_cli("lesson prepare ring-or-tree --out " + d.file("prepared"));
  ASSERT_EQ(prep.exit_code, 0) << prep.out;
  const auto t = testutil::run_cli_with_prefix(
      env, "gui --lesson ring-or-tree --prepared " + d.file("prepared") +
               " --answers auto --lesson-stage observe --screenshot-items --screenshot " + d.file("tree.png"));
  ASSERT_EQ(t.exit_code, 0) << t.out;
  EXPECT_FALSE(contains(t.out, "error")) << t.out;
  const Drawn o = load_drawn(d.file("tree.png"));
  // nodes = 2; no size: of the run's 1 KiB .. 8 GiB, the view's 16 MiB
  EXPECT_EQ(views_value(o, "scale: settings"), "dgx-h100 allreduce simple 2 nodes 16777216 bytes") << o.dump();
  EXPECT_EQ(views_value(o, "scale: algorithms"), "ring,dbtree");
  uint64_t first_ring_2 = 0;  // the lesson's quantity: the smallest size where the ring is the faster, 2 nodes
  const auto sweep = nlohmann::json::parse(testutil::read_file(d.file("prepared/sweep/result.json")));
  for (const auto& p : sweep["points"])
    if (p["algorithm"] == "ring" && p["nodes"] == 2 && p["fastest"] == true && (first_ring_2 == 0 || p["bytes"] < first_ring_2))
      first_ring_2 = p["bytes"];
  EXPECT_EQ(first_ring_2, uint64_t{32} << 20);
  EXPECT_EQ(views_value(o, "scale: crossover"), std::to_string(first_ring_2));
}

// A simulate result opened from the command line: the Scale view fills the window, set up from it;
// a topology of the run's own (a file, 4 GPUs per node) and its channels are the view's.
TEST(Gui, OpensASimulateResultInTheScaleView) {
  DTLAB_REQUIRE_GUI();
  testutil::TempDir d;
  testutil::write_file(d.file("cluster.toml"), "name = \"my-cluster\"\ngpus_per_node = 8\n[intra]\nkind = \"pcie\"\n"
                                               "GBps = 24\nlatency_us = 1\n[network]\nnics_per_node = 2\nnic_Gbps = 100\n"
                                               "latency_us = 5\n");
  std::filesystem::create_directories(d.file("sim"));
  const auto sim = testutil::run_cli("simulate --topology " + d.file("cluster.toml") + " --gpus-per-node 4 --channels 2 "
                                     "--nodes 1,2,4,...,64 --algorithm ring,rhd --sizes 1M --json " + d.file("sim/result.json"));
  ASSERT_EQ(sim.exit_code, 0) << sim.out;
  const auto r = run_gui("--open " + d.file("sim") + " --screenshot-items --screenshot " + d.file("s.png"), d.file("config"));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const Drawn g = load_drawn(d.file("s.png"));
  EXPECT_EQ(views_value(g, "scale: settings"), "my-cluster allreduce simple 64 nodes 1048576 bytes") << g.dump();
  EXPECT_EQ(views_value(g, "scale: channels"), "2");
  EXPECT_EQ(views_value(g, "scale: algorithms"), "ring,rhd");
  EXPECT_TRUE(contains(views_value(g, "scale: topology"), "64 nodes x 4 GPUs")) << views_value(g, "scale: topology");
  const auto j = nlohmann::json::parse(testutil::read_file(d.file("sim/result.json")));
  const std::vector<double> ring = scale_busbw(g, "scale: busbw by GPUs ring");
  ASSERT_EQ(ring.size(), 10u) << g.dump();
  for (const auto& p : j["points"])
    if (p["algorithm"] == "ring") {
      const double want = p["busbw_GBps"].get<double>() * 1e9;
      EXPECT_NEAR(ring[static_cast<size_t>(std::log2(p["nodes"].get<int>()))], want, want * 1e-6) << p.dump();
    }
}

// A malformed lesson never takes the app down: it is shown with its error (file:line:col) next to
// the list of lessons, where it is listed as unusable, and the window keeps working.
TEST(GuiLessons, MalformedLessonIsShownWithItsError) {
  DTLAB_REQUIRE_GUI();
  testutil::TempDir d;
  std::filesystem::create_directories(d.file("lessons"));
  std::ofstream(d.file("lessons/broken.toml")) << "format_version = 1\nid = \"broken\"\ncolour = 3\n[question\n";
  const std::string env = "DTLAB_LESSONS=" + d.file("lessons") + " XDG_DATA_HOME=" + d.file("data") +
                          " XDG_CONFIG_HOME=" + d.file("config") + " xvfb-run -a -s \"-screen 0 1600x1000x24\"";
  const auto r = testutil::run_cli_with_prefix(env, "gui --lesson broken --screenshot " + d.file("broken.png"));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "cannot open lesson broken")) << r.out;
  EXPECT_TRUE(contains(r.out, d.file("lessons/broken.toml") + ":4:")) << r.out;
  EXPECT_GT(load_png(d.file("broken.png")).variance, 100.0);
  const auto missing = testutil::run_cli_with_prefix(env, "gui --lesson nothing-like-it --screenshot " + d.file("m.png"));
  ASSERT_EQ(missing.exit_code, 0) << missing.out;
  EXPECT_TRUE(contains(missing.out, "no lesson 'nothing-like-it'")) << missing.out;
}

// The Benchmark view: a bench chain result (its directory, as a lesson's run leaves it) and a
// bench train sweep with the per-sample comparison (the .json file itself) open full window;
// the screenshots are not blank and differ, also from the view with nothing open. A damaged result
// is refused before any window, naming the field (exit 4).
TEST(GuiBench, OpensAChainAndASweepResult) {
  DTLAB_REQUIRE_GUI();
  testutil::TempDir d;
  std::filesystem::create_directories(d.file("chain"));
  const auto chain = testutil::run_cli("bench chain --dims 8,256,256,256,8 --threads 1,2 --seconds 0.005 --rounds 1 "
                                       "--json " + d.file("chain/result.json"));
  ASSERT_EQ(chain.exit_code, 0) << chain.out;
  const auto sweep = testutil::run_cli("bench train --model mlp --batch-sizes 2,8,32,128 --per-sample --seconds 0.005 "
                                       "--rounds 1 --json " + d.file("sweep.json"));
  ASSERT_EQ(sweep.exit_code, 0) << sweep.out;
  std::vector<Png> shots;
  for (const auto& [name, args] : std::vector<std::pair<std::string, std::string>>{
           {"chain", "--open " + d.file("chain")},
           {"sweep", "--open " + d.file("sweep.json")},
           {"none", "--data-dir " + d.file("nowhere") + " --view bench"}}) {
    const auto r = run_gui(args + " --screenshot " + d.file(name + ".png"), d.file("config"));
    ASSERT_EQ(r.exit_code, 0) << name << "\n" << r.out;
    EXPECT_TRUE(contains(r.out, "screenshot: " + d.file(name + ".png"))) << r.out;
    Png p = load_png(d.file(name + ".png"));
    EXPECT_EQ(p.w, 1600) << name;
    EXPECT_EQ(p.h, 1000) << name;
    // the view with nothing open is a paragraph of text on the background
    EXPECT_GT(p.variance, name == "none" ? 1.0 : 100.0) << name << " looks blank";
    shots.push_back(std::move(p));
  }
  EXPECT_GT(differing(shots[0], shots[1]), 0.02) << "the chain and the sweep look the same";
  EXPECT_GT(differing(shots[0], shots[2]), 0.02) << "the chain looks like the empty view";
  EXPECT_GT(differing(shots[1], shots[2]), 0.02) << "the sweep looks like the empty view";

  std::string text = testutil::read_file(d.file("chain/result.json"));
  text.replace(text.find("\"orders\""), 8, "\"ordres\"");
  testutil::write_file(d.file("bad.json"), text);
  const auto bad = run_gui("--open " + d.file("bad.json") + " --screenshot " + d.file("bad.png"), d.file("config"));
  EXPECT_EQ(bad.exit_code, lab::kExitIo) << bad.out;
  EXPECT_TRUE(contains(bad.out, d.file("bad.json") + ": /orders: missing")) << bad.out;
  EXPECT_FALSE(std::filesystem::exists(d.file("bad.png")));
}
