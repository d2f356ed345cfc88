// The Run: determinism, failure handling, pausing and stepping, the batch-of-one error, and the
// run directory contract.
#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <thread>

#include "backends.h"
#include "bn_stats.h"
#include "errors.h"
#include "run.h"
#include "test_util.h"

namespace {

lab::RunConfig small(const std::string& model, int world, const std::string& out) {
  return testutil::small_run(model, world, out, 6);
}

using testutil::without_wall_clock;

double since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

TEST(Run, IdenticalRunsGiveIdenticalWeightsAndMetrics) {
  DTLAB_REQUIRE_DATASET();
  for (const char* bn : {"local", "sync"}) {
    testutil::TempDir a, b;
    auto ca = small("cnn", 3, a.path());
    ca.bn = bn;
    auto cb = ca;
    cb.out_dir = b.path();
    lab::Run(ca, lab::make_world).run();
    lab::Run(cb, lab::make_world).run();
    EXPECT_EQ(testutil::read_file(a.file("final.safetensors")), testutil::read_file(b.file("final.safetensors"))) << bn;
    EXPECT_EQ(testutil::read_file(a.file("init.safetensors")), testutil::read_file(b.file("init.safetensors"))) << bn;
    EXPECT_EQ(without_wall_clock(testutil::read_file(a.file("metrics.jsonl"))),
              without_wall_clock(testutil::read_file(b.file("metrics.jsonl"))))
        << bn;
  }
}

TEST(Run, RunDirectoryHoldsTheContractFiles) {
  DTLAB_REQUIRE_DATASET();
  testutil::TempDir d;
  auto c = small("mlp", 2, d.path());
  c.broadcast_buffers = false;  // ranks end with different running statistics
  lab::Run run(c, lab::make_world);
  const lab::RunSummary& s = run.run();
  for (const char* f : {"config.toml", "metrics.jsonl", "bn_stats.bin", "trace.json", "init.safetensors",
                        "final.safetensors", "summary.json", "final.rank1.buffers.safetensors"})
    EXPECT_TRUE(std::filesystem::exists(d.file(f))) << f;
  EXPECT_EQ(s.steps, 6);
  // The config read back is the config that ran.
  const lab::RunConfig back = lab::config_from_toml_file(d.file("config.toml"));
  EXPECT_EQ(back.world_size, 2);
  EXPECT_FALSE(back.broadcast_buffers);
  // metrics: one step line per step and rank with the scalars; BN statistics per layer and channel
  // in bn_stats.bin (every step of the first epoch with --record-bn auto)
  std::ifstream m(d.file("metrics.jsonl"));
  std::string line;
  int steps = 0, epochs = 0;
  while (std::getline(m, line)) {
    const auto j = nlohmann::json::parse(line);
    if (j["kind"] == "step") {
      ++steps;
      EXPECT_FALSE(j.contains("bn"));
      EXPECT_GT(j["bytes_sent"].get<uint64_t>(), 0u);
    } else {
      ++epochs;
    }
  }
  EXPECT_EQ(steps, 12);
  EXPECT_EQ(epochs, 1);
  const lab::BnStatsFile bn = lab::read_bn_stats(d.file("bn_stats.bin"));
  EXPECT_EQ(bn.world_size, 2);
  ASSERT_EQ(bn.layers.size(), 2u);
  EXPECT_EQ(bn.layers[0], (std::pair<std::string, int>{"2", 256}));
  ASSERT_EQ(bn.steps.size(), 6u);
  for (const auto& step : bn.steps) {
    ASSERT_EQ(step.size(), 2u);
    for (const lab::StepRecord& r : step) {
      ASSERT_EQ(r.bn.size(), 2u);
      EXPECT_EQ(r.bn[0].running_mean.size(), 256u);
      EXPECT_EQ(r.bn[1].batch_var.size(), 128u);
    }
  }
  // trace: Chrome trace events with a process per rank and chunk events carrying their fields.
  const auto t = nlohmann::json::parse(testutil::read_file(d.file("trace.json")));
  int chunks = 0;
  for (const auto& e : t["traceEvents"])
    if (e.value("cat", "") == "chunk") {
      ++chunks;
      EXPECT_TRUE(e["args"].contains("src") && e["args"].contains("chunk") && e["args"].contains("ring_step"));
    }
  EXPECT_GT(chunks, 0);
  const auto sj = nlohmann::json::parse(testutil::read_file(d.file("summary.json")));
  EXPECT_TRUE(sj.contains("test_eval_mode") && sj.contains("test_train_mode"));
  EXPECT_EQ(sj["test_eval_mode_per_rank"].size(), 2u);
}

// Every allreduce of a gradient bucket: each rank sends 2(N-1) chunks, 2(N-1)/N of the bucket.
TEST(Run, GradientAllreduceTrafficFollowsTheRingRule) {
  DTLAB_REQUIRE_DATASET();
  const int world = 4;
  auto c = small("cnn", world, "");
  c.steps = 2;
  c.epochs = 0;  // --steps alone: as many epochs as it takes
  lab::Run run(c, lab::make_world);
  run.run();
  std::map<uint64_t, uint64_t> total, bucket_bytes;  // op_seq -> bytes over all ranks / bucket size
  for (int r = 0; r < world; ++r) {
    std::vector<lab::Event> ev;
    run.events(r).copy_since(0, ev);
    std::map<uint64_t, std::pair<int, uint64_t>> per_op;  // op_seq -> (sends, bytes)
    std::map<uint64_t, uint64_t> op_bytes;
    for (const auto& e : ev) {
      if (std::string(e.what) != "grad bucket" || e.train_step != 1) continue;
      if (e.kind == lab::EventKind::Chunk) {
        EXPECT_EQ(e.src, r);
        EXPECT_EQ(e.dst, (r + 1) % world);
        per_op[e.op_seq].first += 1;
        per_op[e.op_seq].second += e.bytes;
      } else if (e.kind == lab::EventKind::Collective) {
        op_bytes[e.op_seq] = e.bytes;
      }
    }
    ASSERT_EQ(per_op.size(), 2u) << "cnn has two buckets after the first iteration";
    for (const auto& [seq, sb] : per_op) {
      EXPECT_EQ(sb.first, 2 * (world - 1));
      // Reduce-scatter sends every chunk but (r + 1), allgather every chunk but (r + 2); chunk i
      // holds count / N elements, plus one for the first count % N chunks.
      const uint64_t count = op_bytes[seq] / 4, base = count / world, extra = count % world;
      auto chunk_bytes = [&](uint64_t i) { return 4 * (base + (i < extra ? 1 : 0)); };
      EXPECT_EQ(sb.second, 2 * op_bytes[seq] - chunk_bytes((r + 1) % world) - chunk_bytes((r + 2) % world))
          << "rank " << r;
      total[seq] += sb.second;
      bucket_bytes[seq] = op_bytes[seq];
    }
  }
  // Over all ranks: exactly 2(N-1)/N of the buffer per rank on average.
  for (const auto& [seq, bytes] : total) EXPECT_EQ(bytes, bucket_bytes[seq] * 2 * (world - 1));
}

TEST(Run, AFailingRankStopsEveryRankQuicklyWithItsName) {
  DTLAB_REQUIRE_DATASET();
  for (const char* where : {"allreduce", "backward", "forward"}) {
    auto c = small("mlp", 4, "");
    c.fail_rank = 2;
    c.fail_step = 1;
    c.fail_at = where;
    c.timeout_s = 10;
    const auto t0 = std::chrono::steady_clock::now();
    try {
      lab::Run(c, lab::make_world).run();
      FAIL() << "expected the run to fail";
    } catch (const lab::Error& e) {
      const std::string msg = e.what();
      EXPECT_EQ(msg.rfind("rank 2 failed", 0), 0u) << msg;
      EXPECT_NE(msg.find(std::string("--fail-at ") + where), std::string::npos) << msg;
      for (int r : {0, 1, 3}) EXPECT_NE(msg.find("rank " + std::to_string(r) + ":"), std::string::npos) << msg;
      if (std::string(where) == "allreduce") {
        EXPECT_NE(msg.find("allreduce #"), std::string::npos) << msg;
      }
    }
    // The abort reaches everyone at once: far below the 10 s timeout.
    EXPECT_LT(since(t0), 5.0) << where;
  }
}

TEST(Run, AHungRankIsNamedByTheTimeout) {
  DTLAB_REQUIRE_DATASET();
  auto c = small("mlp", 3, "");
  c.fail_rank = 1;
  c.fail_step = 2;
  c.fail_at = "hang";
  c.timeout_s = 1.0;
  const auto t0 = std::chrono::steady_clock::now();
  try {
    lab::Run(c, lab::make_world).run();
    FAIL() << "expected a timeout";
  } catch (const lab::CommError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("timed out"), std::string::npos) << msg;
    EXPECT_NE(msg.find("rank 1"), std::string::npos) << msg;
    EXPECT_NE(msg.find("step 2"), std::string::npos) << msg;
  }
  EXPECT_LT(since(t0), 4.0);
}

TEST(Run, BatchOfOneFailsWithPyTorchWordsAndTheCause) {
  DTLAB_REQUIRE_DATASET();
  auto c = small("mlp", 1, "");
  c.limit_train = 33;  // batches of 16, 16, 1
  c.steps = 0;
  c.epochs = 1;
  try {
    lab::Run(c, lab::make_world).run();
    FAIL();
  } catch (const lab::TrainingError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("Expected more than 1 value per channel when training, got input size torch.Size([1, 256])"),
              std::string::npos)
        << msg;
    EXPECT_NE(e.hint().find("last, incomplete batch"), std::string::npos) << e.hint();
    EXPECT_NE(e.hint().find("--drop-last"), std::string::npos) << e.hint();
  }
  c.drop_last = true;
  EXPECT_EQ(lab::Run(c, lab::make_world).run().steps, 2);
}

// SyncBN: a rank holding one sample is fine when the global batch has more; local BN is not.
TEST(Run, SyncBatchNormAcceptsASingleSampleRank) {
  DTLAB_REQUIRE_DATASET();
  auto c = small("mlp", 2, "");  // BatchNorm1d: one sample is one value per channel
  c.limit_train = 34;  // 17 per rank: batches of 16 and 1
  c.steps = 0;
  c.epochs = 1;
  c.bn = "sync";
  EXPECT_EQ(lab::Run(c, lab::make_world).run().steps, 2);
  c.bn = "local";
  EXPECT_THROW(lab::Run(c, lab::make_world).run(), lab::TrainingError);
}

TEST(Run, PauseAndStepOneRingStepAtATime) {
  DTLAB_REQUIRE_DATASET();
  const int world = 3;
  auto c = small("mlp", world, "");
  c.steps = 2;
  c.epochs = 0;  // --steps alone: as many epochs as it takes
  c.timeout_s = 2;  // paused time must not count towards it
  lab::Run run(c, lab::make_world);
  run.control().pause();
  run.start();
  auto chunks = [&] {
    size_t n = 0;
    for (int r = 0; r < world; ++r) {
      std::vector<lab::Event> ev;
      run.events(r).copy_since(0, ev);
      for (const auto& e : ev) n += e.kind == lab::EventKind::Chunk;
    }
    return n;
  };
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(chunks(), 0u) << "paused before the first collective";
  EXPECT_EQ(run.snapshot()->state, lab::RunState::Created);  // not polled yet
  run.poll();
  EXPECT_EQ(run.snapshot()->state, lab::RunState::Paused);
  size_t before = chunks();
  for (int i = 0; i < 3; ++i) {
    run.control().step_ring();
    std::this_thread::sleep_for(std::chrono::milliseconds(150));
    const size_t now = chunks();
    EXPECT_GT(now, before) << "one ring step moves chunks";
    EXPECT_LE(now - before, static_cast<size_t>(world)) << "at most one chunk per rank per ring step";
    before = now;
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(2500));  // longer than the timeout, paused
  EXPECT_EQ(chunks(), before);
  run.control().resume();
  while (!run.poll()) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(run.finish().steps, 2);
  EXPECT_EQ(run.snapshot()->state, lab::RunState::Finished);
}

TEST(Run, InitLoadsWeightsOnRankZeroAndBroadcastsThem) {
  DTLAB_REQUIRE_DATASET();
  testutil::TempDir a, b;
  auto c = small("mlp", 1, a.path());
  c.seed = 7;
  c.steps = 1;
  c.epochs = 0;  // --steps alone: as many epochs as it takes
  lab::Run(c, lab::make_world).run();
  auto d = small("mlp", 2, b.path());
  d.seed = 0;
  d.steps = 1;
  d.epochs = 0;  // --steps alone: as many epochs as it takes
  d.init = a.file("init.safetensors");
  lab::Run run(d, lab::make_world);
  run.run();
  // init.safetensors of the second run is the first run's initial state (seed 7), not seed 0's.
  EXPECT_EQ(testutil::read_file(b.file("init.safetensors")), testutil::read_file(a.file("init.safetensors")));
}

// bn_stats.bin holds what metrics.jsonl held, bit for bit, stores a value shared by every rank once
// (SyncBN), and records the steps --record-bn chooses.
TEST(Run, BatchNormStatisticsFileHoldsWhatTheRecordsHeld) {
  DTLAB_REQUIRE_DATASET();
  for (const char* bn : {"local", "sync"}) {
    testutil::TempDir d;
    auto c = small("mlp", 3, d.path());
    c.bn = bn;
    std::vector<lab::StepRecord> seen;
    lab::Run run(c, lab::make_world);
    run.set_step_sink([&](const std::vector<lab::StepRecord>& recs) { seen.insert(seen.end(), recs.begin(), recs.end()); });
    run.run();
    const lab::BnStatsFile f = lab::read_bn_stats(d.file("bn_stats.bin"));
    ASSERT_EQ(f.steps.size(), 6u) << bn;
    for (const lab::StepRecord& r : seen) {
      const lab::StepRecord& got = f.steps[static_cast<size_t>(r.step)][static_cast<size_t>(r.rank)];
      ASSERT_EQ(got.bn.size(), r.bn.size());
      for (size_t l = 0; l < r.bn.size(); ++l) {
        EXPECT_EQ(got.bn[l].batch_mean, r.bn[l].batch_mean) << bn;
        EXPECT_EQ(got.bn[l].batch_var, r.bn[l].batch_var) << bn;
        EXPECT_EQ(got.bn[l].local_mean, r.bn[l].local_mean) << bn;
        EXPECT_EQ(got.bn[l].running_mean, r.bn[l].running_mean) << bn;
        EXPECT_EQ(got.bn[l].num_batches_tracked, r.bn[l].num_batches_tracked) << bn;
        EXPECT_EQ(got.bn[l].count, r.bn[l].count) << bn;
      }
    }
  }
  // SyncBN's statistics are the same on every rank: stored once, the file is smaller
  testutil::TempDir l, s;
  auto cl = small("mlp", 4, l.path());
  auto cs = cl;
  cs.bn = "sync";
  cs.out_dir = s.path();
  lab::Run(cl, lab::make_world).run();
  lab::Run(cs, lab::make_world).run();
  EXPECT_LT(std::filesystem::file_size(s.file("bn_stats.bin")), std::filesystem::file_size(l.file("bn_stats.bin")));
  // --record-bn: every 4th step; off: no file
  testutil::TempDir e, o;
  auto ce = small("mlp", 2, e.path());
  ce.steps = 10;
  ce.epochs = 0;  // --steps alone: as many epochs as it takes
  ce.record_bn = "4";
  lab::Run(ce, lab::make_world).run();
  const lab::BnStatsFile fe = lab::read_bn_stats(e.file("bn_stats.bin"));
  ASSERT_EQ(fe.steps.size(), 3u);  // steps 0, 4, 8
  EXPECT_EQ(fe.steps[1][0].step, 4);
  auto co = small("mlp", 2, o.path());
  co.record_bn = "off";
  lab::Run(co, lab::make_world).run();
  EXPECT_FALSE(std::filesystem::exists(o.file("bn_stats.bin")));
  co.record_bn = "sometimes";
  EXPECT_THROW(lab::validate(co), lab::ConfigError);
  // a cut file is an error naming it
  std::string bytes = testutil::read_file(e.file("bn_stats.bin"));
  bytes.resize(bytes.size() - 7);
  EXPECT_THROW(lab::parse_bn_stats(bytes, "cut.bin"), lab::IoError);
  // an empty file is a run that has recorded nothing yet (just started, or resumed from a
  // checkpoint taken before the first write): no steps, not an error
  const lab::BnStatsFile none = lab::parse_bn_stats("", "empty.bin");
  EXPECT_TRUE(none.steps.empty());
  EXPECT_THROW(lab::parse_bn_stats("DTLAB", "short.bin"), lab::IoError);
}

// tools/read_bn_stats.py reads the file from Python in a few lines (numpy; skipped without it).
TEST(Run, BatchNormStatisticsReadFromPython) {
  DTLAB_REQUIRE_DATASET();
  if (std::system("/usr/bin/python3 -c 'import numpy' > /dev/null 2>&1") != 0) GTEST_SKIP() << "numpy is not installed";
  testutil::TempDir d;
  auto c = small("mlp", 2, d.path());
  c.bn = "sync";
  lab::Run(c, lab::make_world).run();
  const std::string tool = std::string(DTLAB_FIXTURES_DIR) + "/../../tools/read_bn_stats.py";
  const auto r = testutil::run_shell("/usr/bin/python3 " + tool + " " + d.file("bn_stats.bin"));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("2 ranks, layers [('2', 256), ('5', 128)], 6 recorded steps"), std::string::npos) << r.out;
}
