// Checkpoints and --resume (checkpoint.h, run_checkpoint.cpp): a run stopped at a checkpoint and
// resumed ends bit for bit where the uninterrupted run ends (weights, metrics, BatchNorm
// statistics, traffic), in every mode that supports it; a checkpoint killed while being written is
// never used; damaged or mismatched checkpoints are refused with their names. And what a run does
// with a NaN or infinite gradient (--on-nonfinite).
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include "backends.h"
#include "checkpoint.h"
#include "command_line.h"
#include "errors.h"
#include "run.h"
#include "safetensors.h"
#include "test_util.h"

namespace fs = std::filesystem;

namespace {

struct Case {
  const char* name;
  const char* model;
  int world;
  std::function<void(lab::RunConfig&)> set;
};

lab::RunConfig base(const Case& k, const std::string& out) {
  lab::RunConfig c = testutil::small_run(k.model, k.world, out, 0);
  c.steps = 0;
  c.epochs = 3;
  c.limit_train = 192;  // 3 ranks x 4 batches of 16
  c.momentum = 0.9;
  k.set(c);
  return c;
}

nlohmann::json summary_of(const std::string& dir) {
  return nlohmann::json::parse(testutil::read_file(dir + "/summary.json"));
}

// Runs c and stops it with interrupt() while every rank waits at the gate of iteration `at`
// (as Ctrl-C would find them): the ranks checkpoint before iteration at + 1 and stop.
int64_t run_interrupted(const lab::RunConfig& c, int64_t at) {
  lab::Run run(c, lab::make_world);
  run.control().pause();
  run.control().run_until([at](int, int64_t it, const lab::Event* next) { return next == nullptr && it >= at; });
  run.start();
  for (;;) {
    run.poll();
    const auto its = run.control().iterations();
    if (std::all_of(its.begin(), its.end(), [at](int64_t i) { return i == at; })) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  EXPECT_TRUE(run.interrupt());
  run.control().resume();
  while (!run.poll()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  run.finish();
  return run.interrupted_at();
}

lab::RunConfig resume_of(const std::string& dir, const std::string& out = "") {
  std::vector<std::string> args = {"--resume", dir};
  if (!out.empty()) args.insert(args.end(), {"--out", out});
  return commands::parse_command("run", args).run;
}

void expect_same_run(const std::string& a, const std::string& b, const std::string& what) {
  EXPECT_EQ(testutil::read_file(a + "/final.safetensors"), testutil::read_file(b + "/final.safetensors")) << what;
  EXPECT_EQ(testutil::without_wall_clock(testutil::read_file(a + "/metrics.jsonl")),
            testutil::without_wall_clock(testutil::read_file(b + "/metrics.jsonl")))
      << what;
  if (fs::exists(a + "/bn_stats.bin")) {
    EXPECT_EQ(testutil::read_file(a + "/bn_stats.bin"), testutil::read_file(b + "/bn_stats.bin")) << what;
  }
  const nlohmann::json sa = summary_of(a), sb = summary_of(b);
  for (const char* k : {"test_eval_mode", "test_train_mode", "steps", "samples", "epochs", "traffic", "local_sgd", "memory"}) {
    if (sa.contains(k)) {
      EXPECT_EQ(sa[k], sb[k]) << what << ": summary " << k;
    }
  }
  for (const char* k : {"per_epoch"}) {
    auto strip = [](nlohmann::json j) {
      for (auto& e : j) e.erase("seconds");
      return j;
    };
    EXPECT_EQ(strip(sa[k]), strip(sb[k])) << what << ": summary " << k;
  }
}

const std::vector<Case>& cases() {
  static const std::vector<Case> c = {
      {"ddp_cnn_local_bn", "cnn", 3, [](lab::RunConfig&) {}},
      {"ddp_cnn_sync_bn", "cnn", 3, [](lab::RunConfig& c) { c.bn = "sync"; }},
      {"ddp_mlp_no_overlap_cosine", "mlp", 2,
       [](lab::RunConfig& c) {
         c.overlap = false;
         c.lr_schedule = "cosine";
         c.weight_decay = 1e-4;
         c.nesterov = true;
       }},
      {"ddp_mlp_no_sync", "mlp", 2, [](lab::RunConfig& c) { c.no_sync_steps = 2; }},
      {"dp_mlp", "mlp", 3, [](lab::RunConfig& c) { c.mode = "dp"; c.batch_size = 48; }},
      {"local_sgd_mlp", "mlp", 3,
       [](lab::RunConfig& c) {
         c.mode = "local-sgd";
         c.warmup_steps = 2;
         c.average_every = 3;
       }},
      {"ddp_eval_every", "mlp", 2, [](lab::RunConfig& c) {
         c.eval_every = 3;
         c.eval_samples = 32;
       }},
      // Adam's moments and its step count (the bias corrections) travel in the checkpoint
      {"ddp_mlp_adam", "mlp", 2,
       [](lab::RunConfig& c) {
         c.optimizer = "adam";
         c.lr = 1e-3;
         c.weight_decay = 1e-4;
       }},
      {"dp_cnn_adamw_cosine", "cnn", 2,
       [](lab::RunConfig& c) {
         c.mode = "dp";
         c.optimizer = "adamw";
         c.lr = 2e-3;
         c.weight_decay = 0.01;
         c.adam_beta1 = 0.8;
         c.lr_schedule = "cosine";
       }},
      // ZeroRedundancyOptimizer: each rank's checkpoint holds its own partition's Adam state only
      {"zero_mlp_adam_bucket", "mlp", 3,
       [](lab::RunConfig& c) {
         c.mode = "zero";
         c.optimizer = "adam";
         c.lr = 1e-3;
         c.parameters_as_bucket_view = true;
       }},
      // FSDP: each rank's checkpoint holds its shards and their Adam state, and (stopped inside a
      // no_sync cycle) the unsharded gradients accumulated so far; the model's parameters are
      // gathered again after the resume
      {"fsdp_mlp_full_shard_layer_adam_no_sync", "mlp", 4,
       [](lab::RunConfig& c) {
         c.mode = "fsdp";
         c.sharding_strategy = "full_shard";
         c.fsdp_wrap = "layer";
         c.optimizer = "adam";
         c.lr = 1e-3;
         c.no_sync_steps = 2;
       }},
      {"fsdp_cnn_shard_grad_op_momentum", "cnn", 3,
       [](lab::RunConfig& c) {
         c.mode = "fsdp";
         c.sharding_strategy = "shard_grad_op";
         c.momentum = 0.9;
       }},
      {"fsdp_mlp_no_shard", "mlp", 2,
       [](lab::RunConfig& c) {
         c.mode = "fsdp";
         c.sharding_strategy = "no_shard";
         c.momentum = 0.9;
         c.eval_every = 4;
         c.eval_samples = 32;
       }},
      // A pipeline with deferred BatchNorm: each epoch's last batch (2 samples) fills 2 of the 3
      // micro-batches, whose sums carry into the next mini-batch's, so the checkpoints hold sums
      // tracked but not yet committed; 1F1B's order and the stage's momentum travel too
      {"pipeline_cnn_1f1b_deferred", "cnn", 2,
       [](lab::RunConfig& c) {
         c.mode = "pipeline";
         c.microbatches = 3;
         c.schedule = "1f1b";
         c.deferred_batch_norm = true;
         c.batch_size = 38;
       }},
      // The three axes: each rank's checkpoint holds its stage's slices ("tp.*") and their Adam state
      {"pipeline_mlp_pp2_tp2_dp2_adam", "mlp", 8,
       [](lab::RunConfig& c) {
         c.mode = "pipeline";
         c.stages = 2;
         c.tp = 2;
         c.dp = 2;
         c.microbatches = 2;
         c.optimizer = "adam";
         c.lr = 1e-3;
       }},
      {"tensor_cnn_tp2_dp2", "cnn", 4,
       [](lab::RunConfig& c) {
         c.mode = "tensor";
         c.tp = 2;
         c.dp = 2;
         c.eval_every = 4;
         c.eval_samples = 32;
       }},
  };
  return c;
}

class ResumeMatches : public ::testing::TestWithParam<size_t> {};

}  // namespace

// The same run three ways: uninterrupted; stopped (interrupt) and resumed in place; stopped and
// resumed into another directory. Every file that holds numbers is the same.
TEST_P(ResumeMatches, UninterruptedRun) {
  DTLAB_REQUIRE_DATASET();
  const Case& k = cases()[GetParam()];
  testutil::TempDir a, b, copy;
  lab::Run(base(k, a.path()), lab::make_world).run();
  lab::RunConfig cb = base(k, b.path());
  cb.checkpoint_every = 3;
  for (int64_t after : {1, 6}) {  // stop early, then again after the resume
    const int64_t at = run_interrupted(after == 1 ? cb : resume_of(b.path()), after);
    ASSERT_EQ(at, after + 1) << k.name;
    EXPECT_TRUE(summary_of(b.path()).contains("interrupted")) << k.name;
  }
  lab::Run(resume_of(b.path(), copy.path()), lab::make_world).run();  // a copy continues elsewhere
  lab::Run(resume_of(b.path()), lab::make_world).run();
  expect_same_run(a.path(), b.path(), std::string(k.name) + " (in place)");
  expect_same_run(a.path(), copy.path(), std::string(k.name) + " (--out elsewhere)");
  EXPECT_TRUE(summary_of(b.path()).contains("resumed")) << k.name;
  EXPECT_FALSE(summary_of(b.path()).contains("interrupted")) << k.name;
}

INSTANTIATE_TEST_SUITE_P(Modes, ResumeMatches, ::testing::Range<size_t>(0, 16),
                         [](const ::testing::TestParamInfo<size_t>& i) { return std::string(cases()[i.param].name); });

// Checkpoints on a schedule change nothing: the run with them equals the run without.
TEST(Checkpoint, WritingCheckpointsChangesNoNumber) {
  DTLAB_REQUIRE_DATASET();
  testutil::TempDir a, b;
  const Case& k = cases()[1];
  lab::Run(base(k, a.path()), lab::make_world).run();
  lab::RunConfig cb = base(k, b.path());
  cb.checkpoint_every = 2;
  cb.checkpoint_every_epoch = true;
  lab::Run(cb, lab::make_world).run();
  expect_same_run(a.path(), b.path(), "with checkpoints");
  // this one and the one before are kept
  std::vector<std::string> kept;
  for (const auto& e : fs::directory_iterator(b.file("checkpoints"))) kept.push_back(e.path().filename().string());
  std::sort(kept.begin(), kept.end());
  EXPECT_EQ(kept, (std::vector<std::string>{"step-00000008", "step-00000010"}));
}

// A damaged newest checkpoint is skipped with a note naming it and why; the one before is used.
// A run killed while writing checkpoint N leaves checkpoints/.tmp-step-N behind; the resumed run
// writes checkpoint N again into the same directory. A file the first attempt wrote and the second
// has no use for (its step records not yet in metrics.jsonl) must not survive into the commit: it
// would add those steps to metrics.jsonl a second time at the next resume (seen under ASan, whose
// slower run let a SIGKILL land there).
TEST(Checkpoint, AKilledAttemptsLeftoverFilesDoNotReachTheNextCommit) {
  testutil::TempDir d;
  const std::string tmp = d.file("checkpoints/.tmp-step-00000005");
  fs::create_directories(tmp);
  testutil::write_file(tmp + "/rank1.records", "stale step records");
  testutil::write_file(tmp + "/rank1.events", "stale events");
  lab::RankCheckpoint rc;
  rc.counters = {{"rank", 1}};
  lab::write_rank_checkpoint(d.path(), 5, 1, rc);
  EXPECT_TRUE(fs::exists(tmp + "/rank1.json"));
  EXPECT_FALSE(fs::exists(tmp + "/rank1.records")) << "the killed attempt's records would be appended again";
  EXPECT_FALSE(fs::exists(tmp + "/rank1.events"));
  rc.records = {'x'};
  lab::write_rank_checkpoint(d.path(), 5, 1, rc);
  EXPECT_EQ(testutil::read_file(tmp + "/rank1.records"), "x");
}

TEST(Checkpoint, DamagedNewestFallsBackToThePreviousOne) {
  DTLAB_REQUIRE_DATASET();
  testutil::TempDir a, b;
  const Case& k = cases()[0];
  lab::Run(base(k, a.path()), lab::make_world).run();
  lab::RunConfig cb = base(k, b.path());
  cb.checkpoint_every = 4;
  lab::Run(cb, lab::make_world).run();  // 12 iterations: checkpoints before iterations 4 and 8
  const std::string newest = b.file("checkpoints/step-00000008/rank1.safetensors");
  ASSERT_TRUE(fs::exists(newest));
  {
    std::fstream f(newest, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(200);
    f.put('\x7f');  // one byte flipped inside a tensor
  }
  lab::Run run(resume_of(b.path()), lab::make_world);
  ASSERT_EQ(run.notes().size(), 1u);
  EXPECT_NE(run.notes()[0].find("step-00000008"), std::string::npos) << run.notes()[0];
  EXPECT_NE(run.notes()[0].find("rank1.safetensors does not match its checksum"), std::string::npos) << run.notes()[0];
  EXPECT_EQ(run.resumed_from(), 4);
  run.run();
  expect_same_run(a.path(), b.path(), "resumed from the older checkpoint");
}

// A state.json whose COMMITTED checksum matches but whose contents have the wrong types (found by
// fuzz/fuzz_checkpoint.cpp: nlohmann's type_error escaped): the checkpoint is skipped with a reason.
TEST(Checkpoint, WrongTypesInACommittedStateAreRefusedNotThrown) {
  testutil::TempDir b;
  const std::string dir = b.file("checkpoints/step-00000004");
  fs::create_directories(dir);
  testutil::write_file(dir + "/rank0.json", "{}");
  const std::vector<std::pair<std::string, std::string>> states = {
      {R"({"format":"dtlab-checkpoint","format_version":1,"files":{"rank0.json":{"bytes":"x"}}})", "state.json:"},
      {R"({"format":"dtlab-checkpoint","format_version":"1","files":{}})", "no format_version"},
      {R"([1,2,3])", "not a dtlab checkpoint"},
      {R"({"format":"dtlab-checkpoint","format_version":1,"files":{}})", ""},  // listed nothing: intact
  };
  for (const auto& [text, reason] : states) {
    testutil::write_file(dir + "/state.json", text);
    testutil::write_file(dir + "/COMMITTED", std::to_string(lab::crc32_of(text)) + "\n");
    if (reason.empty()) {
      const lab::FoundCheckpoint f = lab::find_checkpoint(b.path());
      EXPECT_EQ(f.step, 4);
      // ... but reading it names the file and the missing key
      try {
        lab::read_checkpoint_state(f.dir);
        FAIL() << "read a state.json without its fields";
      } catch (const lab::IoError& e) {
        EXPECT_NE(std::string(e.what()).find("state.json"), std::string::npos) << e.what();
      }
      continue;
    }
    try {
      lab::find_checkpoint(b.path());
      FAIL() << text;
    } catch (const lab::IoError& e) {
      EXPECT_NE(std::string(e.what()).find(reason), std::string::npos) << text << ": " << e.what();
    }
  }
}

TEST(Checkpoint, NoUsableCheckpointIsAnErrorNamingEachOne) {
  DTLAB_REQUIRE_DATASET();
  testutil::TempDir b;
  lab::RunConfig cb = base(cases()[0], b.path());
  cb.checkpoint_every = 4;
  lab::Run(cb, lab::make_world).run();
  fs::remove(b.file("checkpoints/step-00000008/COMMITTED"));
  {
    std::ofstream f(b.file("checkpoints/step-00000004/state.json"), std::ios::app);
    f << " ";
  }
  try {
    resume_of(b.path());
    FAIL() << "resumed from damaged checkpoints";
  } catch (const lab::IoError& e) {
    const std::string w = e.what();
    EXPECT_NE(w.find("step-00000008 is not used: not committed"), std::string::npos) << w;
    EXPECT_NE(w.find("step-00000004 is not used: state.json does not match its COMMITTED checksum"), std::string::npos) << w;
  }
  testutil::TempDir empty;
  try {
    resume_of(empty.path());
    FAIL();
  } catch (const lab::IoError& e) {
    EXPECT_NE(std::string(e.what()).find("has no checkpoint"), std::string::npos) << e.what();
    EXPECT_NE(e.hint().find("--checkpoint-every"), std::string::npos);
  }
}

TEST(Checkpoint, ResumeRefusesWhatWouldChangeTheRun) {
  DTLAB_REQUIRE_DATASET();
  testutil::TempDir b;
  lab::RunConfig cb = base(cases()[0], b.path());
  cb.checkpoint_every = 4;
  lab::Run(cb, lab::make_world).run();
  try {
    commands::parse_command("run", {"--resume", b.path(), "--lr", "0.5"});
    FAIL();
  } catch (const lab::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("--lr cannot be given with it"), std::string::npos) << e.what();
  }
  lab::RunConfig c = resume_of(b.path());
  c.world_size = 2;
  try {
    lab::Run run(c, lab::make_world);
    FAIL();
  } catch (const lab::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("written by 3 ranks, this run has 2"), std::string::npos) << e.what();
  }
  // --timeout may change: it changes no number
  EXPECT_EQ(commands::parse_command("run", {"--resume", b.path(), "--timeout", "7"}).run.timeout_s, 7);
}

// SIGKILL at random moments of a run that checkpoints often: whatever was being written, the
// resumed run ends where the uninterrupted one does.
TEST(Checkpoint, KilledAtRandomMomentsResumesToTheSameRun) {
  DTLAB_REQUIRE_DATASET();
  testutil::TempDir a, b;
  const std::vector<std::string> args = {"--model", "cnn", "--world-size", "2", "--batch-size", "16",
                                         "--limit-train", "256", "--limit-test", "64", "--epochs", "3",
                                         "--momentum", "0.9", "--threads", "1", "--checkpoint-every", "1"};
  auto run_dtlab = [&](std::vector<std::string> extra, double kill_after) {
    std::vector<std::string> all = {DTLAB_BINARY, "run"};
    all.insert(all.end(), extra.begin(), extra.end());
    const pid_t pid = fork();
    if (pid == 0) {
      freopen("/dev/null", "w", stdout);
      freopen("/dev/null", "w", stderr);
      std::vector<char*> argv;
      for (auto& s : all) argv.push_back(s.data());
      argv.push_back(nullptr);
      execv(argv[0], argv.data());
      _exit(127);
    }
    if (kill_after > 0) {
      std::this_thread::sleep_for(std::chrono::duration<double>(kill_after));
      kill(pid, SIGKILL);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    return status;
  };
  std::vector<std::string> full = args;
  full.insert(full.end(), {"--out", a.path()});
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_EQ(run_dtlab(full, 0), 0);
  // Kill moments are drawn over the uninterrupted run's own duration (start-up included), so
  // the test kills whether the machine is fast or slow.
  const double d = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::vector<std::string> first = args;
  first.insert(first.end(), {"--out", b.path()});
  std::mt19937 rng(12345);
  int kills = 0;
  for (int attempt = 0; attempt < 8 && kills < 4; ++attempt) {
    const double t = std::uniform_real_distribution<double>(0.15, 0.7)(rng) * d;
    const bool started = fs::exists(b.file("checkpoints"));
    std::vector<std::string> cmd = first;
    if (started) {
      bool usable = true;
      try {
        lab::find_checkpoint(b.path());
      } catch (const lab::IoError&) {
        usable = false;
      }
      if (usable) cmd = {"--resume", b.path()};
    }
    const int st = run_dtlab(cmd, t);
    if (WIFSIGNALED(st)) ++kills;
    else if (WIFEXITED(st) && WEXITSTATUS(st) == 0) break;
  }
  ASSERT_EQ(run_dtlab({"--resume", b.path()}, 0), 0);
  EXPECT_GT(kills, 0) << "no run was killed: the runs were faster than the kills";
  expect_same_run(a.path(), b.path(), "after " + std::to_string(kills) + " kills");
}

// ---- --on-nonfinite ----

TEST(NonFinite, StopNamesRankIterationAndParameterBeforeTheAllreduce) {
  DTLAB_REQUIRE_DATASET();
  lab::RunConfig c = testutil::small_run("mlp", 3, "", 6);
  c.fail_rank = 1;
  c.fail_step = 3;
  c.fail_at = "nan";
  try {
    lab::Run(c, lab::make_world).run();
    FAIL();
  } catch (const lab::TrainingError& e) {
    const std::string w = e.what();
    EXPECT_NE(w.find("rank 1 failed: iteration 3 (epoch 0, batch 3): the gradient of 7.bias is NaN before the allreduce"),
              std::string::npos)
        << w;
    EXPECT_NE(e.hint().find("--on-nonfinite skip-step"), std::string::npos);
  }
}

// skip-step: the iteration with a NaN leaves the parameters as they were (every rank skips it:
// the averaged gradient is NaN everywhere); BatchNorm's running statistics keep its forward.
TEST(NonFinite, SkipStepLeavesTheParametersOfThatIterationUnchanged) {
  DTLAB_REQUIRE_DATASET();
  testutil::TempDir a, b;
  lab::RunConfig ca = testutil::small_run("mlp", 3, a.path(), 3);  // iterations 0..2
  ca.momentum = 0.9;
  lab::RunConfig cb = ca;
  cb.out_dir = b.path();
  cb.steps = 4;  // iteration 3 gets a NaN on rank 2 and is skipped
  cb.fail_rank = 2;
  cb.fail_step = 3;
  cb.fail_at = "nan";
  cb.on_nonfinite = "skip-step";
  lab::Run(ca, lab::make_world).run();
  const lab::RunSummary s = lab::Run(cb, lab::make_world).run();
  EXPECT_EQ(s.skipped_steps, std::vector<int64_t>{3});
  const auto pa = lab::read_safetensors(a.file("final.safetensors"));
  const auto pb = lab::read_safetensors(b.file("final.safetensors"));
  ASSERT_EQ(pa.size(), pb.size());
  for (size_t i = 0; i < pa.size(); ++i) {
    const bool buffer = pa[i].name.find("running") != std::string::npos || pa[i].name.find("num_batches") != std::string::npos;
    if (buffer) EXPECT_NE(pa[i].bytes, pb[i].bytes) << pa[i].name;  // the skipped iteration's forward updated them
    else EXPECT_EQ(pa[i].bytes, pb[i].bytes) << pa[i].name;
  }
  const nlohmann::json j = summary_of(b.path());
  EXPECT_EQ(j["nonfinite"]["sources"], nlohmann::json::parse(R"([{"parameter":"7.bias","rank":2,"step":3}])"));
  EXPECT_EQ(j["nonfinite"]["skipped"].size(), 3u);  // every rank
}
