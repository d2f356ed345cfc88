// --mode zero: DDP with ZeroRedundancyOptimizer (ZeRO-1; lab/modes/zero.h). Its partition is
// PyTorch 1.13's; its parameters are DDP's, bitwise, with SGD and Adam on 2, 3 and 4 ranks, per
// parameter and as buckets; each rank keeps and checkpoints only its own partition's state; and
// its traffic is DDP's allreduce plus one broadcast of every parameter per step.
// (Step-for-step parity with PyTorch's ZeroRedundancyOptimizer on gloo: tests/test_parity.cpp's
// *_zero* cases, written by tools/parity/parity.py.)
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "backends.h"
#include "model.h"
#include "run.h"
#include "safetensors.h"
#include "test_util.h"
#include "zero.h"

namespace {

std::vector<int64_t> elements_per_rank(const std::string& model, int world) {
  lab::ModelOptions mo;
  mo.name = model;
  auto m = lab::build_model(mo, 0);
  const std::vector<int64_t> numels = lab::param_numels(*m);
  std::vector<int64_t> out;
  for (const std::vector<int>& r : lab::zero_partition(numels, world)) {
    int64_t n = 0;
    for (int i : r) n += numels[static_cast<size_t>(i)];
    out.push_back(n);
  }
  return out;
}

}  // namespace

// _partition_parameters: sorted by numel, largest first, stable (ties keep registration order);
// each to the first rank with the smallest total. Built to show both tie rules.
TEST(ZeroPartition, LargestFirstStableToTheFirstSmallestRank) {
  // sorted: 1 (5), 2 (5), 0 (3), 4 (3), 3 (1); totals r0 5, r1 5 -> 0 to r0 (tie: the lower rank)
  // -> 8, 5 -> 4 to r1 -> 8, 8 -> 3 to r0
  EXPECT_EQ(lab::zero_partition({3, 5, 5, 1, 3}, 2), (std::vector<std::vector<int>>{{1, 0, 3}, {2, 4}}));
  EXPECT_EQ(lab::zero_partition({7}, 3), (std::vector<std::vector<int>>{{0}, {}, {}}));
}

// The element counts PyTorch 1.13 gives (ZeroRedundancyOptimizer on gloo, measured: the mlp's
// fc1.weight alone on one rank).
TEST(ZeroPartition, OurModelsSplitAsPyTorchSplitsThem) {
  EXPECT_EQ(elements_per_rank("mlp", 2), (std::vector<int64_t>{200704, 35210}));
  EXPECT_EQ(elements_per_rank("mlp", 4), (std::vector<int64_t>{200704, 32768, 1280, 1162}));
  EXPECT_EQ(elements_per_rank("cnn", 2), (std::vector<int64_t>{401408, 20330}));
}

// The gradient is DDP's allreduced one and every update is elementwise: every rank's parameters
// and buffers are DDP's bits (PyTorch 1.13 measures the same), with SGD + momentum and Adam, on 2,
// 3 and 4 ranks, per parameter and as one bucket per rank.
TEST(ZeroMode, EveryRankHoldsDdpsBitsWithSgdAndAdam) {
  DTLAB_REQUIRE_DATASET();
  for (int world : {2, 3, 4})
    for (const char* optimizer : {"sgd", "adam"}) {
      auto config = [&](const std::string& mode, bool bucket, const std::string& out) {
        lab::RunConfig c = testutil::small_run("mlp", world, out, 0);
        c.mode = mode;
        c.steps = 6;
        c.epochs = 0;
        c.optimizer = optimizer;
        if (c.optimizer == "sgd") c.momentum = 0.9;
        else c.lr = 1e-3;
        c.parameters_as_bucket_view = bucket;
        return c;
      };
      testutil::TempDir d0;
      lab::Run ddp(config("ddp", false, d0.path()), lab::make_world);
      ddp.run();
      for (bool bucket : {false, true}) {
        testutil::TempDir d1;
        lab::Run zero(config("zero", bucket, d1.path()), lab::make_world);
        zero.run();
        const std::string what = std::to_string(world) + " ranks, " + optimizer + (bucket ? ", bucket view" : "");
        for (int r = 0; r < world; ++r) {
          const auto a = ddp.replica(r).state_dict(), b = zero.replica(r).state_dict();
          ASSERT_EQ(a.size(), b.size());
          for (size_t i = 0; i < a.size(); ++i) {
            const std::vector<float>& x = a[i].param ? a[i].param->value.data : a[i].buffer->value.data;
            const std::vector<float>& y = b[i].param ? b[i].param->value.data : b[i].buffer->value.data;
            EXPECT_EQ(x, y) << what << ", rank " << r << ", " << a[i].name;
          }
        }
      }
    }
}

// Each rank's checkpoint holds the optimizer state of its own parameters only (the state is
// sharded); the summary names the partition; the traffic is DDP's gradient allreduce plus, per
// step, one chained broadcast of every parameter: (N - 1) x 4 bytes per element over all ranks.
TEST(ZeroMode, StateIsShardedAndTheSyncBroadcastsEveryParameterOnce) {
  DTLAB_REQUIRE_DATASET();
  testutil::TempDir dir;
  lab::RunConfig c = testutil::small_run("mlp", 3, dir.path(), 0);
  c.mode = "zero";
  c.optimizer = "adam";
  c.lr = 1e-3;
  c.steps = 4;
  c.epochs = 0;
  c.checkpoint_every = 2;
  lab::Run(c, lab::make_world).run();
  const nlohmann::json s = nlohmann::json::parse(testutil::read_file(dir.file("summary.json")));
  const auto& part = s.at("zero").at("partition");
  ASSERT_EQ(part.size(), 3u);
  EXPECT_EQ(part[0]["parameters"], nlohmann::json({"1.weight"}));
  EXPECT_EQ(part[1]["parameters"], nlohmann::json({"4.weight"}));
  EXPECT_EQ(part[0]["elements"].get<int64_t>() + part[1]["elements"].get<int64_t>() + part[2]["elements"].get<int64_t>(),
            s.at("model").at("parameters").get<int64_t>());
  for (int r = 0; r < 3; ++r) {
    const std::string f = dir.file("checkpoints/step-00000002/rank" + std::to_string(r) + ".safetensors");
    std::vector<std::string> optim;
    for (const lab::SafeTensor& t : lab::read_safetensors(f))
      if (t.name.rfind("optim.", 0) == 0) optim.push_back(t.name);
    std::vector<std::string> want;
    for (const char* st : {"exp_avg", "exp_avg_sq"})
      for (const auto& p : part[static_cast<size_t>(r)]["parameters"]) want.push_back(std::string("optim.") + st + "." + p.get<std::string>());
    std::sort(optim.begin(), optim.end());
    std::sort(want.begin(), want.end());
    EXPECT_EQ(optim, want) << "rank " << r;
  }
  const int64_t bytes = s.at("model").at("parameter_bytes").get<int64_t>();
  const auto& by = s.at("traffic").at("by_what");
  EXPECT_EQ(by.at("zero params").at("bytes_moved").get<int64_t>(), 4 * 2 * bytes) << "4 steps x (N-1) x the parameters";
  EXPECT_EQ(by.at("grad bucket").at("bytes_moved").get<int64_t>(), 4 * 2 * 2 * bytes / 3 * 3)
      << "4 steps x N ranks x 2(N-1)/N of the gradients";
}
