// --nondeterministic never leaves two runs bitwise equal without saying so.
//
// Layers: which reductions it reorders, and that it changes only the order of additions. A
// reduction needs at least three partial sums to be order-sensitive (two add the same either
// way: a + b == b + a in IEEE float):
//   Linear's weight and bias gradients      partials: blocks of samples; N >= 3
//   BatchNorm1d's per-channel sums          partials: blocks of samples; N >= 3
//   Conv2d's weight and bias gradients      partials: samples, or chunks of a sample's positions;
//   BatchNorm2d's sums (plain and fused)    every batch, even of one sample
// Runs: each configuration class run twice with the flag ends with different weights, and twice
// without it with the same bits; the one class where nothing can be reordered is refused.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <set>

#include "backends.h"
#include "batchnorm.h"
#include "bn_relu_pool.h"
#include "conv2d.h"
#include "errors.h"
#include "float_compare.h"
#include "linear.h"
#include "parallel.h"
#include "run.h"
#include "test_util.h"

namespace {

// --nondeterministic and the compute threads for one test, as they were afterwards.
struct FlagScope {
  explicit FlagScope(bool on, int threads = 1) {
    lab::set_nondeterministic(on);
    lab::set_compute_threads(threads);
  }
  ~FlagScope() {
    lab::set_nondeterministic(false);
    lab::set_compute_threads(1);
  }
};

lab::Tensor random_tensor(std::vector<int64_t> shape, uint32_t seed) {
  lab::Tensor t(std::move(shape));
  t.data = testutil::randn(t.data.size(), seed);
  return t;
}

std::vector<float> concat(const std::vector<lab::Param*>& params) {
  std::vector<float> out;
  for (const lab::Param* p : params) out.insert(out.end(), p->grad.data.begin(), p->grad.data.end());
  return out;
}

// Runs `grads` (one backward from zeroed gradients; returns them) once in the default order and
// `tries` times with --nondeterministic. Returns how many bitwise different results the flag gave;
// every one of them equals the default's up to rounding (1e-5 of the largest gradient).
int distinct_results(const std::function<std::vector<float>()>& grads, int tries, int threads = 1) {
  std::vector<float> reference;
  {
    FlagScope off(false, threads);
    reference = grads();
  }
  double scale = 0;
  for (float v : reference) scale = std::max(scale, std::fabs(static_cast<double>(v)));
  FlagScope on(true, threads);
  std::set<std::vector<uint32_t>> seen;
  for (int i = 0; i < tries; ++i) {
    const std::vector<float> g = grads();
    EXPECT_EQ(g.size(), reference.size());
    std::vector<uint32_t> key;
    for (size_t j = 0; j < g.size(); ++j) {
      EXPECT_LE(std::fabs(static_cast<double>(g[j]) - reference[j]), 1e-5 * scale) << "element " << j;
      key.push_back(testutil::bits(g[j]));
    }
    seen.insert(key);
  }
  return static_cast<int>(seen.size());
}

std::function<std::vector<float>()> linear_grads(int n) {
  auto layer = std::make_shared<lab::Linear>(40, 24);
  lab::TorchGenerator g(1);
  layer->reset_parameters(g);
  auto x = std::make_shared<lab::Tensor>(random_tensor({n, 40}, 2));
  auto dy = std::make_shared<lab::Tensor>(random_tensor({n, 24}, 3));
  return [=] {
    lab::Tensor y, dx;
    layer->forward(*x, y, lab::Mode::Train);
    for (lab::Param* p : layer->params()) p->grad.zero();
    layer->backward(*dy, &dx);
    return concat(layer->params());
  };
}

std::function<std::vector<float>()> conv_grads(int n) {
  auto layer = std::make_shared<lab::Conv2d>(3, 4, 3, 1, true);
  lab::TorchGenerator g(1);
  layer->reset_parameters(g);
  auto x = std::make_shared<lab::Tensor>(random_tensor({n, 3, 6, 6}, 2));
  auto dy = std::make_shared<lab::Tensor>(random_tensor({n, 4, 6, 6}, 3));
  return [=] {
    lab::Tensor y, dx;
    layer->forward(*x, y, lab::Mode::Train);
    for (lab::Param* p : layer->params()) p->grad.zero();
    layer->backward(*dy, &dx);
    std::vector<float> out = concat(layer->params());
    out.insert(out.end(), dx.data.begin(), dx.data.end());  // dx: no reduction over the batch, any order
    return out;
  };
}

std::function<std::vector<float>()> batchnorm_grads(std::vector<int64_t> shape, bool fused) {
  lab::BatchNormOptions o;
  o.num_features = static_cast<int>(shape[1]);
  o.spatial_dims = shape.size() == 4 ? 2 : 0;
  auto bn = std::make_shared<lab::BatchNorm>(o);
  auto pool = std::make_shared<lab::BnReluPool>();
  auto x = std::make_shared<lab::Tensor>(random_tensor(shape, 2));
  std::vector<int64_t> out_shape = shape;
  if (fused) out_shape[2] /= 2, out_shape[3] /= 2;
  auto dy = std::make_shared<lab::Tensor>(random_tensor(out_shape, 3));
  return [=] {
    lab::Tensor y, dx;
    for (lab::Param* p : bn->params()) p->grad.zero();
    if (fused) {
      pool->forward(*bn, *x, y, lab::Mode::Train);
      pool->backward(*bn, *dy, &dx);
    } else {
      bn->forward(*x, y, lab::Mode::Train);
      bn->backward(*dy, &dx);
    }
    std::vector<float> out = concat(bn->params());
    out.insert(out.end(), dx.data.begin(), dx.data.end());  // through the global sums
    return out;
  };
}

}  // namespace

TEST(NondeterministicReductions, LinearReordersFromThreeSamples) {
  EXPECT_EQ(distinct_results(linear_grads(1), 32), 1) << "one partial";
  EXPECT_EQ(distinct_results(linear_grads(2), 64), 1) << "two partials: a + b == b + a";
  EXPECT_GT(distinct_results(linear_grads(3), 64), 1);
  EXPECT_GT(distinct_results(linear_grads(64), 64), 1);
}

TEST(NondeterministicReductions, BatchNorm1dReordersFromThreeSamples) {
  EXPECT_EQ(distinct_results(batchnorm_grads({2, 8}, false), 64), 1) << "two partials: a + b == b + a";
  EXPECT_GT(distinct_results(batchnorm_grads({3, 8}, false), 64), 1);
  EXPECT_GT(distinct_results(batchnorm_grads({32, 8}, false), 64), 1);
}

TEST(NondeterministicReductions, ConvAndBatchNorm2dReorderEvenOneSample) {
  EXPECT_GT(distinct_results(conv_grads(1), 64), 1) << "four chunks of the sample's positions";
  EXPECT_GT(distinct_results(conv_grads(2), 64), 1);
  EXPECT_GT(distinct_results(conv_grads(8), 64), 1);
  EXPECT_GT(distinct_results(batchnorm_grads({1, 4, 6, 6}, false), 64), 1);
  EXPECT_GT(distinct_results(batchnorm_grads({1, 4, 8, 8}, true), 64), 1) << "the fused BatchNorm2d -> ReLU -> MaxPool2d";
  EXPECT_GT(distinct_results(batchnorm_grads({6, 4, 8, 8}, true), 64), 1);
}

TEST(NondeterministicReductions, SeveralComputeThreadsAddAtomically) {
  EXPECT_GT(distinct_results(conv_grads(8), 64, 2), 1);
  EXPECT_GT(distinct_results(linear_grads(16), 64, 2), 1);
  EXPECT_GT(distinct_results(batchnorm_grads({6, 4, 8, 8}, true), 64, 2), 1);
}

TEST(NondeterministicReductions, ThePartialsCoverEveryContributionOnce) {
  for (const auto& [samples, positions] : std::vector<std::pair<int64_t, int64_t>>{
           {1, 1}, {2, 1}, {3, 1}, {64, 1}, {1, 784}, {2, 196}, {3, 784}, {5, 2}, {2, 2}}) {
    const lab::ReductionSplit s = lab::split_reduction(samples, positions);
    std::vector<int> covered(static_cast<size_t>(samples * positions), 0);
    for (int64_t p = 0; p < s.count(); ++p) {
      int64_t s0, s1, i0, i1;
      s.range(p, s0, s1, i0, i1);
      for (int64_t a = s0; a < s1; ++a)
        for (int64_t i = i0; i < i1; ++i) ++covered[static_cast<size_t>(a * positions + i)];
    }
    for (int c : covered) ASSERT_EQ(c, 1) << samples << " x " << positions;
    // three partials whenever there are three contributions
    EXPECT_GE(s.count(), std::min<int64_t>(3, samples * positions)) << samples << " x " << positions;
  }
  std::vector<int64_t> order;
  lab::arrival_order(8, order);
  std::vector<int64_t> sorted = order;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(sorted, (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7}));
}

// ---- runs: every configuration class ----

namespace {

struct RunClass {
  std::string name;
  std::function<void(lab::RunConfig&)> set;
};

std::string final_weights(lab::RunConfig c, const std::string& dir, bool nd) {
  c.out_dir = dir;
  c.nondeterministic = nd;
  lab::Run(c, lab::make_world).run();
  return testutil::read_file(dir + "/final.safetensors");
}

class NondeterministicRun : public ::testing::TestWithParam<RunClass> {
 protected:
  void TearDown() override {
    lab::set_nondeterministic(false);
    lab::set_compute_threads(1);
  }
};

}  // namespace

TEST_P(NondeterministicRun, TwoRunsDifferWithTheFlagAndAgreeWithout) {
  DTLAB_REQUIRE_DATASET();
  lab::RunConfig c = testutil::small_run("mlp", 1, "", 4);
  GetParam().set(c);
  testutil::TempDir a, b, x, y;
  EXPECT_EQ(final_weights(c, a.path(), false), final_weights(c, b.path(), false)) << "the default is reproducible";
  EXPECT_NE(final_weights(c, x.path(), true), final_weights(c, y.path(), true))
      << "two runs with --nondeterministic ended bitwise equal";
}

INSTANTIATE_TEST_SUITE_P(
    Classes, NondeterministicRun,
    ::testing::Values(
        RunClass{"mlp_one_rank_one_thread", [](lab::RunConfig&) {}},
        RunClass{"mlp_one_rank_two_threads", [](lab::RunConfig& c) { c.threads = 2; }},
        RunClass{"mlp_batch_of_three", [](lab::RunConfig& c) { c.batch_size = 3; }},
        RunClass{"cnn_one_rank_one_thread", [](lab::RunConfig& c) { c.model = "cnn"; c.batch_size = 8; c.steps = 3; }},
        RunClass{"cnn_one_rank_two_threads",
                 [](lab::RunConfig& c) { c.model = "cnn"; c.batch_size = 8; c.steps = 3; c.threads = 2; }},
        RunClass{"cnn_batch_of_one", [](lab::RunConfig& c) { c.model = "cnn"; c.batch_size = 1; c.steps = 3; }},
        RunClass{"mlp_four_ranks_ring", [](lab::RunConfig& c) { c.world_size = 4; }},
        RunClass{"mlp_four_ranks_tree", [](lab::RunConfig& c) { c.world_size = 4; c.allreduce = "tree"; }},
        RunClass{"mlp_four_ranks_naive", [](lab::RunConfig& c) { c.world_size = 4; c.allreduce = "naive"; }},
        RunClass{"mlp_four_ranks_bn_sync", [](lab::RunConfig& c) { c.world_size = 4; c.bn = "sync"; }},
        RunClass{"cnn_two_ranks_bn_local",
                 [](lab::RunConfig& c) { c.model = "cnn"; c.world_size = 2; c.batch_size = 8; c.steps = 2; }},
        RunClass{"cnn_two_ranks_bn_sync",
                 [](lab::RunConfig& c) { c.model = "cnn"; c.world_size = 2; c.batch_size = 8; c.steps = 2; c.bn = "sync"; }},
        RunClass{"mlp_dp_four_devices", [](lab::RunConfig& c) { c.mode = "dp"; c.world_size = 4; c.batch_size = 32; }},
        RunClass{"mlp_local_sgd",
                 [](lab::RunConfig& c) { c.mode = "local-sgd"; c.world_size = 4; c.average_every = 2; c.steps = 5; }},
        RunClass{"mlp_async_seeded", [](lab::RunConfig& c) {
                   c.mode = "async";
                   c.world_size = 4;
                   c.async_schedule = "seeded";
                   c.async_seed = 3;
                   c.steps = 0;
                   c.epochs = 1;           // one epoch: the parameter server's end is the data's end
                   c.limit_train = 128;  // 2 batches per worker
                 }}),
    [](const ::testing::TestParamInfo<RunClass>& info) { return info.param.name; });

// The one class that cannot be made non-reproducible is refused before anything runs, saying why
// and what would make the flag work.
TEST(NondeterministicRun, TheMlpWithTwoSamplesPerRankIsRefused) {
  lab::RunConfig c = testutil::small_run("mlp", 4, "", 4);
  c.batch_size = 2;
  c.nondeterministic = true;
  try {
    lab::Run(c, lab::make_world);
    FAIL() << "expected a ConfigError";
  } catch (const lab::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("--nondeterministic has no effect"), std::string::npos) << e.what();
    EXPECT_NE(e.hint().find("--batch-size 3 or more"), std::string::npos) << e.hint();
  }
}
