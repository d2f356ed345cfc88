// The communication figures of a finished run (lab/comm/comm_stats.h), from events built by hand:
// bytes moved per rank and per kind of message, rank 0's share, compute per phase, the last step's
// gradient buckets, and the part of each rank's communication hidden behind its backward pass.
// Events outside training (train_step -1: the initial broadcast, evaluations) never count.
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "backends.h"
#include "comm_stats.h"
#include "events.h"
#include "run.h"
#include "test_util.h"

namespace {

lab::Event chunk(int src, int dst, uint64_t bytes, const char* what, int64_t step = 0) {
  lab::Event e;
  e.kind = lab::EventKind::Chunk;
  e.src = src;
  e.dst = dst;
  e.rank = src;
  e.bytes = bytes;
  e.what = what;
  e.train_step = step;
  return e;
}

lab::Event span(lab::EventKind kind, lab::Phase phase, double t0, double t1, int64_t step = 0, const char* what = "",
                int32_t tag = -1, uint64_t bytes = 0) {
  lab::Event e;
  e.kind = kind;
  e.phase = phase;
  e.t_start = t0;
  e.t_end = t1;
  e.train_step = step;
  e.what = what;
  e.tag = tag;
  e.bytes = bytes;
  return e;
}

}  // namespace

TEST(CommStats, TrafficPerRankAndPerKindOfMessage) {
  // rank 0 sends 100 gradient bytes to 1 and 50 buffer bytes to 2; rank 1 sends 30 to 2; rank 2
  // sends 20 to 0; and an evaluation's 1000 bytes (train_step -1) that must not count
  std::vector<std::vector<lab::Event>> ev(3);
  ev[0] = {chunk(0, 1, 100, "grad bucket"), chunk(0, 2, 50, "buffers"), chunk(0, 1, 1000, "buffers", -1)};
  ev[1] = {chunk(1, 2, 30, "grad bucket")};
  ev[2] = {chunk(2, 0, 20, "grad bucket", 1)};
  const lab::TrafficStats t = lab::traffic_stats(ev);
  EXPECT_EQ(t.bytes_moved, 200u);
  EXPECT_EQ(t.sent, (std::vector<uint64_t>{150, 30, 20}));
  EXPECT_EQ(t.received, (std::vector<uint64_t>{20, 100, 80}));
  EXPECT_DOUBLE_EQ(t.rank0_share, (150.0 + 20.0) / 200.0);
  ASSERT_EQ(t.by_what.size(), 2u);
  EXPECT_EQ(t.by_what[0].what, "grad bucket");  // in order of first appearance
  EXPECT_EQ(t.by_what[0].bytes_moved, 150u);
  EXPECT_EQ(t.by_what[0].sent, (std::vector<uint64_t>{100, 30, 20}));
  EXPECT_EQ(t.by_what[0].received, (std::vector<uint64_t>{20, 100, 30}));
  EXPECT_EQ(t.by_what[1].what, "buffers");
  EXPECT_EQ(t.by_what[1].bytes_moved, 50u);
  EXPECT_EQ(t.by_what[1].received, (std::vector<uint64_t>{0, 0, 50}));
}

TEST(CommStats, NothingMovedIsAShareOfZero) {
  const lab::TrafficStats t = lab::traffic_stats(std::vector<std::vector<lab::Event>>(2));
  EXPECT_EQ(t.bytes_moved, 0u);
  EXPECT_EQ(t.rank0_share, 0.0);
  EXPECT_EQ(t.sent, (std::vector<uint64_t>{0, 0}));
  EXPECT_TRUE(lab::traffic_stats({}).sent.empty());
}

TEST(CommStats, ComputeSecondsPerRankAndPhase) {
  using K = lab::EventKind;
  using P = lab::Phase;
  std::vector<std::vector<lab::Event>> ev(2);
  ev[0] = {span(K::Compute, P::Forward, 0, 0.5), span(K::Compute, P::Backward, 0.5, 1.5),
           span(K::Compute, P::OptimizerStep, 1.5, 1.75), span(K::Compute, P::Forward, 2, 2.5, 1),
           span(K::Compute, P::Forward, 3, 9, -1)};  // an evaluation's forward
  ev[1] = {span(K::Compute, P::Backward, 0, 2), span(K::Collective, P::None, 0, 4)};
  const lab::ComputeStats c = lab::compute_stats(ev);
  EXPECT_EQ(c.forward, (std::vector<double>{1.0, 0.0}));
  EXPECT_EQ(c.backward, (std::vector<double>{1.0, 2.0}));
  EXPECT_EQ(c.optimizer, (std::vector<double>{0.25, 0.0}));
}

TEST(CommStats, GradientBucketsOfTheLastStepOnRankZero) {
  using K = lab::EventKind;
  using P = lab::Phase;
  std::vector<std::vector<lab::Event>> ev(2);
  ev[0] = {span(K::Collective, P::None, 0, 1, 0, "grad bucket", 0, 400), span(K::Collective, P::None, 0, 1, 0, "grad bucket", 1, 300),
           span(K::Collective, P::None, 2, 3, 1, "grad bucket", 1, 64), span(K::Collective, P::None, 2, 3, 1, "grad bucket", 0, 128),
           span(K::Collective, P::None, 2, 3, 1, "buffers", 5, 999),   // not a gradient bucket
           span(K::Collective, P::None, 4, 5, -1, "grad bucket", 7, 8)};  // outside training
  ev[1] = {span(K::Collective, P::None, 2, 3, 2, "grad bucket", 0, 1)};  // rank 1 is not asked
  const std::vector<lab::BucketInfo> b = lab::grad_buckets(ev);
  ASSERT_EQ(b.size(), 2u);
  EXPECT_EQ(b[0].index, 0);
  EXPECT_EQ(b[0].bytes, 128u);
  EXPECT_EQ(b[1].index, 1);
  EXPECT_EQ(b[1].bytes, 64u);
  EXPECT_TRUE(lab::grad_buckets({}).empty());
}

// Rank 0: a collective over [1, 3] while its backward ran over [0, 2] and [2.5, 4]: 1 + 0.5 of its
// 2 seconds hidden; a second collective over [5, 6] after backward: nothing hidden. Rank 1: a
// collective over [0, 1] with no backward at all. An evaluation's collective never counts.
TEST(CommStats, CommunicationHiddenBehindTheSameRanksBackward) {
  using K = lab::EventKind;
  using P = lab::Phase;
  std::vector<std::vector<lab::Event>> ev(2);
  ev[0] = {span(K::Compute, P::Backward, 0, 2), span(K::Compute, P::Backward, 2.5, 4), span(K::Collective, P::None, 1, 3),
           span(K::Collective, P::None, 5, 6), span(K::Collective, P::None, 0, 10, -1),
           span(K::Compute, P::Forward, 1, 3)};  // a forward is not backward
  ev[1] = {span(K::Collective, P::None, 0, 1)};
  const lab::OverlapStats o = lab::overlap_stats(ev);
  EXPECT_EQ(o.comm_seconds, (std::vector<double>{3.0, 1.0}));
  EXPECT_EQ(o.hidden_seconds, (std::vector<double>{1.5, 0.0}));
  EXPECT_EQ(o.comm_seconds_total, 4.0);
  EXPECT_EQ(o.hidden_seconds_total, 1.5);
  EXPECT_DOUBLE_EQ(o.hidden_fraction, 1.5 / 4.0);
  EXPECT_EQ(lab::overlap_stats(std::vector<std::vector<lab::Event>>(1)).hidden_fraction, 0.0);
}

// An evaluation's collectives are the evaluation's, not the training's traffic: with --eval-every 1
// (rank 0 evaluates the whole model after every iteration) FSDP gathers the shards, tensor
// parallelism the slices and a pipeline the stages first, and summary.json's "traffic" (the
// iterations' messages) is what the same run moves without the evaluations.
TEST(CommStats, PeriodicEvaluationsMoveNoTrainingTraffic) {
  DTLAB_REQUIRE_DATASET();
  struct Case {
    const char* name;
    std::function<void(lab::RunConfig&)> set;
  };
  const Case cases[] = {
      {"fsdp full_shard, 2 ranks", [](lab::RunConfig& c) { c.mode = "fsdp"; }},
      {"tensor, tp 2", [](lab::RunConfig& c) { c.mode = "tensor"; c.tp = 2; }},
      {"pipeline, 2 stages x tp 2", [](lab::RunConfig& c) {
         c.mode = "pipeline";
         c.world_size = 4;
         c.stages = 2;
         c.tp = 2;
         c.microbatches = 2;
       }},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(k.name);
    std::string traffic[2];
    for (int eval_every : {0, 1}) {
      testutil::TempDir d;
      lab::RunConfig c = testutil::small_run("mlp", 2, d.path(), 3);
      c.batch_size = 8;
      c.limit_train = 64;
      c.limit_test = 16;
      k.set(c);
      c.eval_every = eval_every;
      c.eval_samples = eval_every ? 16 : c.eval_samples;
      lab::Run(c, lab::make_world).run();
      const auto s = nlohmann::json::parse(testutil::read_file(d.file("summary.json")));
      traffic[eval_every] = s.at("traffic").dump();
      if (eval_every) {
        const std::string metrics = testutil::read_file(d.file("metrics.jsonl"));
        EXPECT_NE(metrics.find("\"kind\":\"eval\""), std::string::npos) << "the evaluations ran";
      }
    }
    EXPECT_EQ(traffic[1], traffic[0]);
  }
}
