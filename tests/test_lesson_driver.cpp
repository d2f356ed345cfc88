// The app's lesson driver without a display: a lesson taken end to end over real run hosts, as the
// Lessons panel takes it (Run locked until the predictions are committed, the observed moment
// staged with the twin run beside it, results and record), and replayed from prepared runs.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <optional>
#include <thread>

#include "catalog.h"
#include "lesson_driver.h"
#include "run_host.h"
#include "scale_data.h"
#include "test_util.h"

namespace {

using namespace viz;

// LabHooks over two RunHosts, as the app has them (without views).
class HostLab : public LabHooks {
 public:
  void start_live(const lab::RunConfig& cfg, const lab::RunConfig* twin, bool paused) override {
    host = std::make_unique<RunHost>(cfg, paused);
    data.reset_live(cfg);
    twin_host.reset();
    twin_data = RunData();
    if (twin) {
      twin_host = std::make_unique<RunHost>(*twin, paused);
      twin_data.reset_live(*twin);
    }
    ++started;
  }
  const RunData* live(int which) const override {
    if (which == 0) return host ? &data : nullptr;
    return twin_host ? &twin_data : nullptr;
  }
  void stage(int64_t iteration, int ring_step) override {
    for (RunHost* h : {host.get(), twin_host.get()})
      if (h) ring_step >= 0 ? h->run_into_allreduce(iteration, ring_step) : h->run_to_step(iteration);
  }
  void resume() override {
    for (RunHost* h : {host.get(), twin_host.get()})
      if (h) h->resume();
  }
  std::string open_dirs(const std::string& dir, const std::string& twin_dir) override {
    host.reset();
    twin_host.reset();
    data = load_run_dir(dir);
    twin_data = twin_dir.empty() ? RunData() : load_run_dir(twin_dir);
    ++opened;
    return "";
  }
  void show(const lessons::Observe& o) override { shown.push_back(o.view); }
  void pump() {
    if (host) data.update_from(*host);
    if (twin_host) twin_data.update_from(*twin_host);
  }

  std::unique_ptr<RunHost> host, twin_host;
  RunData data, twin_data;
  int started = 0, opened = 0;
  std::vector<std::string> shown;
};

// Updates until the driver reaches `want` (or 120 s pass).
bool wait_for(LessonDriver& d, HostLab& lab, LessonStage want) {
  const auto t0 = std::chrono::steady_clock::now();
  while (d.stage() != want) {
    if (std::chrono::steady_clock::now() - t0 > std::chrono::seconds(120)) return false;
    if (!d.error().empty()) return false;
    lab.pump();
    d.update(lab);
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

std::string shipped(const std::string& id) {
  return (std::filesystem::path(DTLAB_FIXTURES_DIR).parent_path().parent_path() / "lessons" / (id + ".toml")).string();
}

TEST(LessonDriver, PredictThenRunObserveTheTwinsAndRecord) {
  DTLAB_REQUIRE_DATASET();
  testutil::TempDir dir;
  LessonDriver d(lessons::load_lesson(shipped("bn-ddp")), dir.file("session"), "", dir.file("records/r.json"));
  HostLab lab;
  EXPECT_EQ(d.stage(), LessonStage::Question);
  EXPECT_FALSE(d.can_run());
  EXPECT_FALSE(d.run());  // Run stays disabled until every prediction is committed
  d.session().answer("whose_batch", "b", 4, "DDP is one big batch");
  EXPECT_FALSE(d.can_run());
  d.session().answer("sync_equals_global", "a", 2);
  EXPECT_TRUE(d.can_run());
  ASSERT_TRUE(d.run());

  // the first observation: local and sync BatchNorm as twins, paused after iteration 0
  ASSERT_TRUE(wait_for(d, lab, LessonStage::Observing)) << d.error();
  ASSERT_NE(d.observing(), nullptr);
  EXPECT_EQ(d.observing()->view, "batchnorm");
  ASSERT_NE(lab.twin_host, nullptr);
  EXPECT_EQ(lab.data.cfg.bn, "local");
  EXPECT_EQ(lab.twin_data.cfg.bn, "sync");
  // every rank of both runs has finished iteration 0 and waits before iteration 1
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  lab.pump();
  EXPECT_EQ(lab.data.steps_done(), 1);
  EXPECT_EQ(lab.twin_data.steps_done(), 1);
  EXPECT_EQ(lab.data.phase, RunPhase::Paused);
  EXPECT_NE(d.observing_text().find("Left, ordinary BatchNorm"), std::string::npos);

  d.continue_after_observe(lab);
  ASSERT_TRUE(wait_for(d, lab, LessonStage::Results)) << d.error();
  EXPECT_EQ(lab.started, 2);  // local + sync together, then global
  const lessons::PartResult* r = d.result();
  ASSERT_NE(r, nullptr);
  for (const lessons::CheckResult& c : r->checks) EXPECT_TRUE(c.passed) << c.id << ": " << c.error;
  ASSERT_EQ(r->predictions.size(), 2u);
  EXPECT_FALSE(r->predictions[0].correct);  // b: the global batch
  EXPECT_TRUE(r->predictions[1].correct);
  EXPECT_FALSE(r->hints.empty());
  ASSERT_TRUE(std::filesystem::exists(dir.file("records/r.json")));
  const nlohmann::json rec = nlohmann::json::parse(testutil::read_file(dir.file("records/r.json")));
  EXPECT_EQ(rec["front_end"], "app");
  EXPECT_EQ(rec["parts"][0]["predictions"][0]["why"], "DDP is one big batch");

  // the variation: its own prediction, then its run
  ASSERT_TRUE(d.has_next_part());
  d.next_part();
  EXPECT_EQ(d.stage(), LessonStage::Question);
  EXPECT_FALSE(d.can_run());
  d.session().answer("after_last_step", "b");
  EXPECT_FALSE(d.can_run());  // both of the variation's predictions first
  d.session().answer("eval_without_broadcast", "b");
  ASSERT_TRUE(d.run());
  ASSERT_TRUE(wait_for(d, lab, LessonStage::Results)) << d.error();
  EXPECT_TRUE(d.result()->passed());
  EXPECT_FALSE(d.has_next_part());
}

TEST(LessonDriver, PreparedRunsAreReplayedFromTheirDirectories) {
  DTLAB_REQUIRE_DATASET();
  testutil::TempDir dir;
  const auto p = testutil::run_cli("lesson prepare " + shipped("bn-ddp") + " --out " + dir.file("prepared"));
  ASSERT_EQ(p.exit_code, 0) << p.out;
  LessonDriver d(lessons::load_lesson(shipped("bn-ddp")), dir.file("session"), dir.file("prepared"), "");
  HostLab lab;
  d.session().set_auto_answers(true);
  ASSERT_TRUE(d.run());
  ASSERT_TRUE(wait_for(d, lab, LessonStage::Observing)) << d.error();
  EXPECT_EQ(lab.started, 0);  // nothing trains
  EXPECT_EQ(lab.data.cfg.bn, "local");
  EXPECT_EQ(lab.twin_data.cfg.bn, "sync");
  d.continue_after_observe(lab);
  ASSERT_TRUE(wait_for(d, lab, LessonStage::Results)) << d.error();
  EXPECT_TRUE(d.result()->passed());
  for (const lessons::RunSpec& r : d.part().runs) EXPECT_TRUE(d.session().outcome(r.name)->prepared);
}

// ---- a simulate run (no dataset needed) ----

const char* kSimLesson = R"TOML(format_version = 1
id = "sim"
version = 1
title = "The ring at scale"
minutes = 5
budget_s = 5

[question]
text = "Does the ring allreduce's busbw hold from 16 to 1,024 GPUs?"

[[predict]]
id = "holds"
kind = "choice"
prompt = "At 1,024 GPUs, does the ring keep its busbw?"

[[predict.choices]]
key = "a"
text = "Yes"
correct_if = "bw_1024 >= 0.8 * bw_16"

[[predict.choices]]
key = "b"
text = "No"
correct_if = "bw_1024 < 0.8 * bw_16"

[runs.sweep]
command = "simulate"
args = "--topology dgx-h100 --nodes 2,128 --collective allreduce --algorithm ring --sizes 16M"

[quantities]
bw_16 = { run = "sweep", result = "/points", where = { ranks = 16 }, field = "busbw_GBps", unit = "GB/s" }
bw_1024 = { run = "sweep", result = "/points", where = { ranks = 1024 }, field = "busbw_GBps", unit = "GB/s" }

[[observe]]
run = "sweep"
view = "scale"
nodes = 128
say = "{bw_16:.0f} GB/s at 16 GPUs, {bw_1024:.2f} GB/s at 1,024 GPUs"

[[check]]
id = "collapses"
that = "bw_1024 < 0.05 * bw_16"
why = "the ring's 2(N-1) steps of latency"

[[hint]]
text = "Count the ring's steps."

[explain]
text = "{bw_16:.0f} to {bw_1024:.2f} GB/s"
)TOML";

// The app's lab without views: a simulate run's directory holds result.json, not a training run; it
// is read as the app reads it, and its observation sets up the scale view as the app's does
// (viz/app.cpp: open_dirs, then show).
class SimLab : public HostLab {
 public:
  std::string open_dirs(const std::string& dir, const std::string& twin_dir) override {
    opened_dirs.push_back(dir);
    EXPECT_TRUE(twin_dir.empty());
    EXPECT_TRUE(looks_like_simulate_result(dir)) << dir;
    run = load_simulate_result(dir);
    ++opened;
    return "";
  }
  void show(const lessons::Observe& o) override {
    HostLab::show(o);
    if (o.view == "scale" && run) setups.push_back(scale_setup(*run, static_cast<int>(std::max<int64_t>(o.nodes, 0)), o.bytes));
  }
  std::vector<std::string> opened_dirs;
  std::optional<SimulateRun> run;
  std::vector<ScaleSetup> setups;
};

// A simulate run in the app: run on the driver's worker thread as a bench is, observed in the
// scale view from its directory, its quantities read from the points and its checks judged.
TEST(LessonDriver, ASimulateRunIsObservedInTheScaleView) {
  testutil::TempDir dir;
  testutil::write_file(dir.file("sim.toml"), kSimLesson);
  LessonDriver d(lessons::load_lesson(dir.file("sim.toml")), dir.file("session"), "", dir.file("records/r.json"));
  SimLab lab;
  EXPECT_FALSE(d.run());  // the prediction first
  d.session().answer("holds", "a", 3);
  ASSERT_TRUE(d.run());
  ASSERT_TRUE(wait_for(d, lab, LessonStage::Observing)) << d.error();
  ASSERT_NE(d.observing(), nullptr);
  EXPECT_EQ(d.observing()->view, "scale");
  ASSERT_EQ(lab.shown, std::vector<std::string>{"scale"});
  ASSERT_EQ(lab.opened_dirs.size(), 1u);
  EXPECT_TRUE(std::filesystem::exists(lab.opened_dirs[0] + "/result.json"));
  EXPECT_EQ(lab.started, 0);  // nothing trains
  EXPECT_NE(d.observing_text().find("GB/s at 1,024 GPUs"), std::string::npos) << d.observing_text();
  // the view as the run and the observation say: 128 nodes (1,024 GPUs), the run's one size
  ASSERT_EQ(lab.setups.size(), 1u);
  const ScaleSettings& s = lab.setups[0].settings;
  EXPECT_EQ(s.preset, "dgx-h100");
  EXPECT_EQ(s.collective, lab::SimCollective::Allreduce);
  EXPECT_EQ(s.protocol, lab::SimProtocol::Simple);
  EXPECT_EQ(s.nodes, 128);
  EXPECT_EQ(s.bytes, uint64_t{16} << 20);
  EXPECT_EQ(lab.setups[0].algorithms, std::vector<lab::SimAlgorithm>{lab::SimAlgorithm::Ring});
  d.continue_after_observe(lab);
  ASSERT_TRUE(wait_for(d, lab, LessonStage::Results)) << d.error();
  const lessons::PartResult* r = d.result();
  ASSERT_NE(r, nullptr);
  for (const lessons::CheckResult& c : r->checks) EXPECT_TRUE(c.passed) << c.id << ": " << c.error;
  ASSERT_EQ(r->predictions.size(), 1u);
  EXPECT_FALSE(r->predictions[0].correct);  // it does not hold
  EXPECT_EQ(r->predictions[0].truth(), "b");
  EXPECT_NE(r->explanation.find(" GB/s"), std::string::npos);
  ASSERT_TRUE(std::filesystem::exists(dir.file("records/r.json")));
}

// Prepared ahead of class, the simulation is replayed from its folder as a bench run is.
TEST(LessonDriver, APreparedSimulateRunIsReplayed) {
  testutil::TempDir dir;
  testutil::write_file(dir.file("sim.toml"), kSimLesson);
  const auto p = testutil::run_cli("lesson prepare " + dir.file("sim.toml") + " --out " + dir.file("prepared"));
  ASSERT_EQ(p.exit_code, 0) << p.out;
  LessonDriver d(lessons::load_lesson(dir.file("sim.toml")), dir.file("session"), dir.file("prepared"), "");
  SimLab lab;
  d.session().set_auto_answers(true);
  ASSERT_TRUE(d.run());
  ASSERT_TRUE(wait_for(d, lab, LessonStage::Observing)) << d.error();
  ASSERT_FALSE(lab.setups.empty());
  EXPECT_EQ(lab.setups[0].settings.nodes, 128);
  EXPECT_EQ(lab.setups[0].source, dir.file("prepared/sweep"));
  d.continue_after_observe(lab);
  ASSERT_TRUE(wait_for(d, lab, LessonStage::Results)) << d.error();
  EXPECT_TRUE(d.result()->passed());
  EXPECT_TRUE(d.session().outcome("sweep")->prepared);
}

}  // namespace
