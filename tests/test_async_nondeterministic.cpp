// --mode async (a parameter server and asynchronous workers) and --nondeterministic (reductions
// in arrival order): one worker is plain SGD bit for bit; a seeded schedule is reproducible and
// records every gradient's staleness; failures are named; the default stays bitwise
// reproducible while --nondeterministic makes two identical runs differ.
#include <gtest/gtest.h>

#include <cmath>
#include <thread>

#include <nlohmann/json.hpp>

#include "backends.h"
#include "communicator.h"
#include "errors.h"
#include "naive_allreduce.h"
#include "run.h"
#include "test_util.h"
#include "threads/transport_threads.h"

namespace {

lab::RunConfig async_run(int workers, const std::string& out, const std::string& schedule = "seeded", uint64_t seed = 3) {
  lab::RunConfig c = testutil::small_run("mlp", workers, out, 0);
  c.mode = "async";
  c.async_schedule = schedule;
  c.async_seed = seed;
  c.epochs = 1;
  c.batch_size = 16;
  c.limit_train = 256;  // 16 iterations per worker with one worker, 4 with four
  return c;
}

std::vector<nlohmann::json> step_records(const std::string& dir) {
  std::vector<nlohmann::json> out;
  std::stringstream in(testutil::read_file(dir + "/metrics.jsonl"));
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line);
    if (j["kind"] == "step") out.push_back(j);
  }
  return out;
}

}  // namespace

// One worker and the server compute exactly what one process computes: pull the weights, forward,
// backward, the server's SGD step (with its momentum) on that gradient.
TEST(AsyncMode, OneWorkerIsPlainSgdBitForBit) {
  DTLAB_REQUIRE_DATASET();
  testutil::TempDir a, s;
  lab::RunConfig ca = async_run(1, a.path(), "free");
  lab::RunConfig cs = ca;
  cs.mode = "ddp";
  cs.out_dir = s.path();
  lab::Run(ca, lab::make_world).run();
  lab::Run(cs, lab::make_world).run();
  EXPECT_EQ(testutil::read_file(a.file("final.safetensors")), testutil::read_file(s.file("final.safetensors")));
  for (const auto& r : step_records(a.path())) EXPECT_EQ(r["staleness"], 0) << r.dump();
}

TEST(AsyncMode, SeededScheduleIsReproducibleAndRecordsStaleness) {
  DTLAB_REQUIRE_DATASET();
  testutil::TempDir a, b, c;
  lab::Run(async_run(4, a.path()), lab::make_world).run();
  lab::Run(async_run(4, b.path()), lab::make_world).run();
  lab::Run(async_run(4, c.path(), "seeded", 4), lab::make_world).run();
  EXPECT_EQ(testutil::read_file(a.file("final.safetensors")), testutil::read_file(b.file("final.safetensors")));
  EXPECT_EQ(testutil::without_wall_clock(testutil::read_file(a.file("metrics.jsonl"))),
            testutil::without_wall_clock(testutil::read_file(b.file("metrics.jsonl"))));
  const auto sa = nlohmann::json::parse(testutil::read_file(a.file("summary.json")));
  const auto sc = nlohmann::json::parse(testutil::read_file(c.file("summary.json")));
  ASSERT_TRUE(sa.contains("async")) << sa.dump(1);
  EXPECT_EQ(sa["async"]["updates"], 4 * 4);  // every worker's every batch
  int64_t total = 0;
  for (const auto& h : sa["async"]["staleness"]["histogram"]) total += h.get<int64_t>();
  EXPECT_EQ(total, 16);
  EXPECT_NE(sa["async"]["per_update"]["staleness"], sc["async"]["per_update"]["staleness"])
      << "another seed, another order";
  // every step record carries its gradient's staleness and the version it pulled; the staleness
  // is what the server counted: updates applied since that version
  const auto recs = step_records(a.path());
  ASSERT_EQ(recs.size(), 16u);
  int64_t max_staleness = 0;
  for (const auto& r : recs) {
    ASSERT_TRUE(r.contains("staleness")) << r.dump();
    EXPECT_GE(r["staleness"].get<int64_t>(), 0);
    EXPECT_LT(r["staleness"].get<int64_t>(), 16);
    EXPECT_GE(r["version"].get<int64_t>(), 0);
    max_staleness = std::max(max_staleness, r["staleness"].get<int64_t>());
  }
  EXPECT_EQ(sa["async"]["staleness"]["max"], max_staleness);
  EXPECT_GT(max_staleness, 0) << "four workers on a seeded schedule: some gradients are stale";
  // the final model is the server's, on every worker: no per-rank files
  EXPECT_FALSE(std::filesystem::exists(a.file("final.rank1.buffers.safetensors")));
  EXPECT_GT(sa["test_eval_mode"]["accuracy"].get<double>(), 0.2);
}

TEST(AsyncMode, FreeScheduleTrainsAndStaysWithinBounds) {
  DTLAB_REQUIRE_DATASET();
  testutil::TempDir a;
  const lab::RunSummary s = lab::Run(async_run(4, a.path(), "free"), lab::make_world).run();
  ASSERT_EQ(s.async_updates.size(), 16u);
  for (const auto& [worker, staleness] : s.async_updates) {
    EXPECT_GE(worker, 0);
    EXPECT_LT(worker, 4);
    EXPECT_GE(staleness, 0);
    EXPECT_LT(staleness, 16);
  }
}

TEST(AsyncMode, AFailingWorkerIsNamedAndSettingsAreChecked) {
  DTLAB_REQUIRE_DATASET();
  testutil::TempDir a;
  lab::RunConfig c = async_run(3, a.path());
  c.fail_rank = 2;
  c.fail_step = 1;
  c.fail_at = "backward";
  try {
    lab::Run(c, lab::make_world).run();
    FAIL() << "expected the injected failure";
  } catch (const lab::TrainingError& e) {
    EXPECT_NE(std::string(e.what()).find("rank 2"), std::string::npos) << e.what();
  }
  lab::RunConfig bad = async_run(2, "");
  bad.bn = "sync";
  EXPECT_THROW(lab::validate(bad), lab::ConfigError);
  bad = async_run(2, "");
  bad.comm = "mpi";
  EXPECT_THROW(lab::validate(bad), lab::ConfigError);
  bad = async_run(2, "");
  bad.async_schedule = "fair";
  EXPECT_THROW(lab::validate(bad), lab::ConfigError);
}

// --nondeterministic's naive allreduce adds the ranks' buffers in arrival order; with inputs whose
// sums are exact in any order every rank still gets the exact sum.
TEST(Nondeterministic, ArrivalOrderNaiveAllreduceIsExactOnExactInputs) {
  const int n = 5;
  const size_t count = 1000;
  lab::ThreadsWorld world(n);
  std::vector<std::vector<float>> data(n, std::vector<float>(count));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      lab::Communicator comm(world.transport(r), nullptr);
      comm.set_arrival_order(true);
      for (size_t i = 0; i < count; ++i) data[static_cast<size_t>(r)][i] = static_cast<float>(i % 97 + 1000 * r);
      lab::naive_allreduce(comm, data[static_cast<size_t>(r)].data(), count, {"test", 0});
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r)
    for (size_t i = 0; i < count; ++i)
      ASSERT_EQ(data[static_cast<size_t>(r)][i], static_cast<float>(n * (i % 97) + 1000 * n * (n - 1) / 2)) << r << " " << i;
}

// The default is bitwise reproducible; --nondeterministic (atomic adds of the convolutions' weight
// gradients over two compute threads, in whatever order they finish) is not, and records a
// per-step fingerprint of the weights that shows from which step two runs part.
TEST(Nondeterministic, TwoIdenticalRunsDifferOnlyWithTheFlag) {
  DTLAB_REQUIRE_DATASET();
  auto cfg = [](const std::string& out, bool nd) {
    lab::RunConfig c = testutil::small_run("cnn", 1, out, 0);
    c.threads = 2;
    c.batch_size = 64;
    c.limit_train = 512;
    c.epochs = 1;
    c.nondeterministic = nd;
    return c;
  };
  testutil::TempDir a, b, c, d;
  lab::Run(cfg(a.path(), false), lab::make_world).run();
  lab::Run(cfg(b.path(), false), lab::make_world).run();
  EXPECT_EQ(testutil::read_file(a.file("final.safetensors")), testutil::read_file(b.file("final.safetensors")));
  EXPECT_EQ(testutil::read_file(a.file("metrics.jsonl")).find("param_checksum"), std::string::npos);
  lab::Run(cfg(c.path(), true), lab::make_world).run();
  lab::Run(cfg(d.path(), true), lab::make_world).run();
  EXPECT_NE(testutil::read_file(c.file("final.safetensors")), testutil::read_file(d.file("final.safetensors")))
      << "eight steps of 64 samples, each adding 64 per-sample gradients from two threads in arrival order";
  const auto rc = step_records(c.path()), rd = step_records(d.path());
  ASSERT_EQ(rc.size(), rd.size());
  ASSERT_TRUE(rc[0].contains("param_checksum"));
  double max_diff = 0;
  for (size_t i = 0; i < rc.size(); ++i)
    max_diff = std::max(max_diff, std::fabs(rc[i]["param_checksum"].get<double>() - rd[i]["param_checksum"].get<double>()));
  EXPECT_GT(max_diff, 0.0);
  EXPECT_LT(max_diff, 1.0) << "the runs part in the last bits, not by much in eight steps";
}
