// Linear, Conv2d, MaxPool2d, ReLU, Flatten, cross_entropy and Optimizer against PyTorch's numbers
// (tests/fixtures/nn_layers.json, from tools/fixtures/gen_nn.py).
//
// Tolerances: inputs and weights are exact multiples of 1/16 and 1/64, so most sums here are
// exact in float32 whatever the order; where they are not, the only difference from PyTorch is
// the summation order of a few dozen float32 products: rtol 1e-5 with a small atol for values
// near zero covers that with a wide margin (a wrong index or a missing term is off by >= 1/1024).
#include <limits>

#include <gtest/gtest.h>

#include "conv2d.h"
#include "flatten.h"
#include "linear.h"
#include "maxpool2d.h"
#include "nn_fixture.h"
#include "optim.h"
#include "relu.h"

using nnfix::close;
using nnfix::floats;
using nnfix::json;

namespace {

constexpr double kRtol = 1e-5;
constexpr double kAtol = 1e-6;

const json& layers() { return nnfix::load("nn_layers.json"); }

}  // namespace

TEST(Linear, ForwardBackwardMatchTorch) {
  for (const auto& c : layers()["linear"]) {
    const int n = c["n"], in = c["in"], out = c["out"];
    const bool bias = c["bias"];
    SCOPED_TRACE("Linear(" + std::to_string(in) + ", " + std::to_string(out) + ") bias=" + std::to_string(bias));
    lab::Linear lin(in, out, bias);
    lin.weight().value.data = floats(c["weight"]);
    if (bias) lin.bias().value.data = floats(c["b"]);
    EXPECT_EQ(lin.params().size(), bias ? 2u : 1u);
    const lab::Tensor x = nnfix::tensor(c["x"], {n, in});
    lab::Tensor y, dx;
    lin.forward(x, y, lab::Mode::Train);
    EXPECT_EQ(y.shape, (std::vector<int64_t>{n, out}));
    EXPECT_TRUE(close(y, floats(c["y"]), kRtol, kAtol));
    const lab::Tensor dy = nnfix::tensor(c["dy"], {n, out});
    lin.backward(dy, &dx);
    EXPECT_TRUE(close(dx, floats(c["dx"]), kRtol, kAtol));
    EXPECT_TRUE(close(lin.weight().grad, floats(c["dweight"]), kRtol, kAtol));
    if (bias) {
      EXPECT_TRUE(close(lin.bias().grad, floats(c["dbias"]), kRtol, kAtol));
    }
    // A second backward accumulates, as autograd does into .grad.
    lin.backward(dy, nullptr);
    std::vector<float> twice = floats(c["dweight"]);
    for (float& v : twice) v *= 2;
    EXPECT_TRUE(close(lin.weight().grad, twice, kRtol, kAtol));
  }
}

TEST(Conv2d, ForwardBackwardMatchTorch) {
  for (const auto& c : layers()["conv2d"]) {
    const int n = c["n"], cin = c["cin"], cout = c["cout"], k = c["k"], pad = c["padding"], h = c["h"], w = c["w"];
    const bool bias = c["bias"];
    lab::Conv2d conv(cin, cout, k, pad, bias);
    SCOPED_TRACE(conv.describe());
    conv.weight().value.data = floats(c["weight"]);
    if (bias) conv.bias().value.data = floats(c["b"]);
    const lab::Tensor x = nnfix::tensor(c["x"], {n, cin, h, w});
    lab::Tensor y, dx;
    conv.forward(x, y, lab::Mode::Train);
    const int ho = h + 2 * pad - k + 1, wo = w + 2 * pad - k + 1;
    EXPECT_EQ(y.shape, (std::vector<int64_t>{n, cout, ho, wo}));
    EXPECT_TRUE(close(y, floats(c["y"]), kRtol, kAtol));
    lab::Tensor naive;
    lab::conv2d_forward_naive(x, conv.weight().value, bias ? conv.bias().value.ptr() : nullptr, pad, naive);
    EXPECT_TRUE(close(naive, floats(c["y"]), kRtol, kAtol));
    conv.backward(nnfix::tensor(c["dy"], y.shape), &dx);
    EXPECT_EQ(dx.shape, x.shape);
    EXPECT_TRUE(close(dx, floats(c["dx"]), kRtol, kAtol));
    EXPECT_TRUE(close(conv.weight().grad, floats(c["dweight"]), kRtol, kAtol));
    if (bias) {
      EXPECT_TRUE(close(conv.bias().grad, floats(c["dbias"]), kRtol, kAtol));
    }
  }
}

// The im2col + gemm path against the direct 7-loop convolution on the cnn's real layer shapes,
// with non-dyadic random data: only the summation order differs (K = 288 products).
TEST(Conv2d, FastPathMatchesNaiveOnCnnShapes) {
  lab::TorchGenerator g(5);
  for (auto [n, cin, cout, hw] : std::vector<std::array<int, 4>>{{3, 1, 32, 28}, {2, 32, 64, 14}}) {
    lab::Conv2d conv(cin, cout, 3, 1, true);
    conv.reset_parameters(g);
    lab::Tensor x({n, cin, hw, hw});
    g.uniform_(x.ptr(), x.numel(), -1.0, 1.0);
    lab::Tensor y, naive;
    conv.forward(x, y, lab::Mode::Eval);
    lab::conv2d_forward_naive(x, conv.weight().value, conv.bias().value.ptr(), 1, naive);
    EXPECT_TRUE(close(y, naive.data, 1e-4, 1e-5)) << conv.describe();
  }
}

TEST(Conv2d, DescribeAndParams) {
  lab::Conv2d a(1, 32, 3, 1, false);
  EXPECT_EQ(a.describe(), "Conv2d(1, 32, 3, padding=1, bias=False)");
  EXPECT_EQ(a.params().size(), 1u);
  EXPECT_EQ(a.params()[0]->name, "weight");
  EXPECT_EQ(a.weight().value.shape, (std::vector<int64_t>{32, 1, 3, 3}));
  lab::Linear l(784, 256);
  EXPECT_EQ(l.describe(), "Linear(784, 256)");
}

TEST(MaxPool2d, ForwardBackwardMatchTorchWithTies) {
  for (const auto& c : layers()["maxpool2d"]) {
    const std::vector<int64_t> s = nnfix::shape(c["shape"]);
    lab::MaxPool2d pool(2);
    lab::Tensor y, dx;
    pool.forward(nnfix::tensor(c["x"], s), y, lab::Mode::Train);
    EXPECT_EQ(y.shape, (std::vector<int64_t>{s[0], s[1], s[2] / 2, s[3] / 2}));
    EXPECT_TRUE(close(y, floats(c["y"]), 0, 0));
    pool.backward(nnfix::tensor(c["dy"], y.shape), &dx);
    // Exact: each dy goes to exactly one input (the first maximum), as in PyTorch.
    EXPECT_TRUE(close(dx, floats(c["dx"]), 0, 0));
  }
}

TEST(ReLU, ForwardBackwardMatchTorch) {
  for (const auto& c : layers()["relu"]) {
    const std::vector<int64_t> s = nnfix::shape(c["shape"]);
    lab::ReLU relu;
    lab::Tensor y, dx;
    relu.forward(nnfix::tensor(c["x"], s), y, lab::Mode::Train);
    EXPECT_TRUE(close(y, floats(c["y"]), 0, 0));
    relu.backward(nnfix::tensor(c["dy"], s), &dx);
    EXPECT_TRUE(close(dx, floats(c["dx"]), 0, 0));
  }
}

TEST(Flatten, RoundTripsShape) {
  lab::Flatten f;
  lab::Tensor x({2, 3, 2, 2}), y, dx;
  for (int64_t i = 0; i < x.numel(); ++i) x.data[i] = static_cast<float>(i);
  f.forward(x, y, lab::Mode::Train);
  EXPECT_EQ(y.shape, (std::vector<int64_t>{2, 12}));
  EXPECT_EQ(y.data, x.data);
  f.backward(y, &dx);
  EXPECT_EQ(dx.shape, x.shape);
  EXPECT_EQ(dx.data, x.data);
}

TEST(CrossEntropy, LossGradAndArgmaxTiesMatchTorch) {
  for (const auto& c : layers()["cross_entropy"]) {
    const int n = c["n"], k = c["c"];
    const lab::Tensor logits = nnfix::tensor(c["logits"], {n, k});
    lab::Tensor d;
    int correct = -1;
    const float loss = lab::cross_entropy(logits, c["labels"].get<std::vector<int>>(), &d, &correct);
    EXPECT_NEAR(loss, c["loss"].get<double>(), 1e-5 * std::fabs(c["loss"].get<double>()));
    EXPECT_TRUE(close(d, floats(c["dlogits"]), kRtol, 1e-7));
    EXPECT_EQ(correct, c["correct"].get<int>());
  }
}

// AMP's found_inf test: every non-finite float is found wherever it sits (the vectorized loop's
// body and its tail), and no finite one is taken for it (the largest, the smallest subnormal, -0).
TEST(AllFinite, FindsEveryNonFiniteValueAndNoFiniteOne) {
  const float inf = std::numeric_limits<float>::infinity();
  const float finite[] = {0.0f, -0.0f, 1.0f, std::numeric_limits<float>::max(), -std::numeric_limits<float>::max(),
                          std::numeric_limits<float>::denorm_min(), std::numeric_limits<float>::min()};
  const float bad[] = {inf, -inf, std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::quiet_NaN(),
                       std::numeric_limits<float>::signaling_NaN()};
  for (int64_t n : {1, 7, 8, 33, 1000}) {
    lab::Tensor t({n});
    for (int64_t i = 0; i < n; ++i) t.data[static_cast<size_t>(i)] = finite[i % 7];
    EXPECT_TRUE(lab::all_finite(t)) << n;
    for (int64_t at : {int64_t{0}, n / 2, n - 1})
      for (float b : bad) {
        lab::Tensor u = t;
        u.data[static_cast<size_t>(at)] = b;
        EXPECT_FALSE(lab::all_finite(u)) << "n " << n << " at " << at << " value " << b;
      }
  }
  EXPECT_TRUE(lab::all_finite(lab::Tensor({0})));
}

// torch.optim.Adam and AdamW, 5 steps each with gradients from 1e-6 to 1e2: the parameters and
// both moment estimates after every step (exp_avg, exp_avg_sq), and a checkpoint's state restored
// halfway gives the same steps.
TEST(Optimizer, MatchesTorchOptimAdamAndAdamW) {
  for (const auto& c : layers()["adam"]) {
    const auto& o = c["options"];
    lab::OptimizerOptions opt;
    opt.kind = o["kind"];
    opt.adam.lr = o["lr"];
    opt.adam.beta1 = o["beta1"];
    opt.adam.beta2 = o["beta2"];
    opt.adam.eps = o["eps"];
    opt.adam.weight_decay = o["weight_decay"];
    SCOPED_TRACE(o.dump());
    lab::Param p{"w", nnfix::tensor(c["p0"], {37}), lab::Tensor({37})};
    lab::Optimizer adam({&p}, opt);
    EXPECT_TRUE(adam.state_names().empty());  // no state before the first step, as in PyTorch
    lab::Param q = p;  // resumed from a checkpoint after step 2
    lab::Optimizer resumed({&q}, opt);
    for (size_t step = 0; step < c["grads"].size(); ++step) {
      p.grad.data = floats(c["grads"][step]);
      adam.step();
      // a dozen float32 ops per element; PyTorch fuses some multiply-adds (fma): an ulp or two per op
      EXPECT_TRUE(close(p.value, floats(c["after"][step]), 1e-6, 1e-7)) << "step " << step + 1;
      EXPECT_TRUE(close(adam.state("exp_avg")[0], floats(c["exp_avg"][step]), 1e-6, 1e-12)) << "step " << step + 1;
      EXPECT_TRUE(close(adam.state("exp_avg_sq")[0], floats(c["exp_avg_sq"][step]), 1e-6, 1e-20)) << "step " << step + 1;
      EXPECT_EQ(adam.steps(), static_cast<int64_t>(step) + 1);
      if (step == 1) {
        q.value = p.value;
        resumed.restore_state({{"exp_avg", adam.state("exp_avg")}, {"exp_avg_sq", adam.state("exp_avg_sq")}}, 2);
      }
      if (step >= 2) {
        q.grad = p.grad;
        resumed.step();
        EXPECT_EQ(q.value.data, p.value.data) << "resumed, step " << step + 1;
      }
    }
    ASSERT_EQ(adam.state_names(), (std::vector<std::string>{"exp_avg", "exp_avg_sq"}));
  }
}

TEST(Optimizer, MatchesTorchOptimSgd) {
  for (const auto& c : layers()["sgd"]) {
    const auto& o = c["options"];
    lab::SgdOptions opt;
    opt.lr = o["lr"];
    opt.momentum = o["momentum"];
    opt.dampening = o["dampening"];
    opt.weight_decay = o["weight_decay"];
    opt.nesterov = o["nesterov"];
    SCOPED_TRACE(o.dump());
    lab::Param p{"w", nnfix::tensor(c["p0"], {7}), lab::Tensor({7})};
    lab::Optimizer sgd({&p}, opt);
    for (size_t step = 0; step < c["grads"].size(); ++step) {
      p.grad.data = floats(c["grads"][step]);
      sgd.step();
      // A handful of float32 ops per element; PyTorch fuses some of them (fma), so allow an ulp or two.
      EXPECT_TRUE(close(p.value, floats(c["after"][step]), 1e-6, 1e-7)) << "step " << step + 1;
    }
  }
}
