// --mode pipeline (lab/modes/pipeline.h, mode_pipeline.cpp): stages, schedules, the bubble, and
// the numbers. PARALLELISM.md's facts: GPipe's bubble (p-1)/(m+p-1), the same for 1F1B, which
// holds min(p-s, m) micro-batches in flight on stage s instead of m; Pipe's gradients are those of
// one loss over the mini-batch, accumulated in reverse micro-batch order. PyTorch's own Pipe is
// compared step by step in tools/parity/parity.py (the pipe_* cases).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "backends.h"
#include "batchnorm.h"
#include "command_line.h"
#include "dataset.h"
#include "errors.h"
#include "group_transport.h"
#include "model_compare.h"
#include "model.h"
#include "optim.h"
#include "pipeline.h"
#include "rank_threads.h"
#include "run.h"
#include "test_util.h"
#include "torch_rng.h"

namespace {

using lab::PipeOp;
using lab::PipeStep;

std::string text(const std::vector<PipeStep>& s) {
  std::string out;
  for (const PipeStep& p : s) out += (out.empty() ? "" : " ") + std::string(p.op == PipeOp::Forward ? "F" : "B") + std::to_string(p.micro);
  return out;
}

std::unique_ptr<lab::Model> model(const std::string& name, bool batchnorm = true) {
  lab::ModelOptions o;
  o.name = name;
  if (!batchnorm) o.make_batchnorm = [](int, int) -> std::unique_ptr<lab::Module> { return nullptr; };
  return lab::build_model(o, 0);
}

lab::RunConfig pipeline_run(const std::string& name, int stages, int64_t micro, const std::string& out) {
  lab::RunConfig c = testutil::small_run(name, stages, out, 4);
  c.mode = "pipeline";
  c.batch_size = 32;
  c.microbatches = micro;
  return c;
}

// (rank 0's final model is the whole model: the stages share theirs at the end)
using testutil::Apart;
using testutil::apart;

}  // namespace

// ---- schedules ----

TEST(PipelineSchedule, GpipeRunsEveryForwardThenEveryBackwardInReverse) {
  for (int s = 0; s < 4; ++s) EXPECT_EQ(text(lab::pipeline_schedule("gpipe", 4, s, 3)), "F0 F1 F2 B2 B1 B0");
}

// Megatron-LM's 1F1B: p - s - 1 warm-up forwards, then one forward and one backward, then the rest
// of the backwards.
TEST(PipelineSchedule, OneFOneBWarmsUpThenAlternates) {
  EXPECT_EQ(text(lab::pipeline_schedule("1f1b", 4, 0, 8)), "F0 F1 F2 F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 B5 B6 B7");
  EXPECT_EQ(text(lab::pipeline_schedule("1f1b", 4, 2, 8)), "F0 F1 B0 F2 B1 F3 B2 F4 B3 F5 B4 F6 B5 F7 B6 B7");
  EXPECT_EQ(text(lab::pipeline_schedule("1f1b", 4, 3, 8)), "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7");
  EXPECT_EQ(text(lab::pipeline_schedule("1f1b", 4, 0, 2)), "F0 F1 B0 B1");  // fewer micro-batches than stages
  EXPECT_THROW(lab::pipeline_schedule("zb", 4, 0, 2), lab::ConfigError);
}

// In flight: GPipe holds every micro-batch, 1F1B min(p - s, m) on stage s.
TEST(PipelineSchedule, OneFOneBHoldsAtMostPMinusSMicroBatches) {
  for (int p : {1, 2, 4, 8})
    for (int m : {1, 3, 4, 16})
      for (int s = 0; s < p; ++s) {
        EXPECT_EQ(lab::peak_in_flight(lab::pipeline_schedule("gpipe", p, s, m)), m);
        EXPECT_EQ(lab::peak_in_flight(lab::pipeline_schedule("1f1b", p, s, m)), std::min(p - s, m)) << p << " " << m << " " << s;
      }
}

// The schedule played with equal stages: both schedules' bubble is (p-1)/(m+p-1), whatever the
// ratio of backward to forward.
TEST(PipelineTimeline, BothSchedulesHaveGPipesBubble) {
  for (const char* sched : {"gpipe", "1f1b"})
    for (int p : {1, 2, 4, 8})
      for (int m : {1, 4, 16})
        for (double tb : {1.0, 2.0, 3.5}) {
          const lab::PipeTimeline t = lab::simulate_pipeline(sched, p, m, 1.0, tb);
          EXPECT_NEAR(t.bubble, lab::bubble_formula(p, m), 1e-12) << sched << " p=" << p << " m=" << m;
          EXPECT_NEAR(t.makespan, (m + p - 1) * (1.0 + tb), 1e-9);
          EXPECT_EQ(t.blocks.size(), static_cast<size_t>(2 * p * m));
        }
  EXPECT_DOUBLE_EQ(lab::bubble_formula(4, 1), 0.75);
  EXPECT_DOUBLE_EQ(lab::bubble_formula(4, 4), 3.0 / 7.0);
  EXPECT_DOUBLE_EQ(lab::bubble_formula(4, 16), 3.0 / 19.0);
}

// A slow stage sets the pace: the others wait, and the bubble is larger than the formula's.
TEST(PipelineTimeline, AnUnbalancedStageWidensTheBubble) {
  const lab::PipeTimeline t = lab::simulate_pipeline("gpipe", 4, 8, {1, 4, 1, 1}, {2, 8, 2, 2});
  EXPECT_GT(t.bubble, lab::bubble_formula(4, 8) + 0.2);
  EXPECT_NEAR(t.makespan, 3 * 1 + 8 * 4 + 8 * 8 + 3 * 2, 1e-9);  // fill, the slow stage's 8 + 8 blocks, drain
}

TEST(PipelineTimeline, MeasuredBubbleIsTheIdleShare) {
  EXPECT_DOUBLE_EQ(lab::measured_bubble({3, 3}, 4), 0.25);
  EXPECT_DOUBLE_EQ(lab::measured_bubble({4, 4}, 4), 0.0);
}

// ---- stages ----

TEST(PipelineStages, AutomaticCutsStartStagesAtLayers) {
  auto mlp = model("mlp"), cnn = model("cnn");
  EXPECT_EQ(lab::balance_text(lab::pipeline_stages(*mlp, 3, "", "mlp")), "4,3,1");
  EXPECT_EQ(lab::balance_text(lab::pipeline_stages(*mlp, 1, "", "mlp")), "8");
  EXPECT_EQ(lab::balance_text(lab::pipeline_stages(*cnn, 4, "", "cnn")), "4,5,2,1");
  // two stages: conv2 dominates, so the cut that balances best leaves both convolutions together
  EXPECT_EQ(lab::balance_text(lab::pipeline_stages(*cnn, 2, "", "cnn")), "9,3");
  EXPECT_EQ(lab::stage_map_text(*mlp, lab::pipeline_stages(*mlp, 3, "", "mlp")),
            "0: Flatten(), Linear(784, 256), BatchNorm1d(256), ReLU() | 1: Linear(256, 128), BatchNorm1d(128), ReLU() | "
            "2: Linear(128, 10)");
}

TEST(PipelineStages, BadSplitsAreRefusedByName) {
  auto mlp = model("mlp");
  auto message = [&](int stages, const std::string& balance) {
    try {
      lab::pipeline_stages(*mlp, stages, balance, "mlp");
    } catch (const lab::ConfigError& e) {
      return std::string(e.what()) + " | " + e.hint();
    }
    return std::string("no error");
  };
  EXPECT_NE(message(4, "").find("--stages 4: the mlp has 3 layers with matrix products"), std::string::npos)
      << message(4, "");
  EXPECT_NE(message(3, "2,0,6").find("stage 1 would be empty"), std::string::npos) << message(3, "2,0,6");
  EXPECT_NE(message(2, "2,2").find("covers 4 modules, the mlp has 8"), std::string::npos) << message(2, "2,2");
  EXPECT_NE(message(3, "4,4").find("gives 2 stages, --stages is 3"), std::string::npos);
  EXPECT_NE(message(2, "4,x").find("'x' is not a number"), std::string::npos);
  EXPECT_EQ(lab::balance_text(lab::pipeline_stages(*mlp, 4, "2,3,2,1", "mlp")), "2,3,2,1");
}

// ---- the model cut into ranges ----

// forward_range and backward_range chained over the stages are the whole model's forward and
// backward, bit for bit where every stage holds whole fused BatchNorm -> ReLU -> MaxPool runs (the
// automatic stage maps do). A cut inside the cnn's run (balance 2,3,7) computes it unfused: the
// same outputs, and BatchNorm's backward sums added in float blocks rather than the fused run's
// double, equal to rounding (bn_relu_pool.h).
TEST(PipelineStages, ChainedRangesAreTheWholeModel) {
  for (const char* name : {"mlp", "cnn"})
    for (const std::string& balance : {std::string(""), std::string(std::string(name) == "cnn" ? "2,3,7" : "2,3,3")}) {
      auto whole = model(name), cut = model(name);
      const auto stages = lab::pipeline_stages(*cut, 3, balance, name);
      lab::TorchGenerator g(7);
      lab::Tensor x({6, 1, 28, 28});
      g.uniform_(x.ptr(), x.numel(), -1.0, 1.0);
      const std::vector<int> labels{1, 3, 5, 7, 9, 0};
      lab::Tensor dlogits;
      lab::cross_entropy(whole->forward(x, lab::Mode::Train), labels, &dlogits, nullptr);
      const lab::Tensor logits = whole->forward(x, lab::Mode::Train);
      whole->zero_grad();
      whole->backward(dlogits);
      // the stages in turn
      std::vector<lab::Tensor> inputs{x};
      for (const auto& st : stages) inputs.push_back(cut->forward_range(st.begin, st.end, inputs.back(), lab::Mode::Train));
      // (each stage's modules keep only the last forward: forward again stage by stage for backward)
      EXPECT_EQ(inputs.back().data, logits.data) << name;
      cut->zero_grad();
      lab::Tensor dy = dlogits;
      for (size_t s = stages.size(); s-- > 0;) {
        cut->forward_range(stages[s].begin, stages[s].end, inputs[s], lab::Mode::Train);
        const lab::Tensor* dx = cut->backward_range(dy);
        if (s > 0) {
          ASSERT_NE(dx, nullptr);
          dy = *dx;
        } else {
          EXPECT_EQ(dx, nullptr);
        }
      }
      // (the forwards above ran each BatchNorm twice in train mode: compare gradients only)
      const auto a = whole->params(), b = cut->params();
      const bool splits_fused_run = balance == "2,3,7";
      for (size_t i = 0; i < a.size(); ++i) {
        if (!splits_fused_run) {
          EXPECT_EQ(a[i]->grad.data, b[i]->grad.data) << name << " " << balance << " " << i;
          continue;
        }
        double big = 0, worst = 0;
        for (size_t k = 0; k < a[i]->grad.data.size(); ++k) {
          big = std::max(big, std::fabs(static_cast<double>(a[i]->grad.data[k])));
          worst = std::max(worst, std::fabs(static_cast<double>(a[i]->grad.data[k]) - b[i]->grad.data[k]));
        }
        EXPECT_LT(worst, 1e-5 * big) << name << " " << balance << " " << i;
      }
    }
}

// ---- deferred BatchNorm ----

// DeferredBatchNorm._commit: mean = sum / n, var = sum_squares / n - mean^2 (biased), the running
// statistics moved by momentum once; inputs built to be exact in float32.
TEST(PipelineDeferredBatchNorm, CommitsTheMiniBatchsBiasedStatisticsOnce) {
  lab::BatchNormOptions o;
  o.num_features = 2;
  o.spatial_dims = 2;
  lab::BatchNorm bn(o);
  lab::DeferredBatchNormStats st;
  // two micro-batches (N=1, C=2, 1x2): channel 0 sees 1, 3 then 5, 7; channel 1 sees 0, 0 then 4, 4
  lab::Tensor a({1, 2, 1, 2}), b({1, 2, 1, 2});
  a.data = {1, 3, 0, 0};
  b.data = {5, 7, 4, 4};
  EXPECT_FALSE(st.track(a, 2));
  EXPECT_TRUE(st.track(b, 2));
  st.commit(bn);
  // channel 0: mean 4, biased var (1+9+25+49)/4 - 16 = 5; channel 1: mean 2, var 8 - 4 = 4
  EXPECT_FLOAT_EQ(bn.running_mean().value.data[0], 0.9f * 0.0f + 4.0f * 0.1f);
  EXPECT_FLOAT_EQ(bn.running_var().value.data[0], 0.9f + 5.0f * 0.1f);
  EXPECT_FLOAT_EQ(bn.running_mean().value.data[1], 0.2f);
  EXPECT_FLOAT_EQ(bn.running_var().value.data[1], 0.9f + 0.4f);
  EXPECT_EQ(bn.num_batches_tracked().i64, 1);
  EXPECT_EQ(st.tracked(), 0);
  EXPECT_EQ(st.counter(), 0);
  // fewer chunks than configured: nothing committed, the sums carry on
  EXPECT_FALSE(st.track(a, 2));
  EXPECT_EQ(st.counter(), 2);
  EXPECT_EQ(bn.num_batches_tracked().i64, 1);
}

// ---- whole runs ----

// One micro-batch: each stage runs its modules once on the whole batch, which is what one process
// computes: the same bits as --mode ddp on one rank, with and without BatchNorm.
TEST(PipelineRun, OneMicroBatchIsOneProcessBitForBit) {
  DTLAB_REQUIRE_DATASET();
  for (bool bn : {false, true}) {
    testutil::TempDir d0, d1;
    lab::RunConfig one = pipeline_run("mlp", 1, 1, d0.path());
    one.mode = "ddp";
    one.batchnorm = bn;
    lab::RunConfig pipe = pipeline_run("mlp", 3, 1, d1.path());
    pipe.batchnorm = bn;
    lab::Run a(one, lab::make_world), b(pipe, lab::make_world);
    a.run();
    b.run();
    const Apart x = apart(a.replica(0), b.replica(0));
    EXPECT_EQ(x.differ, 0u) << "batchnorm " << bn << ": " << x.rel;
  }
}

// Several micro-batches without BatchNorm: one loss over the mini-batch, so the gradient is the
// whole batch's, added up micro-batch by micro-batch: one process's to rounding.
TEST(PipelineRun, MicroBatchesWithoutBatchNormAreOneProcessToRounding) {
  DTLAB_REQUIRE_DATASET();
  testutil::TempDir d0, d1;
  lab::RunConfig one = pipeline_run("cnn", 1, 1, d0.path());
  one.mode = "ddp";
  one.batchnorm = false;
  lab::RunConfig pipe = pipeline_run("cnn", 4, 4, d1.path());
  pipe.batchnorm = false;
  lab::Run a(one, lab::make_world), b(pipe, lab::make_world);
  a.run();
  b.run();
  const Apart x = apart(a.replica(0), b.replica(0));
  EXPECT_GT(x.differ, 0u);  // the sums are cut differently
  EXPECT_LT(x.rel, 1e-5);
}

// GPipe and 1F1B run the same blocks in different orders; the micro-batches' gradients are added
// in one order either way: the same weights and running statistics, bit for bit, also with
// micro-batches of unequal size (torch.chunk of 30 into 4: 8, 8, 8, 6) and with deferred BatchNorm.
TEST(PipelineRun, GpipeAndOneFOneBGiveTheSameBits) {
  DTLAB_REQUIRE_DATASET();
  for (const char* name : {"mlp", "cnn"})
    for (bool deferred : {false, true}) {
      if (deferred && std::string(name) == "mlp") continue;  // PyTorch's DeferredBatchNorm refuses BatchNorm1d
      testutil::TempDir d0, d1;
      lab::RunConfig g = pipeline_run(name, 3, 4, d0.path());
      g.batch_size = 30;
      g.deferred_batch_norm = deferred;
      lab::RunConfig f = g;
      f.out_dir = d1.path();
      f.schedule = "1f1b";
      lab::Run a(g, lab::make_world), b(f, lab::make_world);
      a.run();
      b.run();
      const Apart x = apart(a.replica(0), b.replica(0));
      EXPECT_EQ(x.differ, 0u) << name << " deferred " << deferred << ": " << x.rel;
    }
}

// With BatchNorm, each micro-batch is normalized with its own statistics: the gradient of a
// pipeline step is that of DDP with M ranks and local BatchNorm, rank m holding micro-batch m
// (PARALLELISM.md), to rounding. The reference: M models, each forward and backward on its
// micro-batch with the loss scaled by its share, the gradients added.
TEST(PipelineRun, WithBatchNormAStepIsDdpOverTheMicroBatches) {
  DTLAB_REQUIRE_DATASET();
  testutil::TempDir d;
  lab::RunConfig c = pipeline_run("mlp", 3, 4, d.path());
  c.steps = 1;
  c.shuffle = false;
  lab::Run run(c, lab::make_world);
  run.run();
  // the first batch: samples 0..31 (no shuffle), micro-batches of 8
  const lab::Dataset train = lab::load_fashion_mnist(lab::kDefaultDataDir, true, c.limit_train);
  std::vector<float> ref;
  std::vector<std::vector<float>> grads;
  for (int m = 0; m < 4; ++m) {
    std::vector<int64_t> idx;
    for (int64_t i = 8 * m; i < 8 * m + 8; ++i) idx.push_back(i);
    lab::Tensor x;
    std::vector<int> labels;
    lab::gather_batch(train, idx, x, labels);
    auto r = model("mlp");
    r->forward_loss(x, labels, nullptr);
    r->zero_grad();
    r->backward_from_loss();
    const auto ps = r->params();
    if (grads.empty()) grads.resize(ps.size());
    for (size_t i = 0; i < ps.size(); ++i) {
      grads[i].resize(ps[i]->grad.data.size(), 0.0f);
      for (size_t k = 0; k < grads[i].size(); ++k) grads[i][k] += ps[i]->grad.data[k] / 4.0f;
    }
  }
  // every stage's gradient is on its own rank's model
  const size_t bounds[] = {0, 4, 7, 8};  // balance 4,3,1
  for (int s = 0; s < 3; ++s) {
    lab::Model& mine = run.replica(s);
    const auto layout = mine.param_layout();
    const auto ps = mine.params();
    for (size_t mod = bounds[s]; mod < bounds[s + 1]; ++mod)
      for (int k = 0; k < layout.count[mod]; ++k) {
        const size_t i = static_cast<size_t>(layout.first[mod] + k);
        double big = 0, worst = 0;
        for (size_t e = 0; e < grads[i].size(); ++e) {
          big = std::max(big, std::fabs(static_cast<double>(grads[i][e])));
          worst = std::max(worst, std::fabs(static_cast<double>(grads[i][e]) - ps[i]->grad.data[e]));
        }
        EXPECT_LT(worst, 1e-5 * big + 1e-9) << "stage " << s << " parameter " << i;
      }
  }
}

// summary.json's "pipeline": the stage map, the bubble (formula, the schedule's, measured) and the
// micro-batches in flight; the messages between stages are in the trace as sends.
TEST(PipelineRun, SummaryHasTheBubbleAndTheStageMap) {
  DTLAB_REQUIRE_DATASET();
  testutil::TempDir d;
  lab::RunConfig c = pipeline_run("cnn", 4, 8, d.path());
  c.schedule = "1f1b";
  lab::Run run(c, lab::make_world);
  run.run();
  const auto j = nlohmann::json::parse(testutil::read_file(d.file("summary.json")));
  const auto& p = j.at("pipeline");
  EXPECT_EQ(p.at("balance"), "4,5,2,1");
  EXPECT_NEAR(p.at("bubble").at("formula").get<double>(), 3.0 / 11.0, 1e-12);
  EXPECT_NEAR(p.at("bubble").at("schedule").get<double>(), 3.0 / 11.0, 1e-12);
  EXPECT_EQ(p.at("bubble").at("measured_per_step").size(), 4u);
  for (int s = 0; s < 4; ++s) EXPECT_EQ(p.at("stages")[static_cast<size_t>(s)].at("in_flight_peak"), 4 - s);
  EXPECT_NE(testutil::read_file(d.file("config.toml")).find("balance = \"4,5,2,1\""), std::string::npos);
  // activations: stage 0 holds 4 micro-batches at its peak, stage 3 one
  const auto& per_rank = j.at("memory").at("per_rank");
  EXPECT_GT(per_rank[0].at("peak").at("by_category").at("activations").get<int64_t>(),
            per_rank[3].at("peak").at("by_category").at("activations").get<int64_t>());
}

// ---- grids: data-parallel replicas of the pipeline (--dp) ----

// Megatron-LM's placement, tensor fastest, then data, then pipeline: each rank's three groups.
TEST(ProcessGroups, GridPlacementIsMegatrons) {
  const lab::GridShape g{2, 2, 2};  // dp, pp, tp
  EXPECT_EQ(g.size(), 8);
  for (int r = 0; r < 8; ++r) EXPECT_EQ(g.rank_of(g.coords(r)), r);
  EXPECT_EQ(g.tensor_group(5), (std::vector<int>{4, 5}));
  EXPECT_EQ(g.data_group(5), (std::vector<int>{5, 7}));
  EXPECT_EQ(g.pipeline_group(5), (std::vector<int>{1, 5}));
  const lab::GridShape pipe{2, 3, 1};
  EXPECT_EQ(pipe.pipeline_group(1), (std::vector<int>{1, 3, 5}));
  EXPECT_EQ(pipe.data_group(4), (std::vector<int>{4, 5}));
}

// A group of ranks 1 and 3 of a world of 4 runs the ring allreduce among them only; its events
// name the world's ranks and the group, while ranks 0 and 2 allreduce in their own group at the
// same time.
TEST(ProcessGroups, AGroupsAllreduceRunsAmongItsMembersAndRecordsWorldRanks) {
  labtest::RankWorld w(4);
  std::vector<std::vector<float>> out(4);
  const auto errors = w.run([&](int r, lab::Communicator& comm) {
    const std::vector<int> members = r % 2 ? std::vector<int>{1, 3} : std::vector<int>{0, 2};
    lab::GroupTransport g(comm.transport(), members, r % 2 ? "odd" : "even");
    auto sub = comm.sub(g);
    EXPECT_EQ(sub->rank(), r / 2);
    EXPECT_EQ(sub->world_size(), 2);
    std::vector<float> v(1000);
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(r * 1000 + static_cast<int>(i));
    sub->allreduce_sum(v.data(), v.size(), lab::CollectiveInfo{"x", 0});
    out[static_cast<size_t>(r)] = v;
  });
  for (const auto& e : errors) EXPECT_EQ(labtest::message_of(e), "");
  for (size_t i = 0; i < 1000; ++i) {
    EXPECT_EQ(out[1][i], static_cast<float>(1000 + 3000 + 2 * static_cast<int>(i)));
    EXPECT_EQ(out[3][i], out[1][i]);
    EXPECT_EQ(out[0][i], static_cast<float>(2000 + 2 * static_cast<int>(i)));
  }
  for (const lab::Event& e : w.events(3)) {
    EXPECT_STREQ(e.group, "odd");
    EXPECT_EQ(e.rank, 3);
    if (e.kind == lab::EventKind::Chunk) {
      EXPECT_EQ(e.dst, 1);
    }
  }
  EXPECT_THROW(lab::GroupTransport(w.world.transport(0), {1, 3}, "x"), lab::Error);  // rank 0 is no member
}

// Two replicas of a pipeline of 3 stages with one micro-batch each are DDP on two ranks (each
// replica's stages compute what one process does; each stage's gradients averaged over the
// replicas as DDP's buckets are): the same bits. With 4 micro-batches GPipe and 1F1B still agree.
TEST(PipelineRun, DataParallelReplicasOfAPipelineAreDdp) {
  DTLAB_REQUIRE_DATASET();
  testutil::TempDir d0, d1, d2, d3;
  lab::RunConfig ddp = pipeline_run("mlp", 2, 1, d0.path());
  ddp.mode = "ddp";
  lab::RunConfig grid = pipeline_run("mlp", 6, 1, d1.path());
  grid.dp = 2;
  grid.stages = 3;
  lab::Run a(ddp, lab::make_world), b(grid, lab::make_world);
  a.run();
  b.run();
  EXPECT_EQ(apart(a.replica(0), b.replica(0)).differ, 0u);
  // an epoch is a replica's shard of the training set, as a DDP rank's
  EXPECT_EQ(nlohmann::json::parse(testutil::read_file(d1.file("summary.json"))).at("steps_per_epoch"),
            nlohmann::json::parse(testutil::read_file(d0.file("summary.json"))).at("steps_per_epoch"));
  lab::RunConfig g4 = grid;
  g4.out_dir = d2.path();
  g4.microbatches = 4;
  lab::RunConfig f4 = g4;
  f4.out_dir = d3.path();
  f4.schedule = "1f1b";
  lab::Run c(g4, lab::make_world), e(f4, lab::make_world);
  c.run();
  e.run();
  EXPECT_EQ(apart(c.replica(0), e.replica(0)).differ, 0u);
  const auto j = nlohmann::json::parse(testutil::read_file(d2.file("summary.json")));
  EXPECT_EQ(j.at("pipeline").at("replica_ranks"), nlohmann::json::parse("[[0, 2, 4], [1, 3, 5]]"));
  EXPECT_GT(j.at("pipeline").at("bytes_per_iteration_by_group").at("dp").get<double>(), 0.0);
  EXPECT_GT(j.at("pipeline").at("bytes_per_iteration_by_group").at("pp").get<double>(), 0.0);
  // --stages x --dp must be the world size
  lab::RunConfig bad = grid;
  bad.world_size = 4;
  EXPECT_THROW(lab::validate(bad), lab::ConfigError);
}

// The three axes at once (--pp 2 --tp 2 --dp 2 on 8 ranks, Megatron-LM's placement): each stage's
// layers are Megatron's slices over its own two ranks (f and g inside the stage's blocks), the
// pipeline's messages go between the same slice of neighbouring stages, and each position's
// gradients are averaged over the replicas. With one micro-batch the pipeline computes what one
// process does, so the grid is --mode tensor --tp 2 --dp 2 bit for bit (which is DDP to rounding:
// test_tensor_parallel.cpp); with four micro-batches GPipe and 1F1B give the same bits.
TEST(PipelineRun, TensorParallelStagesInAGridAreTensorParallelism) {
  DTLAB_REQUIRE_DATASET();
  for (const char* name : {"mlp", "cnn"}) {
    SCOPED_TRACE(name);
    testutil::TempDir d0, d1, d2, d3;
    lab::RunConfig tensor = pipeline_run(name, 4, 1, d0.path());
    tensor.mode = "tensor";
    tensor.tp = 2;
    tensor.dp = 2;
    lab::RunConfig grid = pipeline_run(name, 8, 1, d1.path());
    grid.stages = 2;
    grid.tp = 2;
    grid.dp = 2;
    lab::Run a(tensor, lab::make_world), b(grid, lab::make_world);
    a.run();
    b.run();
    EXPECT_EQ(apart(a.replica(0), b.replica(0)).differ, 0u);
    lab::RunConfig g4 = grid;
    g4.out_dir = d2.path();
    g4.microbatches = 4;
    lab::RunConfig f4 = g4;
    f4.out_dir = d3.path();
    f4.schedule = "1f1b";
    lab::Run c(g4, lab::make_world), e(f4, lab::make_world);
    c.run();
    e.run();
    EXPECT_EQ(apart(c.replica(0), e.replica(0)).differ, 0u);
    const Apart x = apart(b.replica(0), c.replica(0));
    EXPECT_GT(x.differ, 0u) << "four micro-batches normalize BatchNorm per micro-batch: not the same run";
    // the grid's groups and what each kind carried
    const auto j = nlohmann::json::parse(testutil::read_file(d2.file("summary.json")));
    const auto& g = j.at("grid");
    EXPECT_EQ(g.at("groups").at("tp"), nlohmann::json::parse("[[0, 1], [2, 3], [4, 5], [6, 7]]"));
    EXPECT_EQ(g.at("groups").at("dp"), nlohmann::json::parse("[[0, 2], [1, 3], [4, 6], [5, 7]]"));
    EXPECT_EQ(g.at("groups").at("pp"), nlohmann::json::parse("[[0, 4], [1, 5], [2, 6], [3, 7]]"));
    for (const char* kind : {"dp", "pp", "tp"})
      EXPECT_GT(g.at("bytes_per_iteration_by_group").at(kind).get<double>(), 0.0) << kind;
    EXPECT_EQ(j.at("samples"), nlohmann::json::parse(testutil::read_file(d0.file("summary.json"))).at("samples"));
    // each rank's model states are (8+K) Psi_r, Psi_r the parameters of its stage's slices: the formula
    // per rank equals what the rank's memory accounting holds after the step
    const auto& mem = j.at("memory");
    ASSERT_EQ(mem.at("per_rank").size(), 8u);
    for (const auto& r : mem.at("per_rank")) {
      const auto& end = r.at("end_of_step");
      const auto& want = r.at("formula").at("model_states");
      for (const char* cat : {"parameters", "gradients", "optimizer_state"})
        EXPECT_EQ(end.at(cat), want.at(cat)) << "rank " << r.at("rank") << " " << cat;
      EXPECT_EQ(r.at("formula").at("psi"), mem.at("formula").at("psi_per_rank")[r.at("rank").get<size_t>()]);
    }
    EXPECT_LT(mem.at("formula").at("psi_per_rank")[0].get<int64_t>(), mem.at("formula").at("psi").get<int64_t>());
  }
  // --tp must divide the split layers; the world is stages x dp x tp, and follows them
  lab::RunConfig bad = pipeline_run("mlp", 6, 1, "");
  bad.stages = 2;
  bad.tp = 3;
  EXPECT_THROW(lab::validate(bad), lab::ConfigError);
  bad.tp = 2;
  try {
    lab::validate(bad);
    ADD_FAILURE() << "--stages 2 x --tp 2 on 6 ranks accepted";
  } catch (const lab::ConfigError& err) {
    EXPECT_NE(std::string(err.what()).find("--stages 2 x --dp 1 x --tp 2 with --world-size 6"), std::string::npos)
        << err.what();
  }
  EXPECT_EQ(commands::parse_command("run", {"--mode", "pipeline", "--pp", "2", "--tp", "2", "--dp", "2"}).run.world_size, 8);
}

// --init: rank 0 loads the file and every stage (and slice) starts from it, as one process does: a
// pipeline of one micro-batch from a trained model's state is one process from it, bit for bit.
TEST(PipelineRun, EveryStageStartsFromInit) {
  DTLAB_REQUIRE_DATASET();
  testutil::TempDir d0, d1, d2, d3;
  lab::RunConfig first = pipeline_run("cnn", 1, 1, d0.path());
  first.mode = "ddp";
  lab::Run(first, lab::make_world).run();
  const std::string init = d0.file("final.safetensors");
  lab::RunConfig one = pipeline_run("cnn", 1, 1, d1.path());
  one.mode = "ddp";
  one.init = init;
  one.seed = 7;  // (another seed's initial weights: only --init can make them agree)
  lab::RunConfig pipe = pipeline_run("cnn", 2, 1, d2.path());
  pipe.init = init;
  pipe.seed = 7;
  lab::RunConfig grid = pipeline_run("cnn", 4, 1, d3.path());
  grid.stages = 2;
  grid.tp = 2;
  grid.init = init;
  grid.seed = 7;
  lab::Run a(one, lab::make_world), b(pipe, lab::make_world), c(grid, lab::make_world);
  a.run();
  b.run();
  c.run();
  EXPECT_EQ(apart(a.replica(0), b.replica(0)).differ, 0u);
  EXPECT_LT(apart(a.replica(0), c.replica(0)).rel, 2e-4);  // (--tp: the row layers' rounding)
}

