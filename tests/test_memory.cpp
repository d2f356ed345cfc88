// Memory accounting (lab/core/memory.h): the bytes a rank holds by category at the points of a
// step, against exact sizes (the models' shapes) and the ZeRO paper's formulas.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "backends.h"
#include "fsdp.h"
#include "memory.h"
#include "model.h"
#include "run.h"
#include "run_format.h"
#include "run_wire.h"
#include "test_util.h"

namespace {

constexpr int64_t kMlpPsi = 235914;  // the mlp's parameters (tools/torch/dtlab_models.py)

nlohmann::json summary_of(const std::string& dir) {
  return nlohmann::json::parse(testutil::read_file(dir + "/summary.json"));
}

int64_t cat(const nlohmann::json& by, lab::MemoryCategory c) { return by.at(lab::memory_category_name(c)).get<int64_t>(); }

// A 4-rank mlp run with Adam (K = 8), and its summary's "memory".
nlohmann::json memory_of(const std::string& mode, const std::string& strategy, const std::string& wrap,
                         const std::string& dir, nlohmann::json* summary = nullptr) {
  lab::RunConfig c = testutil::small_run("mlp", 4, dir, 3);
  c.mode = mode;
  c.optimizer = "adam";
  c.lr = 1e-3;
  c.sharding_strategy = strategy;
  c.fsdp_wrap = wrap;
  c.record_memory = true;
  lab::Run run(c, lab::make_world);
  run.run();
  const nlohmann::json s = summary_of(dir);
  if (summary) *summary = s;
  return s.at("memory");
}

const nlohmann::json* point(const nlohmann::json& points, const std::string& at) {
  for (const nlohmann::json& p : points)
    if (p.at("at") == at) return &p;
  return nullptr;
}

int64_t bytes_at(const nlohmann::json& p, lab::MemoryCategory c) { return p.at("bytes").at(c).get<int64_t>(); }

}  // namespace

TEST(Memory, FormulasAreThePapersInFloat32) {
  lab::ZeroFormula f;
  f.psi = 1000;
  f.k = 8;
  f.world = 3;  // Psi / N = 333.3: rounded up to 334
  const int64_t want[4][3] = {{4000, 4000, 8000}, {4000, 4000, 2672}, {4000, 1336, 2672}, {1336, 1336, 2672}};
  for (int stage = 0; stage < 4; ++stage) {
    f.stage = stage;
    const lab::MemoryBytes b = f.model_states();
    EXPECT_EQ(b[lab::kMemParameters], want[stage][0]) << stage;
    EXPECT_EQ(b[lab::kMemGradients], want[stage][1]) << stage;
    EXPECT_EQ(b[lab::kMemOptimizerState], want[stage][2]) << stage;
    EXPECT_EQ(b.total(), b.model_states());
  }
  EXPECT_EQ(lab::optimizer_bytes_per_parameter(false, 0.0), 0);
  EXPECT_EQ(lab::optimizer_bytes_per_parameter(false, 0.9), 4);
  EXPECT_EQ(lab::optimizer_bytes_per_parameter(true, 0.0), 8);
}

TEST(Memory, TheLedgerKeepsTheStepsPointsAndTheRunsPeak) {
  lab::MemoryLedger ledger;
  ledger.sample("nothing measured");  // no measure yet: nothing recorded
  EXPECT_TRUE(ledger.points().empty());
  int64_t now = 100;
  ledger.set_measure([&] {
    lab::MemoryBytes b;
    b[lab::kMemActivations] = now;
    return b;
  });
  ledger.begin_step(0);
  ledger.sample("start");
  now = 300;
  ledger.sample("forward");
  now = 200;
  ledger.sample("end");
  ASSERT_EQ(ledger.points().size(), 3u);
  EXPECT_EQ(ledger.peak().point, "forward");
  EXPECT_EQ(ledger.peak_step(), 0);
  ledger.begin_step(1);
  EXPECT_TRUE(ledger.points().empty());
  now = 250;  // below the peak: the peak stays step 0's
  ledger.sample("forward");
  EXPECT_EQ(ledger.peak().bytes.total(), 300);
  EXPECT_EQ(ledger.last().bytes.total(), 250);
  now = 301;
  ledger.sample("backward");
  EXPECT_EQ(ledger.peak_step(), 1);
  EXPECT_EQ(ledger.peak().point, "backward");
}

// The mlp's activations for a batch of B, from its shapes: every module's output (Flatten B x 784,
// three of B x 256, three of B x 128, the logits B x 10), the inputs Linear and BatchNorm keep (B x
// 784, 256, 256, 128, 128), BatchNorm's mean and 1/std (2 x 256, 2 x 128), ReLU's byte masks
// (B x 256, B x 128) and the loss's gradient (B x 10): 14416 B + 3072 bytes.
TEST(Memory, ActivationsAreWhatTheTrainForwardSavedUntilBackwardUsesThem) {
  lab::ModelOptions mo;
  mo.name = "mlp";
  auto model = lab::build_model(mo, 0);
  const int64_t B = 16;
  lab::Tensor x({B, 1, 28, 28}, 0.5f);
  for (int64_t i = 0; i < x.numel(); ++i) x.data[static_cast<size_t>(i)] = static_cast<float>(i % 7) * 0.1f;
  std::vector<int> labels(static_cast<size_t>(B));
  for (int64_t i = 0; i < B; ++i) labels[static_cast<size_t>(i)] = static_cast<int>(i % 10);
  EXPECT_EQ(model->activation_bytes(), 0);
  model->forward_loss(x, labels, nullptr);
  EXPECT_EQ(model->activation_bytes(), 14416 * B + 3072);
  // backward releases them as it goes: never more after a module than before it, none at the end
  std::vector<int64_t> seen;
  lab::ModuleHooks hooks;
  hooks.after_backward = [&](size_t) { seen.push_back(model->activation_bytes()); };
  model->set_hooks(&hooks);
  model->zero_grad();
  model->backward_from_loss();
  model->set_hooks(nullptr);
  ASSERT_EQ(seen.size(), 7u);  // modules 7 down to 1 (Flatten needs no backward)
  EXPECT_TRUE(std::is_sorted(seen.rbegin(), seen.rend())) << "activations grew during backward";
  EXPECT_LT(seen.front(), 14416 * B + 3072);
  EXPECT_EQ(model->activation_bytes(), 0);
  // an eval forward saves nothing
  model->forward(x, lab::Mode::Eval);
  EXPECT_EQ(model->activation_bytes(), 0);
}

// DDP holds every model state whole: (8+K) Psi, exactly, and its gradient buckets (4 Psi) besides.
TEST(Memory, DdpHoldsThePapersStageZeroAndItsBuckets) {
  if (!testutil::have_dataset()) GTEST_SKIP() << "Fashion-MNIST not installed";
  testutil::TempDir d;
  const nlohmann::json m = memory_of("ddp", "full_shard", "model", d.path());
  EXPECT_EQ(m.at("formula").at("zero_stage"), 0);
  EXPECT_EQ(m.at("formula").at("expression"), "(8+K)Psi");
  EXPECT_EQ(m.at("formula").at("psi"), kMlpPsi);
  ASSERT_EQ(m.at("per_rank").size(), 4u);
  for (const nlohmann::json& r : m.at("per_rank")) {
    const nlohmann::json& end = r.at("end_of_step");
    EXPECT_EQ(cat(end, lab::kMemParameters), 4 * kMlpPsi);
    EXPECT_EQ(cat(end, lab::kMemGradients), 4 * kMlpPsi);
    EXPECT_EQ(cat(end, lab::kMemOptimizerState), 8 * kMlpPsi);
    EXPECT_EQ(cat(end, lab::kMemCommBuffers), 4 * kMlpPsi);  // the buckets, kept between steps
    EXPECT_EQ(cat(end, lab::kMemActivations), 0);
    EXPECT_EQ(cat(end, lab::kMemGatheredParameters), 0);
    // the peak is the forward's end, with a batch of 16's activations
    EXPECT_EQ(r.at("peak").at("at"), "forward");
    EXPECT_EQ(cat(r.at("peak").at("by_category"), lab::kMemActivations), 14416 * 16 + 3072);
  }
}

// ZeRO-1: each rank keeps the optimizer state of its own partition only: 8 bytes per element it
// owns, 8 Psi over the ranks; parameters and gradients stay whole.
TEST(Memory, ZeroShardsTheOptimizerStateByItsPartition) {
  if (!testutil::have_dataset()) GTEST_SKIP() << "Fashion-MNIST not installed";
  testutil::TempDir d;
  nlohmann::json s;
  const nlohmann::json m = memory_of("zero", "full_shard", "model", d.path(), &s);
  EXPECT_EQ(m.at("formula").at("zero_stage"), 1);
  int64_t total = 0;
  for (size_t r = 0; r < 4; ++r) {
    const nlohmann::json& end = m.at("per_rank").at(r).at("end_of_step");
    const int64_t owned = s.at("zero").at("partition").at(r).at("elements").get<int64_t>();
    EXPECT_EQ(cat(end, lab::kMemOptimizerState), 8 * owned) << r;
    EXPECT_EQ(cat(end, lab::kMemParameters), 4 * kMlpPsi);
    EXPECT_EQ(cat(end, lab::kMemGradients), 4 * kMlpPsi);
    total += cat(end, lab::kMemOptimizerState);
  }
  EXPECT_EQ(total, 8 * kMlpPsi);
  // the uneven split: rank 0 owns 1.weight (200704 elements) alone, far above Psi / 4
  EXPECT_EQ(cat(m.at("per_rank").at(0).at("end_of_step"), lab::kMemOptimizerState), 8 * 200704);
}

// FSDP full_shard (ZeRO-3), one unit: between steps a rank holds (8+K) Psi / N (Psi / N rounded up:
// the shard with its padding); the whole parameters exist only between an all-gather and the
// free after the unit's forward or backward; the peak is the reduce-scatter, when the unsharded
// gradient, its padded flat copy and the gathered parameters are all held.
TEST(Memory, FullShardHoldsShardsBetweenStepsAndGathersOneUnitAtATime) {
  if (!testutil::have_dataset()) GTEST_SKIP() << "Fashion-MNIST not installed";
  const int64_t S = (kMlpPsi + 3) / 4;
  {
    testutil::TempDir d;
    const nlohmann::json m = memory_of("fsdp", "full_shard", "model", d.path());
    EXPECT_EQ(m.at("formula").at("zero_stage"), 3);
    const lab::MemoryBytes f = [&] {
      lab::ZeroFormula z{3, kMlpPsi, 8, 4};
      return z.model_states();
    }();
    for (const nlohmann::json& r : m.at("per_rank")) {
      const nlohmann::json& end = r.at("end_of_step");
      EXPECT_EQ(cat(end, lab::kMemParameters), f[lab::kMemParameters]);
      EXPECT_EQ(cat(end, lab::kMemGradients), f[lab::kMemGradients]);
      EXPECT_EQ(cat(end, lab::kMemOptimizerState), f[lab::kMemOptimizerState]);
      EXPECT_EQ(cat(end, lab::kMemGatheredParameters) + cat(end, lab::kMemCommBuffers), 0);
      const nlohmann::json& pts = r.at("peak_step_points");
      const nlohmann::json* fwd = point(pts, "forward: all-gather model");
      const nlohmann::json* after = point(pts, "forward");
      const nlohmann::json* bwd = point(pts, "backward: all-gather model");
      const nlohmann::json* rs = point(pts, "backward: reduce-scatter model");
      ASSERT_TRUE(fwd && after && bwd && rs) << pts.dump();
      EXPECT_EQ(bytes_at(*fwd, lab::kMemGatheredParameters), 4 * kMlpPsi);
      EXPECT_EQ(bytes_at(*after, lab::kMemGatheredParameters), 0);  // freed after forward
      EXPECT_EQ(bytes_at(*bwd, lab::kMemGatheredParameters), 4 * kMlpPsi);
      EXPECT_EQ(bytes_at(*rs, lab::kMemGradients), 4 * kMlpPsi + 4 * S);
      EXPECT_EQ(bytes_at(*rs, lab::kMemCommBuffers), 4 * 4 * S);  // the padded flat gradient
      EXPECT_EQ(r.at("peak").at("at"), "backward: reduce-scatter model");
    }
  }
  // --fsdp-wrap layer: one unit gathered at a time, so the gathered bytes never pass the largest
  // unit (1.weight and 1.bias: 200960 elements)
  testutil::TempDir d;
  const nlohmann::json m = memory_of("fsdp", "full_shard", "layer", d.path());
  lab::ModelOptions mo;
  mo.name = "mlp";
  auto model = lab::build_model(mo, 0);
  const auto units = lab::fsdp_units(lab::param_names(*model), lab::param_numels(*model), "layer", 4);
  int64_t shards = 0, largest = 0;
  for (const lab::FsdpUnit& u : units) shards += u.shard, largest = std::max(largest, u.numel);
  EXPECT_EQ(largest, 200960);
  for (const nlohmann::json& r : m.at("per_rank")) {
    const nlohmann::json& end = r.at("end_of_step");
    EXPECT_EQ(cat(end, lab::kMemParameters), 4 * shards);
    // within the units' padding of the formula: at most W - 1 elements a unit
    EXPECT_LE(4 * shards - 4 * S, int64_t{4} * 3 * static_cast<int64_t>(units.size()));
    int gathers = 0;
    for (const nlohmann::json& p : r.at("peak_step_points")) {
      EXPECT_LE(bytes_at(p, lab::kMemGatheredParameters), 4 * largest) << p.dump();
      const std::string at = p.at("at");
      if (at.rfind("forward: all-gather ", 0) == 0) {
        const std::string name = at.substr(20);
        const auto u = std::find_if(units.begin(), units.end(), [&](const lab::FsdpUnit& x) { return x.name == name; });
        ASSERT_NE(u, units.end()) << at;
        EXPECT_EQ(bytes_at(p, lab::kMemGatheredParameters), 4 * u->numel) << at;  // only this unit
        ++gathers;
      }
    }
    EXPECT_EQ(gathers, static_cast<int>(units.size()));
    EXPECT_EQ(cat(r.at("peak").at("by_category"), lab::kMemGatheredParameters), 4 * largest);
  }
}

// shard_grad_op (ZeRO-2) keeps the gathered parameters from forward to backward: the paper's 4 Psi
// of whole parameters during the step, shards of the rest; no_shard is DDP's model states.
TEST(Memory, ShardGradOpHoldsWholeParametersThroughTheStepAndNoShardIsDdp) {
  if (!testutil::have_dataset()) GTEST_SKIP() << "Fashion-MNIST not installed";
  const int64_t S = (kMlpPsi + 3) / 4;
  {
    testutil::TempDir d;
    const nlohmann::json m = memory_of("fsdp", "shard_grad_op", "model", d.path());
    EXPECT_EQ(m.at("formula").at("zero_stage"), 2);
    const nlohmann::json& f = m.at("formula").at("model_states");
    for (const nlohmann::json& r : m.at("per_rank")) {
      const nlohmann::json* fwd = point(r.at("peak_step_points"), "forward");
      ASSERT_TRUE(fwd);
      EXPECT_EQ(bytes_at(*fwd, lab::kMemGatheredParameters), cat(f, lab::kMemParameters));  // 4 Psi
      const nlohmann::json& end = r.at("end_of_step");
      EXPECT_EQ(cat(end, lab::kMemGradients), cat(f, lab::kMemGradients));
      EXPECT_EQ(cat(end, lab::kMemOptimizerState), cat(f, lab::kMemOptimizerState));
      EXPECT_EQ(cat(end, lab::kMemGradients), 4 * S);
      EXPECT_EQ(cat(end, lab::kMemGatheredParameters), 0);  // resharded after backward
    }
  }
  testutil::TempDir d;
  const nlohmann::json m = memory_of("fsdp", "no_shard", "model", d.path());
  EXPECT_EQ(m.at("formula").at("zero_stage"), 0);
  for (const nlohmann::json& r : m.at("per_rank")) {
    const nlohmann::json& end = r.at("end_of_step");
    EXPECT_EQ(cat(end, lab::kMemParameters), 4 * kMlpPsi);
    EXPECT_EQ(cat(end, lab::kMemGradients), 4 * kMlpPsi);
    EXPECT_EQ(cat(end, lab::kMemOptimizerState), 8 * kMlpPsi);
    const nlohmann::json* ar = point(r.at("peak_step_points"), "backward: allreduce model");
    ASSERT_TRUE(ar);
    EXPECT_EQ(bytes_at(*ar, lab::kMemCommBuffers), 4 * kMlpPsi);  // the flat gradient while it is allreduced
    EXPECT_EQ(cat(end, lab::kMemCommBuffers), 0);
  }
}

// --record-memory writes every step's points to metrics.jsonl (start first, end last); without it
// they are not written. They cross processes (MPI ranks) in the rank report.
TEST(Memory, MetricsCarryTheCurveOnlyWhenAskedAndTheReportCarriesIt) {
  if (!testutil::have_dataset()) GTEST_SKIP() << "Fashion-MNIST not installed";
  for (bool record : {true, false}) {
    testutil::TempDir d;
    lab::RunConfig c = testutil::small_run("mlp", 2, d.path(), 2);
    c.record_memory = record;
    lab::Run run(c, lab::make_world);
    run.run();
    std::ifstream in(d.file("metrics.jsonl"));
    std::string line;
    int steps = 0;
    while (std::getline(in, line)) {
      const nlohmann::json j = nlohmann::json::parse(line);
      if (j.at("kind") != "step") continue;
      ++steps;
      EXPECT_EQ(j.contains("memory"), record) << line.substr(0, 200);
      if (!record) continue;
      const lab::StepRecord r = lab::step_record_from_json(j);
      ASSERT_GE(r.memory.size(), 4u);
      EXPECT_EQ(r.memory.front().point, "start");
      EXPECT_EQ(r.memory.back().point, "end");
      EXPECT_EQ(r.memory.back().bytes[lab::kMemParameters], 4 * kMlpPsi);
    }
    EXPECT_EQ(steps, 4);
    EXPECT_EQ(summary_of(d.path()).at("memory").at("per_rank").size(), 2u);  // either way
  }
  lab::RankReport rep;
  rep.records.resize(1);
  rep.records[0].memory.resize(1);
  rep.records[0].memory[0].point = "backward: reduce-scatter 4";
  for (int c = 0; c < lab::kMemCategories; ++c) rep.records[0].memory[0].bytes[c] = (int64_t{1} << 33) + c;
  const lab::RankReport back =
      lab::decode_rank_report(lab::encode_rank_report(rep), 1, [](const std::string& s) {
        static std::set<std::string> names;  // (the events' names: this report has none)
        return names.insert(s).first->c_str();
      });
  ASSERT_EQ(back.records.size(), 1u);
  ASSERT_EQ(back.records[0].memory.size(), 1u);
  EXPECT_EQ(back.records[0].memory[0].point, "backward: reduce-scatter 4");
  for (int c = 0; c < lab::kMemCategories; ++c) EXPECT_EQ(back.records[0].memory[0].bytes[c], (int64_t{1} << 33) + c);
}
