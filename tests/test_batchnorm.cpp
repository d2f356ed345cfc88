// BatchNorm1d / BatchNorm2d / SyncBatchNorm against PyTorch (tests/fixtures/nn_batchnorm.json from
// tools/fixtures/gen_nn.py) and against docs/semantics.md's rules.
//
// Tolerances: the lab mirrors PyTorch's CPU arithmetic (double per-channel sums, float mean and
// variance, y = x * alpha + beta), so differences are a few float32 ulps of O(1) values: rtol 1e-5
// plus atol 1e-6 for outputs near zero. SyncBN combines per-rank (mean, var, count) instead of
// summing the concatenated batch, and the per-rank weight gradients come from float64 sums in the
// generator: rtol 1e-5, atol 1e-5.
//
// Sections: fixture cases (local BN) | SEMANTICS worked example | batch-of-one | SyncBN (threads)
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <thread>

#include "batchnorm.h"
#include "errors.h"
#include "nn_fixture.h"

using nnfix::close;
using nnfix::floats;
using nnfix::json;

namespace {

constexpr double kRtol = 1e-5;
constexpr double kAtol = 1e-6;

const json& bn_fixture() { return nnfix::load("nn_batchnorm.json"); }

lab::BatchNormOptions options_of(const json& c) {
  lab::BatchNormOptions o;
  o.num_features = static_cast<int>(c["shape"][1].get<int64_t>());
  o.spatial_dims = c["dims"].get<int>() == 2 ? 2 : 0;
  if (c.contains("momentum")) {
    if (c["momentum"].is_null()) o.momentum.reset();
    else o.momentum = c["momentum"].get<double>();
  }
  if (c.contains("track")) o.track_running_stats = c["track"];
  return o;
}

}  // namespace

// ---- fixture cases: train steps, running stats, backward, eval ----

TEST(BatchNorm, MatchesTorchTrainEvalBackward) {
  for (const auto& c : bn_fixture()["cases"]) {
    SCOPED_TRACE(c["name"].get<std::string>());
    const std::vector<int64_t> shape = nnfix::shape(c["shape"]);
    lab::BatchNorm bn(options_of(c));
    bn.weight().value.data = floats(c["weight"]);
    bn.bias().value.data = floats(c["bias"]);
    const bool track = c["track"];
    EXPECT_EQ(bn.buffers().size(), track ? 3u : 0u);
    EXPECT_EQ(bn.params().size(), 2u);
    lab::Tensor y, dx;
    int step = 0;
    for (const auto& s : c["steps"]) {
      SCOPED_TRACE("train step " + std::to_string(++step));
      const lab::Tensor x = nnfix::tensor(s["x"], shape);
      bn.forward(x, y, lab::Mode::Train);
      EXPECT_EQ(y.shape, shape);
      EXPECT_TRUE(close(y, floats(s["y"]), kRtol, kAtol));
      EXPECT_EQ(bn.last_stats().count, x.numel() / shape[1]);
      if (track) {
        EXPECT_TRUE(close(bn.running_mean().value, floats(s["running_mean"]), kRtol, kAtol));
        EXPECT_TRUE(close(bn.running_var().value, floats(s["running_var"]), kRtol, kAtol));
        EXPECT_EQ(bn.num_batches_tracked().i64, s["num_batches_tracked"].get<int64_t>());
      }
      if (s.contains("dy")) {
        bn.backward(nnfix::tensor(s["dy"], shape), &dx);
        EXPECT_TRUE(close(dx, floats(s["dx"]), kRtol, kAtol));
        EXPECT_TRUE(close(bn.weight().grad, floats(s["dweight"]), kRtol, kAtol));
        EXPECT_TRUE(close(bn.bias().grad, floats(s["dbias"]), kRtol, kAtol));
      }
    }
    // Eval: running statistics (or batch statistics without them); no buffer changes.
    const std::vector<float> rm = bn.running_mean().value.data, rv = bn.running_var().value.data;
    const int64_t nbt = bn.num_batches_tracked().i64;
    bn.forward(nnfix::tensor(c["eval"]["x"], shape), y, lab::Mode::Eval);
    EXPECT_TRUE(close(y, floats(c["eval"]["y"]), kRtol, kAtol)) << "eval";
    EXPECT_EQ(bn.running_mean().value.data, rm);
    EXPECT_EQ(bn.running_var().value.data, rv);
    EXPECT_EQ(bn.num_batches_tracked().i64, nbt);
  }
}

TEST(BatchNorm, DescribeAndKind) {
  lab::BatchNormOptions o;
  o.num_features = 32;
  o.spatial_dims = 2;
  EXPECT_EQ(lab::BatchNorm(o).describe(), "BatchNorm2d(32)");
  o.spatial_dims = 0;
  o.momentum.reset();
  o.track_running_stats = false;
  EXPECT_EQ(lab::BatchNorm(o).describe(), "BatchNorm1d(32, momentum=None, track_running_stats=False)");
  EXPECT_EQ(lab::BatchNorm(o).kind(), "BatchNorm1d");
}

// ---- docs/semantics.md's worked example ----

TEST(BatchNorm, SemanticsWorkedExample) {
  lab::BatchNormOptions o;
  o.num_features = 1;
  lab::BatchNorm bn(o);
  lab::Tensor x({2, 1}), y;
  x.data = {0.0f, 2.0f};
  bn.forward(x, y, lab::Mode::Train);
  EXPECT_NEAR(y.data[0], -0.999995f, 1e-6);
  EXPECT_NEAR(y.data[1], 0.999995f, 1e-6);
  EXPECT_FLOAT_EQ(bn.running_mean().value.data[0], 0.1f);
  EXPECT_FLOAT_EQ(bn.running_var().value.data[0], 1.1f);  // unbiased: var 2 for n = 2
  EXPECT_EQ(bn.num_batches_tracked().i64, 1);
  EXPECT_FLOAT_EQ(bn.last_stats().var[0], 1.0f);         // biased: normalizes with 1
  EXPECT_FLOAT_EQ(bn.last_stats().mean[0], 1.0f);
  // Eval neither counts nor changes buffers.
  bn.forward(x, y, lab::Mode::Eval);
  EXPECT_EQ(bn.num_batches_tracked().i64, 1);
  EXPECT_FLOAT_EQ(bn.running_mean().value.data[0], 0.1f);
}

// ---- the batch-of-one rule ----

namespace {

std::string batch_of_one_message(lab::BatchNorm& bn, const std::vector<int64_t>& shape, lab::Mode mode,
                                 std::string* hint = nullptr) {
  lab::Tensor x(shape, 0.5f), y;
  try {
    bn.forward(x, y, mode);
  } catch (const lab::TrainingError& e) {
    if (hint) *hint = e.hint();
    return e.what();
  }
  return "";
}

lab::BatchNorm make_bn(int c, int spatial_dims, bool track = true) {
  lab::BatchNormOptions o;
  o.num_features = c;
  o.spatial_dims = spatial_dims;
  o.track_running_stats = track;
  return lab::BatchNorm(o);
}

}  // namespace

TEST(BatchNorm, BatchOfOneRaisesPyTorchsError) {
  lab::BatchNorm bn1 = make_bn(4, 0);
  std::string hint;
  EXPECT_EQ(batch_of_one_message(bn1, {1, 4}, lab::Mode::Train, &hint),
            "Expected more than 1 value per channel when training, got input size torch.Size([1, 4])");
  EXPECT_NE(hint.find("drop_last"), std::string::npos) << hint;
  EXPECT_NE(hint.find("last"), std::string::npos) << hint;
  bn1.set_error_hint("the last batch of epoch 3 has 1 sample (60001 = 234 * 256 + 1)");
  batch_of_one_message(bn1, {1, 4}, lab::Mode::Train, &hint);
  EXPECT_EQ(hint, "the last batch of epoch 3 has 1 sample (60001 = 234 * 256 + 1)");

  lab::BatchNorm bn2 = make_bn(4, 2);
  EXPECT_EQ(batch_of_one_message(bn2, {1, 4, 1, 1}, lab::Mode::Train),
            "Expected more than 1 value per channel when training, got input size torch.Size([1, 4, 1, 1])");
  EXPECT_EQ(batch_of_one_message(bn2, {1, 4, 2, 2}, lab::Mode::Train), "");  // n = 4 values per channel
  EXPECT_EQ(batch_of_one_message(bn2, {2, 4, 1, 1}, lab::Mode::Train), "");

  // Eval with running statistics is fine with one sample; without them it uses batch statistics
  // and raises like training does.
  EXPECT_EQ(batch_of_one_message(bn1, {1, 4}, lab::Mode::Eval), "");
  lab::BatchNorm untracked = make_bn(4, 0, false);
  EXPECT_EQ(batch_of_one_message(untracked, {1, 4}, lab::Mode::Eval),
            "Expected more than 1 value per channel when training, got input size torch.Size([1, 4])");
}

// ---- SyncBatchNorm over emulated ranks ----

namespace {

// A BnSync over threads in one process: each collective is write-my-slot, barrier, read, barrier.
// The barrier times out (and throws) so a broken test fails instead of hanging.
class ThreadBnSync : public lab::BnSync {
 public:
  struct World {
    explicit World(int n) : size(n), slots(static_cast<size_t>(n)) {}
    int size;
    std::mutex mu;
    std::condition_variable cv;
    int arrived = 0;
    uint64_t generation = 0;
    std::vector<std::vector<float>> slots;
    int calls = 0;  // collectives entered, summed over ranks
  };
  ThreadBnSync(World& w, int rank) : m_world(w), m_rank(rank) {}
  int world_size() const override { return m_world.size; }

  void allgather(const float* mine, int n, std::vector<float>& all) override {
    publish(mine, n);
    barrier();
    all.clear();
    {
      std::lock_guard<std::mutex> lk(m_world.mu);
      for (const auto& s : m_world.slots) all.insert(all.end(), s.begin(), s.end());
    }
    barrier();
  }

  void allreduce_sum(float* data, int n) override {
    publish(data, n);
    barrier();
    {
      std::lock_guard<std::mutex> lk(m_world.mu);
      for (int i = 0; i < n; ++i) {
        float s = 0.0f;
        for (const auto& slot : m_world.slots) s += slot[static_cast<size_t>(i)];  // rank order
        data[i] = s;
      }
    }
    barrier();
  }

 private:
  void publish(const float* v, int n) {
    std::lock_guard<std::mutex> lk(m_world.mu);
    m_world.slots[static_cast<size_t>(m_rank)].assign(v, v + n);
    ++m_world.calls;
  }
  void barrier() {
    std::unique_lock<std::mutex> lk(m_world.mu);
    const uint64_t gen = m_world.generation;
    if (++m_world.arrived == m_world.size) {
      m_world.arrived = 0;
      ++m_world.generation;
      m_world.cv.notify_all();
      return;
    }
    if (!m_world.cv.wait_for(lk, std::chrono::seconds(10), [&] { return m_world.generation != gen; }))
      throw std::runtime_error("ThreadBnSync: barrier timed out on rank " + std::to_string(m_rank));
  }
  World& m_world;
  int m_rank;
};

struct RankResult {
  lab::Tensor y, dx;
  std::vector<float> running_mean, running_var, dweight, dbias;
  int64_t nbt = 0;
  lab::BnBatchStats stats;
  std::string error;
};

// Runs one Train forward (+ backward when dy_all is given) of a SyncBN layer on `counts.size()`
// ranks; rank r holds rows [sum(counts[:r]), + counts[r]) of x_all.
//   x_all, dy_all: (sum(counts), C, ...)
std::vector<RankResult> run_sync(const lab::BatchNormOptions& opt, const std::vector<float>& weight,
                                 const std::vector<float>& bias, const lab::Tensor& x_all, const lab::Tensor* dy_all,
                                 const std::vector<int>& counts) {
  const int world = static_cast<int>(counts.size());
  ThreadBnSync::World w(world);
  std::vector<RankResult> out(static_cast<size_t>(world));
  const int64_t row = x_all.numel() / x_all.dim(0);
  std::vector<std::thread> threads;
  int64_t start = 0;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r, start] {
      RankResult& res = out[static_cast<size_t>(r)];
      try {
        ThreadBnSync sync(w, r);
        lab::BatchNorm bn(opt);
        bn.set_sync(&sync);
        bn.weight().value.data = weight;
        bn.bias().value.data = bias;
        std::vector<int64_t> shape = x_all.shape;
        shape[0] = counts[static_cast<size_t>(r)];
        lab::Tensor x(shape);
        std::copy(x_all.data.begin() + start * row, x_all.data.begin() + (start + shape[0]) * row, x.data.begin());
        bn.forward(x, res.y, lab::Mode::Train);
        if (dy_all) {
          lab::Tensor dy(shape);
          std::copy(dy_all->data.begin() + start * row, dy_all->data.begin() + (start + shape[0]) * row,
                    dy.data.begin());
          bn.backward(dy, &res.dx);
        }
        res.running_mean = bn.running_mean().value.data;
        res.running_var = bn.running_var().value.data;
        res.dweight = bn.weight().grad.data;
        res.dbias = bn.bias().grad.data;
        res.nbt = bn.num_batches_tracked().i64;
        res.stats = bn.last_stats();
      } catch (const std::exception& e) {
        res.error = e.what();
      }
    });
    start += counts[static_cast<size_t>(r)];
  }
  for (auto& t : threads) t.join();
  return out;
}

std::vector<float> slice(const std::vector<float>& all, int64_t row, int64_t start, int64_t count) {
  return {all.begin() + start * row, all.begin() + (start + count) * row};
}

}  // namespace

TEST(SyncBatchNorm, UnequalRanksMatchConcatenatedBatch) {
  for (const auto& c : bn_fixture()["sync"]) {
    SCOPED_TRACE(c["name"].get<std::string>());
    const std::vector<int64_t> shape = nnfix::shape(c["shape"]);
    const std::vector<int> counts = c["counts"].get<std::vector<int>>();
    const lab::Tensor x = nnfix::tensor(c["x"], shape), dy = nnfix::tensor(c["dy"], shape);
    const std::vector<RankResult> res = run_sync(options_of(c), floats(c["weight"]), floats(c["bias"]), x, &dy, counts);
    const int64_t row = x.numel() / shape[0];
    const int64_t inner = row / shape[1];
    const std::vector<float> y_all = floats(c["y"]), dx_all = floats(c["dx"]);
    int64_t start = 0;
    for (size_t r = 0; r < counts.size(); ++r) {
      SCOPED_TRACE("rank " + std::to_string(r) + " with " + std::to_string(counts[r]) + " samples");
      const RankResult& got = res[r];
      ASSERT_EQ(got.error, "");
      EXPECT_TRUE(close(got.y, slice(y_all, row, start, counts[r]), 1e-5, 1e-5));
      EXPECT_TRUE(close(got.dx, slice(dx_all, row, start, counts[r]), 1e-5, 1e-5));
      EXPECT_TRUE(close(got.running_mean, floats(c["running_mean"]), 1e-5, 1e-6));
      EXPECT_TRUE(close(got.running_var, floats(c["running_var"]), 1e-5, 1e-6));  // unbiased over the global count
      EXPECT_TRUE(close(got.dweight, floats(c["dweight_per_rank"][r]), 1e-5, 1e-5));
      EXPECT_TRUE(close(got.dbias, floats(c["dbias_per_rank"][r]), 1e-5, 1e-5));
      EXPECT_EQ(got.nbt, 1);
      EXPECT_EQ(got.stats.count, shape[0] * inner);
      EXPECT_EQ(got.stats.local_count, counts[r] * inner);
      // Every rank combines the same gathered rows in the same order: bitwise identical stats.
      EXPECT_EQ(got.running_mean, res[0].running_mean);
      EXPECT_EQ(got.running_var, res[0].running_var);
      EXPECT_EQ(got.stats.mean, res[0].stats.mean);
      start += counts[r];
    }
  }
}

TEST(SyncBatchNorm, GlobalBatchOfOneRaisesOnEveryRank) {
  lab::BatchNormOptions o;
  o.num_features = 3;
  lab::Tensor x({1, 3}, 0.25f);
  const std::vector<RankResult> res = run_sync(o, {1, 1, 1}, {0, 0, 0}, x, nullptr, {0, 1, 0});
  for (const RankResult& r : res)
    EXPECT_EQ(r.error, "Expected more than 1 value per channel when training, got input size torch.Size([1, 3])");
}

TEST(SyncBatchNorm, EvalNeverCommunicates) {
  ThreadBnSync::World w(2);  // a second rank that never arrives: any collective would time out
  ThreadBnSync sync(w, 0);
  for (bool track : {true, false}) {
    lab::BatchNorm bn = make_bn(3, 0, track);
    bn.set_sync(&sync);
    lab::Tensor x({4, 3}, 1.0f), y;
    x.data[0] = 3.0f;
    bn.forward(x, y, lab::Mode::Eval);
  }
  EXPECT_EQ(w.calls, 0);
}

TEST(SyncBatchNorm, WorldOfOneIsLocalBatchNorm) {
  ThreadBnSync::World w(1);
  ThreadBnSync sync(w, 0);
  lab::BatchNorm bn = make_bn(1, 0);
  bn.set_sync(&sync);
  lab::Tensor x({2, 1}), y, dx;
  x.data = {0.0f, 2.0f};
  bn.forward(x, y, lab::Mode::Train);
  bn.backward(y, &dx);
  EXPECT_EQ(w.calls, 0);
  EXPECT_NEAR(y.data[1], 0.999995f, 1e-6);
  EXPECT_EQ(batch_of_one_message(bn, {1, 1}, lab::Mode::Train),
            "Expected more than 1 value per channel when training, got input size torch.Size([1, 1])");
}
