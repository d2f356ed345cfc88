// What the lab window needs from the Run: gates it can stop anywhere (run_until), slow motion,
// per-rank iteration positions, every step's record in order (the step sink), and periodic
// evaluations in both BatchNorm modes that leave training untouched.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <thread>

#include "backends.h"
#include "run.h"
#include "test_util.h"

namespace {

lab::RunConfig tiny(int world) {
  lab::RunConfig c;
  c.model = "mlp";
  c.world_size = world;
  c.batch_size = 16;
  c.limit_train = 320;
  c.limit_test = 64;
  c.steps = 8;
  c.epochs = 0;  // --steps alone: as many epochs as it takes
  c.threads = 1;
  c.timeout_s = 20;
  return c;
}

template <class F>
bool wait_for(F&& ok, double seconds) {
  const auto t0 = std::chrono::steady_clock::now();
  while (!ok()) {
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > seconds) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

}  // namespace

TEST(RunControl, RunUntilStopsEveryRankAtTheChosenGate) {
  DTLAB_REQUIRE_DATASET();
  lab::Run run(tiny(3), lab::make_world);
  run.control().pause();
  run.start();
  // to the start of iteration 3
  run.control().run_until([](int, int64_t it, const lab::Event* next) { return next == nullptr && it >= 3; });
  ASSERT_TRUE(wait_for([&] {
    const auto it = run.control().iterations();
    return it[0] == 3 && it[1] == 3 && it[2] == 3;
  }, 30));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  run.poll();
  for (const lab::StepRecord& r : run.snapshot()->latest) EXPECT_EQ(r.step, 2) << "rank " << r.rank;
  // into iteration 3's gradient allreduce, stopping before its second ring step
  run.control().run_until([](int, int64_t, const lab::Event* next) {
    return next && std::strcmp(next->what, "grad bucket") == 0 && next->ring_step >= 1;
  });
  auto chunks = [&](int r) {
    std::vector<lab::Event> ev;
    run.events(r).copy_since(0, ev);
    int n = 0;
    for (const auto& e : ev) n += e.kind == lab::EventKind::Chunk && e.train_step == 3 && std::strcmp(e.what, "grad bucket") == 0;
    return n;
  };
  ASSERT_TRUE(wait_for([&] { return chunks(0) == 1 && chunks(1) == 1 && chunks(2) == 1; }, 30));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  for (int r = 0; r < 3; ++r) EXPECT_EQ(chunks(r), 1) << "one ring step done on rank " << r;
  run.control().resume();
  while (!run.poll()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(run.finish().steps, 8);
}

TEST(RunControl, DelaySlowsEveryGate) {
  DTLAB_REQUIRE_DATASET();
  auto c = tiny(2);
  c.steps = 2;
  c.epochs = 0;  // --steps alone: as many epochs as it takes
  lab::Run run(c, lab::make_world);
  run.control().set_delay(0.05);
  EXPECT_DOUBLE_EQ(run.control().delay(), 0.05);
  const auto t0 = std::chrono::steady_clock::now();
  run.start();
  while (!run.poll()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // per rank and iteration: an iteration gate, and with 2 ranks at least the gradient allreduce's
  // 2 ring steps and the buffer broadcast's hop: >= 2 x 4 gates x 50 ms
  EXPECT_GE(s, 0.4);
  run.finish();
}

TEST(RunControl, StepSinkGetsEveryRecordInStepRankOrder) {
  DTLAB_REQUIRE_DATASET();
  lab::Run run(tiny(3), lab::make_world);
  std::vector<lab::StepRecord> got;
  run.set_step_sink([&](const std::vector<lab::StepRecord>& recs) { got.insert(got.end(), recs.begin(), recs.end()); });
  run.run();
  ASSERT_EQ(got.size(), 8u * 3u);
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].step, static_cast<int64_t>(i / 3));
    EXPECT_EQ(got[i].rank, static_cast<int>(i % 3));
  }
}

// DataParallel's device 0 holds the module itself: it is evaluated as DDP's rank 0 is (the
// train vs eval view), and training does not notice.
TEST(RunControl, PeriodicEvaluationUnderDataParallel) {
  DTLAB_REQUIRE_DATASET();
  testutil::TempDir d1, d2;
  auto c = tiny(2);
  c.mode = "dp";
  c.batch_size = 32;  // the global batch: 16 per device
  c.out_dir = d1.path();
  lab::Run plain(c, lab::make_world);
  plain.run();
  c.out_dir = d2.path();
  c.eval_every = 4;
  c.eval_samples = 40;
  lab::Run evaluated(c, lab::make_world);
  evaluated.run();
  const auto& evals = evaluated.snapshot()->evals;
  ASSERT_EQ(evals.size(), 4u);  // after 1, 2, 4 and 8 iterations
  EXPECT_EQ(evals[3].steps, 8);
  EXPECT_EQ(evals[0].samples, 40);
  EXPECT_EQ(testutil::read_file(d1.file("final.safetensors")), testutil::read_file(d2.file("final.safetensors")));
}

TEST(RunControl, PeriodicEvaluationInBothModesLeavesTrainingAlone) {
  DTLAB_REQUIRE_DATASET();
  testutil::TempDir d1, d2;
  auto c = tiny(2);
  c.out_dir = d1.path();
  lab::Run plain(c, lab::make_world);
  plain.run();
  c.out_dir = d2.path();
  c.eval_every = 4;
  c.eval_samples = 40;
  lab::Run evaluated(c, lab::make_world);
  evaluated.run();
  const auto& evals = evaluated.snapshot()->evals;
  ASSERT_EQ(evals.size(), 4u);  // after 1, 2, 4 and 8 iterations
  EXPECT_EQ(evals[0].steps, 1);
  EXPECT_EQ(evals[2].steps, 4);
  EXPECT_EQ(evals[3].steps, 8);
  for (const auto& p : evals) {
    EXPECT_EQ(p.samples, 40);
    EXPECT_EQ(p.probe_eval.size(), 10u);
    EXPECT_EQ(p.probe_train.size(), 10u);
    float sum = 0;
    for (float v : p.probe_eval) sum += v;
    EXPECT_NEAR(sum, 1.0f, 1e-5f);
  }
  EXPECT_NE(evals[0].eval_mode.loss, evals[0].train_mode.loss) << "the two modes normalize differently";
  // training is untouched: the same final weights
  EXPECT_EQ(testutil::read_file(d1.file("final.safetensors")), testutil::read_file(d2.file("final.safetensors")));
  // and the run directory holds the evaluations
  const std::string m = testutil::read_file(d2.file("metrics.jsonl"));
  size_t lines = 0;
  for (size_t p = m.find("\"kind\":\"eval\""); p != std::string::npos; p = m.find("\"kind\":\"eval\"", p + 1)) ++lines;
  EXPECT_EQ(lines, 4u);
}
