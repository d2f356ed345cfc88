// What a new user meets in the first hour, each point as it was found (and fixed): runs are never
// replaced unasked, messages say what is true (the batch of one, --steps with --epochs, eval's test
// set, a stopped run's checkpoint, the traffic line, the progress line while nothing finishes),
// misspelt commands get a suggestion, and the help reads as a list.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "errors.h"
#include "run.h"
#include "run_dir.h"
#include "run_progress.h"
#include "test_util.h"

using testutil::run_cli;

namespace {

bool contains(const std::string& s, const std::string& what) { return s.find(what) != std::string::npos; }
namespace fs = std::filesystem;

const std::string kSmall = "run --model mlp --world-size 2 --batch-size 16 --limit-train 256 --limit-test 64 --steps 2 "
                           "--threads 1 ";

nlohmann::json summary_of(const std::string& dir) { return nlohmann::json::parse(testutil::read_file(dir + "/summary.json")); }

}  // namespace

// Point 1: `--out D` never replaces what D holds unless asked; the message says what is there.
TEST(FirstContact, AFinishedRunIsNotReplacedUnasked) {
  DTLAB_REQUIRE_DATASET();
  testutil::TempDir t;
  const std::string d = t.file("run");
  auto r = run_cli(kSmall + "--out " + d);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const std::string weights = testutil::read_file(d + "/final.safetensors");
  r = run_cli(kSmall + "--seed 7 --out " + d);
  EXPECT_EQ(r.exit_code, lab::kExitIo) << r.out;
  EXPECT_TRUE(contains(r.out, "--out " + d + " already holds a finished run (mlp, 2 steps, test accuracy")) << r.out;
  EXPECT_TRUE(contains(r.out, "--overwrite")) << r.out;
  EXPECT_EQ(testutil::read_file(d + "/final.safetensors"), weights) << "the earlier run was touched";
  // asked: replaced; a file of the user's own in the run directory stays
  testutil::write_file(d + "/notes.txt", "mine");
  r = run_cli(kSmall + "--seed 7 --out " + d + " --overwrite");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(testutil::read_file(d + "/final.safetensors"), weights);
  EXPECT_EQ(testutil::read_file(d + "/notes.txt"), "mine");
}

TEST(FirstContact, AFolderOfOtherFilesIsNeverWrittenInto) {
  testutil::TempDir t;
  const std::string d = t.file("papers");
  fs::create_directories(d + "/figures");
  testutil::write_file(d + "/draft.tex", "\\documentclass{article}");
  for (const char* extra : {"", "--overwrite"}) {
    const auto r = run_cli(kSmall + "--out " + d + " " + extra);
    EXPECT_EQ(r.exit_code, lab::kExitIo) << r.out;
    EXPECT_TRUE(contains(r.out, "is not a run directory and not empty: it holds 2 files or folders")) << r.out;
    EXPECT_TRUE(contains(r.out, "draft.tex")) << r.out;
  }
  EXPECT_EQ(testutil::read_file(d + "/draft.tex"), "\\documentclass{article}");
  EXPECT_FALSE(fs::exists(d + "/metrics.jsonl"));
  // an empty folder is fine
  const lab::OutDirContents empty = lab::inspect_out_dir(t.file("nothing-here"));
  EXPECT_EQ(empty.kind, lab::OutDirContents::Kind::Empty);
}

TEST(FirstContact, AnInterruptedRunPointsAtResume) {
  DTLAB_REQUIRE_DATASET();
  testutil::TempDir t;
  const std::string d = t.file("ck");
  auto r = run_cli(kSmall + "--steps 6 --checkpoint-every 2 --out " + d);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  fs::remove(d + "/summary.json");  // as a run stopped by Ctrl-C a second time, or killed, leaves it
  const lab::OutDirContents c = lab::inspect_out_dir(d);
  EXPECT_EQ(c.kind, lab::OutDirContents::Kind::Run);
  EXPECT_EQ(c.checkpoint_step, 4);
  r = run_cli(kSmall + "--steps 6 --checkpoint-every 2 --out " + d);
  EXPECT_EQ(r.exit_code, lab::kExitIo) << r.out;
  EXPECT_TRUE(contains(r.out, "already holds an interrupted run (mlp) with checkpoints up to step 4")) << r.out;
  EXPECT_TRUE(contains(r.out, "continue it with `dtlab run --resume " + d + "`")) << r.out;
  EXPECT_TRUE(fs::exists(d + "/checkpoints/step-00000004")) << "the checkpoint was deleted";
  // --resume into another folder that holds a run: refused too
  const std::string other = t.file("other");
  ASSERT_EQ(run_cli(kSmall + "--out " + other).exit_code, 0);
  r = run_cli("run --resume " + d + " --out " + other);
  EXPECT_EQ(r.exit_code, lab::kExitIo) << r.out;
  EXPECT_TRUE(contains(r.out, "already holds a finished run")) << r.out;
  // and continuing in place works
  r = run_cli("run --resume " + d);
  EXPECT_EQ(r.exit_code, 0) << r.out;
}

TEST(FirstContact, ALessonFolderFollowsTheSameRule) {
  DTLAB_REQUIRE_DATASET();
  testutil::TempDir t;
  const std::string lesson = std::string(DTLAB_SOURCE_DIR) + "/lessons/examples/sampler-shards.toml";
  const std::string d = t.file("session");
  auto r = run_cli("lesson run " + lesson + " --answers auto --out " + d);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  r = run_cli("lesson run " + lesson + " --answers auto --out " + d);
  EXPECT_EQ(r.exit_code, lab::kExitIo) << r.out;
  EXPECT_TRUE(contains(r.out, "already holds a session of lesson 'sampler-shards'")) << r.out;
  r = run_cli("lesson run " + lesson + " --answers auto --out " + d + " --overwrite");
  EXPECT_EQ(r.exit_code, 0) << r.out;
  r = run_cli("lesson prepare " + lesson + " --out " + d);
  EXPECT_EQ(r.exit_code, lab::kExitIo) << r.out;
}

// The quick start, run twice, keeps both runs (tools/lab.sh names each run directory afresh).
TEST(FirstContact, TheQuickStartTwiceKeepsBothRuns) {
  DTLAB_REQUIRE_DATASET();
  testutil::TempDir t;
  const std::string cmd = "cd " + std::string(DTLAB_SOURCE_DIR) + " && env -u DISPLAY -u WAYLAND_DISPLAY DTLAB_NO_SETUP=1 DTLAB=" +
                          std::string(DTLAB_BINARY) + " DTLAB_RUNS=" + t.path() +
                          " tools/lab.sh --model mlp --world-size 2 --epochs 1 --limit-train 256 --limit-test 64";
  const auto a = testutil::run_shell(cmd);
  ASSERT_EQ(a.exit_code, 0) << a.out;
  const auto b = testutil::run_shell(cmd);
  ASSERT_EQ(b.exit_code, 0) << b.out;
  std::vector<std::string> runs;
  for (const auto& e : fs::directory_iterator(t.path())) runs.push_back(e.path().string());
  ASSERT_EQ(runs.size(), 2u) << a.out << b.out;
  for (const std::string& r : runs) EXPECT_TRUE(fs::exists(r + "/summary.json")) << r;
  EXPECT_TRUE(contains(a.out, "this run's directory: " + t.path() + "/quickstart-")) << a.out;
}

// Point 2: the batch-of-one hint says why there was one sample, and only offers what helps.
TEST(FirstContact, BatchOfOneHintNamesTheRealCause) {
  DTLAB_REQUIRE_DATASET();
  for (const char* extra : {"", "--drop-last"}) {
    const auto r = run_cli("run --batch-size 1 --world-size 2 --steps 2 --limit-train 256 --limit-test 64 --model mlp " +
                           std::string(extra));
    EXPECT_EQ(r.exit_code, lab::kExitTraining) << r.out;
    EXPECT_TRUE(contains(r.out, "Expected more than 1 value per channel when training")) << r.out;
    EXPECT_TRUE(contains(r.out, "--batch-size 1 gives every batch a single sample")) << r.out;
    EXPECT_FALSE(contains(r.out, "last, incomplete batch")) << r.out;
    EXPECT_FALSE(contains(r.out, "--drop-last")) << r.out;
    EXPECT_TRUE(contains(r.out, "--bn sync")) << r.out;
  }
  // 66 samples on 2 ranks, batch 32: 33 per rank, the last batch has 1
  const auto r = run_cli("run --batch-size 32 --world-size 2 --epochs 1 --limit-train 66 --limit-test 64 --model mlp --no-shuffle");
  EXPECT_EQ(r.exit_code, lab::kExitTraining) << r.out;
  EXPECT_TRUE(contains(r.out, "batch 1 of epoch 0)")) << r.out;
  EXPECT_TRUE(contains(r.out, "the epoch's last, incomplete batch (33 samples per rank mod batch size 32 = 1)")) << r.out;
  EXPECT_TRUE(contains(r.out, "--drop-last")) << r.out;
}

// Point 3: --epochs and --steps: whichever limit comes first; --steps alone runs what it takes.
TEST(FirstContact, StepsAndEpochsStopAtTheFirstLimit) {
  DTLAB_REQUIRE_DATASET();
  testutil::TempDir t;
  // 128 samples, 2 ranks, batch 32: 2 iterations per epoch
  const std::string base = "run --model mlp --world-size 2 --batch-size 32 --limit-train 128 --limit-test 64 --threads 1 ";
  auto r = run_cli(base + "--epochs 1 --steps 5 --out " + t.file("both"));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "epochs=1 steps=2 (2 per epoch)")) << r.out;
  EXPECT_TRUE(contains(r.out, "the run stops after 2 iterations, at the end of epoch 1 (the first limit reached)")) << r.out;
  EXPECT_TRUE(contains(r.out, "done: 2 steps, 1 epoch,")) << r.out;
  EXPECT_EQ(summary_of(t.file("both"))["steps"], 2);
  r = run_cli(base + "--epochs 3 --steps 3 --out " + t.file("steps-first"));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_EQ(summary_of(t.file("steps-first"))["steps"], 3);
  r = run_cli(base + "--steps 5 --out " + t.file("alone"));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "epochs=3 steps=5")) << r.out;
  EXPECT_TRUE(contains(r.out, "done: 5 steps, 3 epochs (the last one cut short by --steps)")) << r.out;
  EXPECT_EQ(summary_of(t.file("alone"))["steps"], 5);
  const auto help = run_cli("run --help");
  EXPECT_TRUE(contains(help.out, "the first limit reached ends the run")) << help.out;
}

// Point 4: dtlab eval takes the run's own test subset by default and says so; --probe K prints K.
TEST(FirstContact, EvalUsesTheRunsTestSetAndProbePrintsK) {
  DTLAB_REQUIRE_DATASET();
  testutil::TempDir t;
  const std::string d = t.file("run");
  ASSERT_EQ(run_cli("run --model mlp --batch-size 64 --limit-train 512 --limit-test 300 --epochs 1 --threads 1 --out " + d).exit_code, 0);
  testutil::TempDir j;
  auto r = run_cli("eval --run " + d + " --json " + j.file("e.json") + " --probe 5");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "the run's first 300 test samples")) << r.out;
  const auto e = nlohmann::json::parse(testutil::read_file(j.file("e.json")));
  EXPECT_EQ(e["samples"], 300);
  EXPECT_DOUBLE_EQ(e["accuracy"].get<double>(), summary_of(d)["test_eval_mode"]["accuracy"].get<double>());
  size_t lines = 0;
  for (size_t at = r.out.find("  test sample "); at != std::string::npos; at = r.out.find("  test sample ", at + 1)) ++lines;
  EXPECT_EQ(lines, 5u) << r.out;
  r = run_cli("eval --run " + d + " --limit-test 0 --probe 0");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "10000 samples")) << r.out;
  EXPECT_TRUE(contains(r.out, "the run itself used the first 300")) << r.out;
  EXPECT_FALSE(contains(r.out, "  test sample ")) << r.out;
}

// Point 5: a run that stopped early says which checkpoint survives and how to continue it; the
// progress line says what it waits for instead of a falling samples/s.
TEST(FirstContact, AStoppedRunNamesItsIntactCheckpoint) {
  DTLAB_REQUIRE_DATASET();
  testutil::TempDir t;
  const std::string d = t.file("ck");
  ASSERT_EQ(run_cli(kSmall + "--steps 6 --checkpoint-every 2 --out " + d).exit_code, 0);
  lab::RunConfig c;
  c.out_dir = d;
  c.checkpoint_every = 2;
  std::string said = commands::what_the_run_directory_keeps(c, false);
  EXPECT_TRUE(contains(said, "keeps its checkpoint at iteration 4 (intact)")) << said;
  EXPECT_TRUE(contains(said, "dtlab run --resume " + d)) << said;
  EXPECT_FALSE(contains(said, "mpirun")) << said;
  c.comm = "mpi";
  c.world_size = 4;
  said = commands::what_the_run_directory_keeps(c, true);
  EXPECT_TRUE(contains(said, "mpirun -np 4 dtlab run --comm mpi --resume " + d)) << said;
  c.comm = "nccl";  // NCCL ranks as processes
  said = commands::what_the_run_directory_keeps(c, true);
  EXPECT_TRUE(contains(said, "mpirun -np 4 dtlab run --comm nccl --resume " + d)) << said;
  c.out_dir = t.file("none");
  c.checkpoint_every = 0;
  said = commands::what_the_run_directory_keeps(c, false);
  EXPECT_TRUE(contains(said, "no checkpoint to continue from (--checkpoint-every N")) << said;
}

TEST(FirstContact, TheProgressLineSaysWhatItWaitsFor) {
  lab::Snapshot s;
  s.steps_total = 100;
  s.steps_per_epoch = 50;
  s.samples_per_s = 2783;
  s.latest.resize(2);
  s.latest[0].step = 40;
  s.latest[0].batch_size = 32;
  s.latest[0].correct = 16;
  s.latest[0].loss = 0.5f;
  commands::ProgressLine p;
  std::string l = p.line(s, 10.0, -1, 60);
  EXPECT_TRUE(contains(l, "step 41/100")) << l;
  EXPECT_TRUE(contains(l, "2783 samples/s")) << l;
  s.samples_per_s = 2562;  // the rate since the start falls while nothing finishes
  l = p.line(s, 11.0, -1, 60);
  EXPECT_TRUE(contains(l, "samples/s")) << l;  // (one second: not yet a stall)
  l = p.line(s, 22.5, 2, 20);
  EXPECT_FALSE(contains(l, "samples/s")) << l;
  EXPECT_TRUE(contains(l, "no iteration finished for 12 s: iteration 41 is still running (waiting for rank 2)")) << l;
  EXPECT_TRUE(contains(l, "--timeout 20 s")) << l;
  s.latest[0].step = 41;  // it finished: the rate comes back
  l = p.line(s, 23.0, -1, 20);
  EXPECT_TRUE(contains(l, "samples/s")) << l;
}

// Point 6: the traffic line does not read as if the other ranks moved nothing.
TEST(FirstContact, TrafficLineShowsEveryRanksBytes) {
  DTLAB_REQUIRE_DATASET();
  const auto r = run_cli(kSmall);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "MB moved during training; sent per rank (MB): ")) << r.out;
  EXPECT_TRUE(contains(r.out, "100.0% of the bytes were in messages to or from rank 0 (with 2 ranks every message has "
                              "rank 0 at one end)"))
      << r.out;
  EXPECT_FALSE(contains(r.out, "sent and received")) << r.out;
}

// Point 7: the small messages.
TEST(FirstContact, SmallMessagesTellTheTruth) {
  auto r = run_cli("bench allreduce --world-sizes 1");
  EXPECT_EQ(r.exit_code, lab::kExitUsage) << r.out;
  EXPECT_TRUE(contains(r.out, "--world-sizes 1: an allreduce over one rank moves no bytes")) << r.out;
  r = run_cli("rn");
  EXPECT_EQ(r.exit_code, lab::kExitUsage) << r.out;
  EXPECT_TRUE(contains(r.out, "unknown command 'dtlab rn' (did you mean dtlab run?)")) << r.out;
  r = run_cli("bench trian --model mlp");
  EXPECT_EQ(r.exit_code, lab::kExitUsage) << r.out;
  EXPECT_TRUE(contains(r.out, "(did you mean dtlab bench train?)")) << r.out;
  r = run_cli("bench");
  EXPECT_EQ(r.exit_code, lab::kExitUsage) << r.out;
  EXPECT_TRUE(contains(r.out, "'dtlab bench' needs a command: train, sgemm, allreduce, chain")) << r.out;
  r = testutil::run_shell("env -u DISPLAY -u WAYLAND_DISPLAY " + std::string(DTLAB_BINARY));
  EXPECT_EQ(r.exit_code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "Exit codes")) << r.out;
  r = run_cli("run --lr -1");
  EXPECT_EQ(r.exit_code, lab::kExitUsage) << r.out;
  EXPECT_TRUE(contains(r.out, "--lr -1: Invalid learning rate: -1")) << r.out;
  r = run_cli("run --resume /nonexistent/runs/nope");
  EXPECT_EQ(r.exit_code, lab::kExitIo) << r.out;
  EXPECT_TRUE(contains(r.out, "--resume: /nonexistent/runs/nope does not exist")) << r.out;
  r = run_cli("--help");
  EXPECT_TRUE(contains(r.out, "\n   77  a lesson's requirement (e.g. MPI) is missing\n")) << r.out;
  EXPECT_TRUE(contains(r.out, "\n  130  interrupted")) << r.out;
  r = run_cli("run --help");
  EXPECT_FALSE(contains(r.out, "{false}")) << r.out;
  EXPECT_TRUE(contains(r.out, "--no-track-running-stats")) << r.out;
  r = run_cli("bench train --help");
  EXPECT_FALSE(contains(r.out, "--comm")) << r.out;
}

// The app's later runs of a session (Reset, Apply) with --out get a fresh name beside the first.
TEST(FirstContact, FreshDirNamesNeverReplaceARun) {
  testutil::TempDir t;
  const std::string base = t.file("runs/x");
  EXPECT_EQ(lab::fresh_dir_name(base), base);  // nothing there yet
  fs::create_directories(base);
  EXPECT_EQ(lab::fresh_dir_name(base), base);  // an empty folder is fine
  testutil::write_file(base + "/config.toml", "# dtlab run configuration (resolved)\n");
  EXPECT_EQ(lab::fresh_dir_name(base), base + "-2");
  fs::create_directories(base + "-2");
  testutil::write_file(base + "-2/notes.txt", "mine");
  EXPECT_EQ(lab::fresh_dir_name(base), base + "-3");
}
