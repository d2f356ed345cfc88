// A run directory read back into what the views draw (viz/data/run_data.h, load_run_dir): the same
// data as the live run, DataParallel's runs, a missing or damaged file named, epoch ends placed.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include "errors.h"
#include "ring_model.h"
#include "run_data.h"
#include "test_util.h"
#include "train_eval_series.h"

TEST(VizRunDir, ARunDirectoryReadsBackIntoTheSameData) {
  DTLAB_REQUIRE_DATASET();
  testutil::TempDir dir;
  const auto r = testutil::run_cli("run --model mlp --world-size 4 --batch-size 16 --limit-train 640 --limit-test 100 "
                                   "--epochs 2 --eval-every 4 --eval-samples 50 --threads 1 --out " + dir.file("run"));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const viz::RunData d = viz::load_run_dir(dir.file("run"));
  EXPECT_EQ(d.world(), 4);
  EXPECT_EQ(d.steps_done(), 20);  // 640 / 4 / 16 = 10 per epoch
  EXPECT_EQ(d.steps_per_epoch, 10);
  EXPECT_EQ(d.train_size, 640);
  EXPECT_EQ(d.epochs.size(), 2u);
  ASSERT_GE(d.evals.size(), 5u);  // after 1, 2, 4, 8, 12, 16, 20
  EXPECT_EQ(d.evals[0].steps, 1);
  EXPECT_EQ(d.evals.back().steps, 20);
  EXPECT_EQ(d.evals.back().probe_eval.size(), 10u);
  EXPECT_TRUE(d.summary.valid);
  ASSERT_NE(d.record(19, 3), nullptr);
  // BatchNorm statistics from bn_stats.bin: every step of epoch 0, then every 10th (--record-bn auto)
  EXPECT_FALSE(d.record(9, 3)->bn.empty());
  EXPECT_FALSE(d.record(10, 3)->bn.empty());
  EXPECT_TRUE(d.record(19, 3)->bn.empty());
  // the BatchNorm view shows the newest recorded step, not an empty last one
  EXPECT_EQ(d.bn_step_at_or_before(d.last_complete_step()), 10);
  EXPECT_EQ(d.bn_step_at_or_before(9), 9);
  EXPECT_EQ(d.bn_step_at_or_before(-1), -1);
  // the trace's chunk events rebuild the last gradient allreduce
  uint64_t seq = 0;
  ASSERT_TRUE(viz::latest_collective(d.events, viz::CollectiveFilter{}, true, seq));
  const viz::CollectiveTrace t = viz::collect_trace(d.events, seq);
  EXPECT_EQ(t.steps, 6);
  EXPECT_EQ(t.what, "grad bucket");
  for (int rank = 0; rank < 4; ++rank) EXPECT_EQ(viz::owned_chunk(t, rank), (rank + 1) % 4);
}

// DataParallel's devices other than 0 have no loss of their own (null in metrics.jsonl): the run
// directory still opens, with those losses NaN as the live run holds them.
TEST(VizRunDir, DataParallelRunDirectoryOpens) {
  DTLAB_REQUIRE_DATASET();
  testutil::TempDir dir;
  const auto r = testutil::run_cli("run --mode dp --model mlp --world-size 3 --batch-size 30 --limit-train 300 "
                                   "--limit-test 60 --steps 4 --threads 1 --out " + dir.file("run"));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const viz::RunData d = viz::load_run_dir(dir.file("run"));
  EXPECT_EQ(d.steps_done(), 4);
  ASSERT_NE(d.record(3, 0), nullptr);
  ASSERT_NE(d.record(3, 1), nullptr);
  EXPECT_TRUE(std::isfinite(d.record(3, 0)->loss));
  EXPECT_TRUE(std::isnan(d.record(3, 1)->loss));
}

TEST(VizRunDir, MissingConfigIsAnErrorNamingTheFile) {
  testutil::TempDir dir;
  try {
    viz::load_run_dir(dir.path());
    FAIL() << "expected an error";
  } catch (const lab::IoError& e) {
    EXPECT_NE(std::string(e.what()).find("config.toml"), std::string::npos) << e.what();
  }
}

// Found by fuzzing (fuzz/fuzz_run_dir.cpp) and by hand: damaged files of a run directory are an
// IoError naming the file (and the line of metrics.jsonl), not an exception of the JSON library, a
// float converted to an integer it does not fit (undefined behaviour), or room made for 10^11 steps.
TEST(VizRunDir, DamagedFilesAreErrorsNamingTheFile) {
  testutil::TempDir dir;
  lab::RunConfig c;
  c.model = "mlp";
  c.world_size = 2;
  c.data_dir = dir.file("no-dataset");
  const std::string step0 = R"({"kind":"step","rank":0,"step":0,"loss":1.5})"
                            "\n";
  struct Case {
    const char* file;
    std::string text;
    const char* says;
  };
  const Case cases[] = {
      {"summary.json", "5", "summary.json: bad summary"},  // the fuzzer's find: value() on a number
      {"metrics.jsonl", step0 + "5\n", "metrics.jsonl:2: bad record"},
      {"metrics.jsonl", R"({"kind":"step","rank":1e300,"step":0})", "metrics.jsonl:1: bad record: 'rank' is 1e+300"},
      {"metrics.jsonl", R"({"kind":"step","rank":0,"step":0,"bytes_sent":-1.5})", "'bytes_sent' is -1.5"},
      {"metrics.jsonl", step0 + R"({"kind":"step","rank":0,"step":100000000000})", "metrics.jsonl:2: step 100000000000"},
      {"metrics.jsonl", R"({"kind":"step","rank":0,"step":0,"bn":[5]})", "metrics.jsonl:1: bad record"},
      {"metrics.jsonl", R"({"kind":"epoch","train_loss":"x"})", "metrics.jsonl:1: bad record"},
      {"trace.json", R"({"traceEvents":[{"ph":"X","pid":1e20}]})", "trace.json: bad trace event: 'pid' is"},
      {"trace.json", R"({"traceEvents":[{"ph":"X","pid":0,"cat":"collective","name":"allreduce b 99999999999"}]})",
       "trace.json: bad trace event"},
      {"trace.json", R"({"traceEvents":[{"ph":"X","pid":0,"cat":"compute","args":5}]})", "trace.json: bad trace event"},
  };
  for (const Case& k : cases) {
    std::filesystem::remove_all(dir.file("run"));
    std::filesystem::create_directories(dir.file("run"));
    std::ofstream(dir.file("run/config.toml")) << lab::to_toml(c, {});
    std::ofstream(dir.file("run/metrics.jsonl")) << step0;
    std::ofstream(dir.file(std::string("run/") + k.file)) << k.text;
    try {
      viz::load_run_dir(dir.file("run"));
      ADD_FAILURE() << "accepted " << k.file << ": " << k.text;
    } catch (const lab::IoError& e) {
      EXPECT_NE(std::string(e.what()).find(k.says), std::string::npos) << e.what();
    }
  }
}

// A run directory of a run without --eval-every: its epoch ends read back at the iterations they
// ended at; an epoch record without "steps" (0) is placed after its epoch's last iteration.
TEST(VizRunDir, EpochEndsOfARunWithoutEvalEvery) {
  DTLAB_REQUIRE_DATASET();
  testutil::TempDir dir;
  const auto r = testutil::run_cli("run --model mlp --world-size 2 --batch-size 16 --limit-train 320 --limit-test 64 "
                                   "--epochs 2 --threads 1 --out " + dir.file("run"));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  viz::RunData d = viz::load_run_dir(dir.file("run"));
  EXPECT_TRUE(d.evals.empty());
  const viz::TrainEvalSeries t = viz::train_eval_series(d);
  EXPECT_EQ(t.epoch_x, (std::vector<float>{10, 20}));  // 320 / 2 / 16 = 10 per epoch
  EXPECT_EQ(t.final_train_x, (std::vector<float>{20}));
  EXPECT_EQ(d.opened_description(), "finished run, opened from " + dir.file("run") + ": 20 iterations, 2 epochs of 10 "
                                    "iterations");

  std::string metrics = testutil::read_file(dir.file("run/metrics.jsonl"));
  size_t at = 0, removed = 0;
  while ((at = metrics.find("\"steps\":", at)) != std::string::npos) {
    const size_t end = metrics.find(',', at);
    metrics.erase(at, end - at + 1);
    ++removed;
  }
  ASSERT_EQ(removed, 2u);
  testutil::write_file(dir.file("run/metrics.jsonl"), metrics);
  d = viz::load_run_dir(dir.file("run"));
  ASSERT_EQ(d.epochs.size(), 2u);
  EXPECT_EQ(d.epochs[0].steps, 10);
  EXPECT_EQ(d.epochs[1].steps, 20);
}
