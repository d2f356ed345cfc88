// DDP semantics against PyTorch's own DistributedDataParallel (tools/fixtures/gen_ddp.py: gloo,
// one process per rank, Fashion-MNIST) and PyTorch's bucket assignment (gen_buckets.py).
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <thread>

#include "backends.h"
#include "communicator.h"
#include "ddp.h"
#include "optim.h"
#include "run.h"
#include "test_util.h"
#include "torch_compare.h"
#include "threads/transport_threads.h"
#include "torch_rng.h"

namespace {

std::vector<std::vector<int>> as_lists(const nlohmann::json& j) { return j.get<std::vector<std::vector<int>>>(); }

}  // namespace

TEST(DdpBuckets, AssignmentMatchesPyTorch) {
  const auto fx = testutil::load_fixture("buckets.json");
  ASSERT_EQ(fx["first_bucket_bytes"].get<size_t>(), lab::kDefaultFirstBucketBytes);
  for (const auto& c : fx["cases"]) {
    const auto bytes = c["param_bytes"].get<std::vector<size_t>>();
    std::vector<int> order;
    for (int i = static_cast<int>(bytes.size()) - 1; i >= 0; --i) order.push_back(i);
    const size_t cap = static_cast<size_t>(c["bucket_cap_mb"].get<double>() * 1024 * 1024);
    EXPECT_EQ(lab::compute_bucket_assignment(bytes, order, {lab::kDefaultFirstBucketBytes, cap}), as_lists(c["rebuilt"]))
        << c["model"] << " cap " << c["bucket_cap_mb"];
  }
}

// The reducer starts with one bucket and rebuilds after the first backward, as PyTorch does.
TEST(DdpBuckets, ReducerRebuildsAfterFirstIteration) {
  const auto fx = testutil::load_fixture("buckets.json");
  for (const auto& c : fx["cases"]) {
    if (c["model"] != "cnn") continue;
    const double cap_mb = c["bucket_cap_mb"].get<double>();
    const int world = 2;
    lab::ThreadsWorld tw(world);
    std::vector<std::vector<std::vector<int>>> before(world), after(world);
    std::vector<std::thread> threads;
    for (int r = 0; r < world; ++r) {
      threads.emplace_back([&, r] {
        lab::ModelOptions o;
        o.name = "cnn";
        auto model = lab::build_model(o, 0);
        lab::Communicator comm(tw.transport(r), nullptr);
        lab::DdpReducer reducer(*model, comm, cap_mb);
        before[static_cast<size_t>(r)] = reducer.buckets();
        lab::Tensor x({4, 1, 28, 28});
        lab::TorchGenerator g(static_cast<uint64_t>(r));
        g.uniform_(x.ptr(), x.numel(), -1, 1);
        std::vector<int> y = {0, 1, 2, 3};
        lab::Tensor dl;
        const lab::Tensor& logits = model->forward(x, lab::Mode::Train);
        lab::cross_entropy(logits, y, &dl, nullptr);
        reducer.prepare_for_backward();
        model->backward(dl, [&](int i) { reducer.mark_param_ready(i); });
        reducer.finalize_backward();
        after[static_cast<size_t>(r)] = reducer.buckets();
      });
    }
    for (auto& t : threads) t.join();
    for (int r = 0; r < world; ++r) {
      EXPECT_EQ(before[static_cast<size_t>(r)], as_lists(c["initial"]));
      EXPECT_EQ(after[static_cast<size_t>(r)], as_lists(c["rebuilt"])) << "cap " << cap_mb;
    }
  }
}

namespace {

using torchcmp::Compare;
using torchcmp::compare_state;

// The tolerances of torchcmp::compare_state (torch_compare.h), and why:
// Tolerances: float32 training for a handful of SGD steps with momentum, where PyTorch's gloo and
// dtlab's ring add the ranks' gradients in different orders and the kernels sum in different
// orders: differences start at 1 ulp and grow over the steps to about 1e-5 on weights of ~0.05.
//
// `scale` widens them for ill-conditioned cases: BatchNorm1d over a per-rank batch of two divides by
// the spread of two values, which amplifies rounding. Measured on mlp_w4_bcast (a last batch of 2
// per rank) after that step: PyTorch float32 vs PyTorch float64 differ by 6.0e-4 on 1.weight,
// dtlab vs float64 by 1.6e-4, dtlab vs PyTorch float32 by 5.9e-4; before it, dtlab and PyTorch
// agree to 1e-8. Such cases get scale 20.

// 20 when some rank trains BatchNorm1d on a batch of two (see compare_state), else 1.
double tolerance_scale(const nlohmann::json& c) {
  const int64_t per_rank = c["limit_train"].get<int64_t>() / c["world_size"].get<int64_t>();
  const int64_t tail = per_rank % c["batch_size"].get<int64_t>();
  return c["model"] == "mlp" && tail > 0 && tail <= 2 ? 20.0 : 1.0;
}

lab::RunConfig config_for(const nlohmann::json& fx, const nlohmann::json& c, const std::string& out) {
  lab::RunConfig cfg;
  cfg.model = c["model"];
  cfg.world_size = c["world_size"];
  cfg.batch_size = c["batch_size"];
  cfg.limit_train = c["limit_train"];
  cfg.limit_test = c["limit_test"];
  cfg.steps = c["steps"];
  cfg.epochs = 0;  // --steps alone: as many epochs as it takes
  cfg.broadcast_buffers = c["broadcast_buffers"];
  cfg.lr = fx["lr"];
  cfg.momentum = fx["momentum"];
  cfg.weight_decay = fx["weight_decay"];
  cfg.seed = fx["seed"];
  cfg.threads = 1;
  cfg.out_dir = out;
  cfg.timeout_s = 30;
  return cfg;
}

// losses[rank][step] from metrics.jsonl
std::vector<std::vector<double>> read_losses(const std::string& path, int world) {
  std::vector<std::vector<double>> losses(static_cast<size_t>(world));
  std::ifstream f(path);
  std::string line;
  while (std::getline(f, line)) {
    const auto j = nlohmann::json::parse(line);
    if (j["kind"] != "step") continue;
    auto& l = losses[j["rank"].get<size_t>()];
    EXPECT_EQ(static_cast<int64_t>(l.size()), j["step"].get<int64_t>()) << "metrics out of order";
    l.push_back(j["loss"].get<double>());
  }
  return losses;
}

}  // namespace

// Local BatchNorm, broadcast_buffers on and off, 2 and 4 ranks: every rank's losses and final
// parameters and buffers (running statistics, num_batches_tracked) equal PyTorch DDP's.
TEST(DdpTorch, LocalBatchNormAndBufferBroadcastMatchPyTorch) {
  DTLAB_REQUIRE_DATASET();
  const auto fx = testutil::load_fixture("ddp.json");
  for (const auto& [name, c] : fx["cases"].items()) {
    SCOPED_TRACE(name);
    testutil::TempDir tmp;
    lab::RunConfig cfg = config_for(fx, c, tmp.path());
    cfg.bn = "local";
    lab::Run run(cfg, lab::make_world);
    run.run();
    Compare cmp;
    const auto losses = read_losses(tmp.file("metrics.jsonl"), cfg.world_size);
    for (int r = 0; r < cfg.world_size; ++r) {
      const auto& want = c["ranks"][static_cast<size_t>(r)];
      const auto& wl = want["losses"];
      ASSERT_EQ(losses[static_cast<size_t>(r)].size(), wl.size());
      for (size_t s = 0; s < wl.size(); ++s)
        cmp.check("rank " + std::to_string(r) + " loss step " + std::to_string(s), losses[static_cast<size_t>(r)][s],
                  wl[s].get<double>(), 1e-5, 1e-4);
      compare_state(run.replica(r), want["state"], cmp, "rank " + std::to_string(r), tolerance_scale(c));
    }
    EXPECT_TRUE(cmp.mismatches.empty()) << "max |diff| " << cmp.max_abs << "; first mismatches:\n"
                                        << ::testing::PrintToString(cmp.mismatches);
    EXPECT_GT(cmp.checked, 100);
  }
}

// Without broadcast_buffers the ranks' running statistics differ; with it, the evaluation forward
// after training makes them rank 0's.
TEST(DdpTorch, BufferBroadcastDecidesWhetherRanksAgree) {
  const auto fx = testutil::load_fixture("ddp.json");
  for (const char* name : {"mlp_w2_bcast", "mlp_w2_nobcast"}) {
    const auto& c = fx["cases"][name];
    const double a = c["ranks"][0]["state"]["2.running_mean"]["sum"];
    const double b = c["ranks"][1]["state"]["2.running_mean"]["sum"];
    if (c["broadcast_buffers"]) EXPECT_EQ(a, b) << name;
    else EXPECT_NE(a, b) << name;
  }
}

// With SyncBatchNorm, N ranks with batch B train like one process with batch N x B: compared with
// PyTorch's single process on the same global batches, and with dtlab's own single rank.
TEST(DdpTorch, SyncBatchNormEqualsOneProcessOnTheGlobalBatch) {
  DTLAB_REQUIRE_DATASET();
  const auto fx = testutil::load_fixture("ddp.json");
  for (const char* name : {"mlp_w2_bcast", "mlp_w4_bcast", "cnn_w2_bcast"}) {
    SCOPED_TRACE(name);
    const auto& c = fx["cases"][name];
    const auto& want = c["single_process_global_batch"];
    testutil::TempDir tmp, tmp1;
    lab::RunConfig cfg = config_for(fx, c, tmp.path());
    cfg.bn = "sync";
    lab::Run run(cfg, lab::make_world);
    run.run();
    Compare cmp;
    const auto losses = read_losses(tmp.file("metrics.jsonl"), cfg.world_size);
    for (size_t s = 0; s < want["losses"].size(); ++s) {
      double mean = 0;  // equal per-rank batches: the global mean loss is the mean of rank losses
      for (int r = 0; r < cfg.world_size; ++r) mean += losses[static_cast<size_t>(r)][s] / cfg.world_size;
      cmp.check("loss step " + std::to_string(s), mean, want["losses"][s].get<double>(), 1e-5, 1e-4);
    }
    for (int r = 0; r < cfg.world_size; ++r)
      compare_state(run.replica(r), want["state"], cmp, "rank " + std::to_string(r), tolerance_scale(c));

    // dtlab with one rank and batch N x B sees the same sample sets per step (the DistributedSampler
    // permutation is the same; the ranks' strided shards of a step cover a contiguous slice of it).
    lab::RunConfig one = cfg;
    one.world_size = 1;
    one.batch_size = cfg.batch_size * cfg.world_size;
    one.out_dir = tmp1.path();
    lab::Run run1(one, lab::make_world);
    run1.run();
    compare_state(run1.replica(0), want["state"], cmp, "one rank", tolerance_scale(c));
    EXPECT_TRUE(cmp.mismatches.empty()) << "max |diff| " << cmp.max_abs << "; first mismatches:\n"
                                        << ::testing::PrintToString(cmp.mismatches);
  }
}
