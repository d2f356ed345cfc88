// build_model ("mlp", "cnn") against PyTorch (tests/fixtures/nn_model.json from
// tools/fixtures/gen_nn.py): initial weights bit for bit, one training step (loss, logits,
// gradients), three SGD steps (momentum 0.9, weight_decay 5e-4) and eval logits; plus the Model
// plumbing (state_dict names and order, gradient-ready hooks, copy_state, errors).
//
// Tolerances: initialization must be exact (same generator, same draws). A training step runs
// thousands-long float32 dot products in a different order than PyTorch (OpenBLAS vs MKL-DNN
// style kernels), then BatchNorm divides by small batch deviations, so agreement is ~1e-6
// relative, not bitwise: losses rtol 1e-5; logits, gradient norms and gradient/weight probes
// rtol 1e-4 with an absolute floor scaled to the tensor's typical magnitude (some gradients, e.g.
// a Linear bias followed by BatchNorm, are pure rounding noise of size ~1e-9 in both programs).
#include <gtest/gtest.h>

#include <cmath>

#include "errors.h"
#include "model.h"
#include "nn_fixture.h"
#include "optim.h"
#include "torch_rng.h"

using nnfix::close;
using nnfix::floats;
using nnfix::json;

namespace {

const json& model_fixture() { return nnfix::load("nn_model.json"); }

std::unique_ptr<lab::Model> build(const std::string& name, uint64_t seed) {
  lab::ModelOptions o;
  o.name = name;
  return lab::build_model(o, seed);
}

double norm_of(const std::vector<float>& v) {
  double s = 0.0;
  for (float e : v) s += static_cast<double>(e) * e;
  return std::sqrt(s);
}

double sum_of(const std::vector<float>& v) {
  double s = 0.0;
  for (float e : v) s += e;
  return s;
}

// Compares a tensor with gen_nn.py's summary(): L2 norm and probed values.
void expect_summary(const std::string& what, const lab::Tensor& t, const json& want) {
  SCOPED_TRACE(what);
  EXPECT_EQ(t.shape, nnfix::shape(want["shape"]));
  const double norm = want["norm"];
  EXPECT_NEAR(norm_of(t.data), norm, 1e-4 * norm + 1e-7);
  // Typical element size: the floor for values that happen to be near zero.
  const double typical = norm / std::sqrt(static_cast<double>(t.numel()));
  const auto idx = want["probe_index"].get<std::vector<int64_t>>();
  const std::vector<float> probe = floats(want["probe"]);
  for (size_t i = 0; i < idx.size(); ++i)
    EXPECT_NEAR(t.data[static_cast<size_t>(idx[i])], probe[i], 1e-4 * std::fabs(probe[i]) + 1e-4 * typical + 1e-8)
        << "at " << idx[i];
}

}  // namespace

TEST(Model, InitMatchesTorchBitForBit) {
  for (const auto& init : model_fixture()["inits"]) {
    const std::string name = init["model"];
    const uint64_t seed = init["seed"];
    SCOPED_TRACE(name + " seed " + std::to_string(seed));
    auto model = build(name, seed);
    const std::vector<lab::StateEntry> state = model->state_dict();
    ASSERT_EQ(state.size(), init["state"].size());
    for (size_t i = 0; i < state.size(); ++i) {
      const json& want = init["state"][i];
      EXPECT_EQ(state[i].name, want["name"].get<std::string>());
      if (want.contains("int64")) {
        ASSERT_NE(state[i].buffer, nullptr);
        EXPECT_TRUE(state[i].buffer->is_int64);
        EXPECT_EQ(state[i].buffer->i64, want["int64"].get<int64_t>());
        continue;
      }
      const lab::Tensor& t = state[i].param ? state[i].param->value : state[i].buffer->value;
      EXPECT_EQ(t.shape, nnfix::shape(want["shape"])) << state[i].name;
      EXPECT_EQ(nnfix::checksum(t.data), want["checksum"].get<uint64_t>()) << state[i].name;
      const auto idx = want["probe_index"].get<std::vector<int64_t>>();
      const auto bits = want["probe_bits"].get<std::vector<uint32_t>>();
      for (size_t k = 0; k < idx.size(); ++k)
        EXPECT_EQ(nnfix::bits_of(t.data[static_cast<size_t>(idx[k])]), bits[k]) << state[i].name << "[" << idx[k] << "]";
    }
  }
}

TEST(Model, TrainingStepsMatchTorch) {
  const json& fx = model_fixture();
  const int n = fx["batch"]["n"];
  lab::Tensor x({n, 1, 28, 28});
  const auto xi = fx["batch"]["x_times_16"].get<std::vector<int>>();
  ASSERT_EQ(static_cast<int64_t>(xi.size()), x.numel());
  for (size_t i = 0; i < xi.size(); ++i) x.data[i] = static_cast<float>(xi[i]) / 16.0f;
  const std::vector<int> labels = fx["batch"]["labels"].get<std::vector<int>>();
  lab::SgdOptions so;
  so.lr = fx["sgd"]["lr"];
  so.momentum = fx["sgd"]["momentum"];
  so.weight_decay = fx["sgd"]["weight_decay"];

  for (const auto& tr : fx["train"]) {
    const std::string name = tr["model"];
    SCOPED_TRACE(name);
    auto model = build(name, tr["seed"]);
    lab::Optimizer sgd(model->params(), so);
    lab::Tensor dlogits;
    for (int step = 0; step < 3; ++step) {
      model->zero_grad();
      const lab::Tensor& logits = model->forward(x, lab::Mode::Train);
      const float loss = lab::cross_entropy(logits, labels, &dlogits, nullptr);
      const double want_loss = tr["losses"][step];
      EXPECT_NEAR(loss, want_loss, 1e-5 * want_loss) << "loss at step " << step + 1;
      if (step == 0) {
        EXPECT_TRUE(close(logits, floats(tr["step1"]["logits"]), 1e-4, 1e-5));
      }
      model->backward(dlogits);
      if (step == 0) {
        const std::vector<lab::StateEntry> state = model->state_dict();
        size_t g = 0;
        for (const auto& e : state) {
          if (!e.param) continue;
          const json& want = tr["step1"]["grads"][g++];
          EXPECT_EQ(e.name, want["name"].get<std::string>());
          expect_summary("grad " + e.name, e.param->grad, want);
        }
        EXPECT_EQ(g, tr["step1"]["grads"].size());
      }
      sgd.step();
    }
    size_t k = 0;
    for (const auto& e : model->state_dict()) {
      if (e.buffer && e.buffer->is_int64) {
        EXPECT_EQ(e.buffer->i64, tr["num_batches_tracked"].get<int64_t>()) << e.name;
        continue;
      }
      const json& want = tr["after3"][k++];
      EXPECT_EQ(e.name, want["name"].get<std::string>());
      const lab::Tensor& t = e.param ? e.param->value : e.buffer->value;
      expect_summary("after 3 steps " + e.name, t, want);
      EXPECT_NEAR(sum_of(t.data), want["sum"].get<double>(), 1e-4 * want["norm"].get<double>() + 1e-6) << e.name;
    }
    const lab::Tensor& eval_logits = model->forward(x, lab::Mode::Eval);
    EXPECT_TRUE(close(eval_logits, floats(tr["eval_logits"]), 1e-4, 1e-5)) << "eval logits";
  }
}

TEST(Model, ParamReadyHookFiresInReverseWithFinalGradients) {
  for (const std::string name : {"mlp", "cnn"}) {
    auto model = build(name, 0);
    lab::Tensor x({4, 1, 28, 28});
    lab::TorchGenerator g(3);
    g.uniform_(x.ptr(), x.numel(), -1.0, 1.0);
    lab::Tensor dlogits;
    lab::cross_entropy(model->forward(x, lab::Mode::Train), {1, 2, 3, 4}, &dlogits, nullptr);
    const std::vector<lab::Param*> params = model->params();
    std::vector<int> order;
    std::vector<std::vector<float>> at_ready(params.size());
    model->zero_grad();
    model->backward(dlogits, [&](int i) {
      order.push_back(i);
      at_ready[static_cast<size_t>(i)] = params[static_cast<size_t>(i)]->grad.data;
    });
    ASSERT_EQ(order.size(), params.size()) << name;
    for (size_t i = 0; i < order.size(); ++i) EXPECT_EQ(order[i], static_cast<int>(params.size() - 1 - i)) << name;
    for (size_t i = 0; i < params.size(); ++i) EXPECT_EQ(at_ready[i], params[i]->grad.data) << name << " param " << i;
  }
}

TEST(Model, StructureNamesAndDescribe) {
  auto cnn = build("cnn", 0);
  EXPECT_EQ(cnn->describe(),
            "Sequential(Conv2d(1, 32, 3, padding=1, bias=False), BatchNorm2d(32), ReLU(), MaxPool2d(2), "
            "Conv2d(32, 64, 3, padding=1, bias=False), BatchNorm2d(64), ReLU(), MaxPool2d(2), Flatten(), "
            "Linear(3136, 128), ReLU(), Linear(128, 10))");
  EXPECT_EQ(cnn->batchnorm_module_index(), (std::vector<int>{1, 5}));
  EXPECT_EQ(cnn->batchnorms().size(), 2u);
  auto mlp = build("mlp", 0);
  EXPECT_EQ(mlp->batchnorm_module_index(), (std::vector<int>{2, 5}));
  // params() is the state_dict order restricted to parameters.
  std::vector<lab::Param*> from_state;
  for (const auto& e : mlp->state_dict())
    if (e.param) from_state.push_back(e.param);
  EXPECT_EQ(mlp->params(), from_state);
  EXPECT_EQ(mlp->state_dict()[2].name, "2.weight");
  EXPECT_EQ(mlp->state_dict()[4].name, "2.running_mean");

  // BatchNorm options reach every BN layer; without running stats there are no buffers.
  lab::ModelOptions o;
  o.name = "mlp";
  o.bn.track_running_stats = false;
  for (const auto& e : lab::build_model(o, 0)->state_dict()) EXPECT_EQ(e.buffer, nullptr) << e.name;
}

TEST(Model, UnknownNameIsAConfigError) {
  try {
    build("resnet", 0);
    FAIL() << "no error";
  } catch (const lab::ConfigError& e) {
    const std::string all = std::string(e.what()) + " " + e.hint();
    EXPECT_NE(all.find("resnet"), std::string::npos) << all;
    EXPECT_NE(all.find("mlp"), std::string::npos) << all;
    EXPECT_NE(all.find("cnn"), std::string::npos) << all;
  }
}

TEST(Model, CopyStateCopiesParamsAndBuffers) {
  auto a = build("mlp", 0), b = build("mlp", 1);
  a->batchnorms()[0]->running_mean().value.data[3] = 0.5f;
  a->batchnorms()[0]->num_batches_tracked().i64 = 7;
  lab::copy_state(*a, *b);
  const auto sa = a->state_dict(), sb = b->state_dict();
  for (size_t i = 0; i < sa.size(); ++i) {
    if (sa[i].param) EXPECT_EQ(sa[i].param->value.data, sb[i].param->value.data) << sa[i].name;
    else EXPECT_EQ(sa[i].buffer->value.data, sb[i].buffer->value.data) << sa[i].name;
  }
  EXPECT_EQ(b->batchnorms()[0]->num_batches_tracked().i64, 7);
}

// The roofline's FLOP count (bench train, tools/bench_train_vs_torch.sh), counted by hand:
//   mlp: Linear 784x256 + 256x128 + 128x10 = 234,752 multiply-adds per sample;
//        2 x (forward + weight gradients) + 2 x input gradients without the first layer's
//        = 4 x 234,752 + 2 x 34,048 = 1,007,104.
//   cnn: conv 1->32 at 28x28: 32*9*784 = 225,792; conv 32->64 at 14x14: 64*288*196 = 3,612,672;
//        Linear 3136x128 = 401,408; 128x10 = 1,280; total 4,241,152
//        -> 4 x 4,241,152 + 2 x (4,241,152 - 225,792) = 24,995,328.
TEST(Model, TrainingFlopsPerSampleCountTheMatrixProducts) {
  auto mlp = build("mlp", 0), cnn = build("cnn", 0);
  const auto before = mlp->batchnorms()[0]->running_mean().value.data;
  EXPECT_EQ(mlp->train_flops_per_sample({1, 28, 28}), 1007104);
  EXPECT_EQ(cnn->train_flops_per_sample({1, 28, 28}), 24995328);
  // The eval forward it runs changes no buffer.
  EXPECT_EQ(mlp->batchnorms()[0]->running_mean().value.data, before);
  EXPECT_EQ(mlp->batchnorms()[0]->num_batches_tracked().i64, 0);
}
