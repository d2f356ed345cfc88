// BnReluPool (the fused BatchNorm2d -> ReLU -> MaxPool2d(2)) against the three modules it
// replaces, which are themselves tested against PyTorch (test_batchnorm.cpp, test_layers.cpp).
//
// What must be equal, and how:
//  - forward: the pooled output, the running statistics, num_batches_tracked and last_stats()
//    bit for bit (the same float operations on the same values);
//  - backward: dx and the weight/bias gradients. BatchNorm's sums of dy and dy * (x - mean) add
//    the same terms in another order (only the pooling winners', in double, against every term in
//    float blocks), so the coefficients, and through them dx, may differ in the last bits:
//    rtol 1e-5 relative to the largest |value| of the tensor. A wrong winner, a lost mask or a
//    missing term is off by the size of a whole gradient term, far above that.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "batchnorm.h"
#include "bn_relu_pool.h"
#include "maxpool2d.h"
#include "model.h"
#include "optim.h"
#include "relu.h"

namespace {

lab::Tensor random_tensor(std::vector<int64_t> shape, uint32_t seed, bool ties) {
  lab::Tensor t(std::move(shape));
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.3f, 1.0f);
  // ties: values on a coarse grid, so windows hold equal maxima and exact zeros after ReLU
  for (float& v : t.data) v = ties ? std::round(d(g) * 2.0f) / 2.0f : d(g);
  return t;
}

// max |a - b| <= rtol * max |b|
::testing::AssertionResult near(const lab::Tensor& a, const lab::Tensor& b, double rtol) {
  if (a.shape != b.shape) return ::testing::AssertionFailure() << "shapes differ";
  double scale = 0, worst = 0;
  size_t at = 0;
  for (size_t i = 0; i < b.data.size(); ++i) {
    scale = std::max(scale, std::fabs(static_cast<double>(b.data[i])));
    const double d = std::fabs(static_cast<double>(a.data[i]) - b.data[i]);
    if (d > worst) worst = d, at = i;
  }
  if (worst <= rtol * scale) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "max |diff| " << worst << " at " << at << " (" << a.data[at] << " vs "
                                       << b.data[at] << "), allowed " << rtol * scale;
}

struct Case {
  std::vector<int64_t> shape;
  bool ties;
  bool constant_channel = false;  // channel 0 holds one value and bias 0: its BatchNorm output is
                                  // exactly 0, which ReLU must not let through (v <= 0)
};

TEST(BnReluPool, EqualsTheThreeModules) {
  const Case cases[] = {{{4, 3, 6, 8}, false}, {{5, 2, 4, 4}, true}, {{2, 4, 28, 28}, false}, {{3, 6, 14, 14}, true},
                        {{4, 2, 4, 4}, false, true}};
  uint32_t seed = 1;
  for (const Case& c : cases) {
    for (lab::Mode mode : {lab::Mode::Train, lab::Mode::Eval}) {
      SCOPED_TRACE(lab::shape_str(c.shape) + (mode == lab::Mode::Train ? " train" : " eval") + (c.ties ? " ties" : ""));
      lab::BatchNormOptions o;
      o.num_features = static_cast<int>(c.shape[1]);
      o.spatial_dims = 2;
      lab::BatchNorm bn_ref(o), bn_fused(o);
      // non-trivial affine parameters and running statistics
      const lab::Tensor wb = random_tensor({2, c.shape[1]}, seed++, false);
      for (int64_t ch = 0; ch < c.shape[1]; ++ch) {
        for (lab::BatchNorm* bn : {&bn_ref, &bn_fused}) {
          bn->weight().value.data[ch] = wb.data[ch];
          bn->bias().value.data[ch] = wb.data[c.shape[1] + ch];
          bn->running_mean().value.data[ch] = 0.1f * wb.data[ch];
        }
      }
      lab::Tensor x = random_tensor(c.shape, seed++, c.ties);
      if (c.constant_channel) {
        const int64_t plane = c.shape[2] * c.shape[3];
        for (int64_t n = 0; n < c.shape[0]; ++n)
          std::fill_n(x.ptr() + n * c.shape[1] * plane, plane, 1.5f);
        bn_ref.bias().value.data[0] = bn_fused.bias().value.data[0] = 0.0f;
      }
      lab::ReLU relu;
      lab::MaxPool2d pool(2);
      lab::Tensor a, b, y_ref, y_fused;
      bn_ref.forward(x, a, mode);
      relu.forward(a, b, mode);
      pool.forward(b, y_ref, mode);
      lab::BnReluPool fused;
      ASSERT_TRUE(lab::BnReluPool::applies(bn_fused, x));
      fused.forward(bn_fused, x, y_fused, mode);
      EXPECT_EQ(y_fused.shape, y_ref.shape);
      EXPECT_EQ(y_fused.data, y_ref.data);
      EXPECT_EQ(bn_fused.running_mean().value.data, bn_ref.running_mean().value.data);
      EXPECT_EQ(bn_fused.running_var().value.data, bn_ref.running_var().value.data);
      EXPECT_EQ(bn_fused.num_batches_tracked().i64, bn_ref.num_batches_tracked().i64);
      EXPECT_EQ(bn_fused.last_stats().mean, bn_ref.last_stats().mean);
      EXPECT_EQ(bn_fused.last_stats().var, bn_ref.last_stats().var);
      if (mode == lab::Mode::Eval) continue;

      const lab::Tensor dy = random_tensor(y_ref.shape, seed++, false);
      lab::Tensor g1, g2, dx_ref, dx_fused;
      pool.backward(dy, &g1);
      relu.backward(g1, &g2);
      bn_ref.backward(g2, &dx_ref);
      fused.backward(bn_fused, dy, &dx_fused);
      EXPECT_TRUE(near(dx_fused, dx_ref, 1e-5));
      EXPECT_TRUE(near(bn_fused.weight().grad, bn_ref.weight().grad, 1e-5));
      EXPECT_TRUE(near(bn_fused.bias().grad, bn_ref.bias().grad, 1e-5));
      // Off the winners the gradient is dx = (0 - grad_mean - (x - mean) k) scale: not zero,
      // so a dx that only scattered the winners would fail above; and the winners carry dy.
      double winners = 0;
      for (float v : g2.data) winners += v != 0.0f;
      EXPECT_GT(winners, 0);
    }
  }
}

TEST(BnReluPool, BackwardWithoutDxStillGivesTheParameterGradients) {
  lab::BatchNormOptions o;
  o.num_features = 3;
  o.spatial_dims = 2;
  lab::BatchNorm bn_ref(o), bn_fused(o);
  const lab::Tensor x = random_tensor({4, 3, 6, 6}, 7, false);
  lab::ReLU relu;
  lab::MaxPool2d pool(2);
  lab::Tensor a, b, y, yf;
  bn_ref.forward(x, a, lab::Mode::Train);
  relu.forward(a, b, lab::Mode::Train);
  pool.forward(b, y, lab::Mode::Train);
  lab::BnReluPool fused;
  fused.forward(bn_fused, x, yf, lab::Mode::Train);
  const lab::Tensor dy = random_tensor(y.shape, 8, false);
  lab::Tensor g1, g2;
  pool.backward(dy, &g1);
  relu.backward(g1, &g2);
  bn_ref.backward(g2, nullptr);
  fused.backward(bn_fused, dy, nullptr);
  EXPECT_TRUE(near(bn_fused.weight().grad, bn_ref.weight().grad, 1e-5));
  EXPECT_TRUE(near(bn_fused.bias().grad, bn_ref.bias().grad, 1e-5));
}

// The whole cnn, fused and not: the same logits bit for bit, and the same training within float
// rounding after a few SGD steps.
TEST(BnReluPool, CnnTrainsTheSameFusedOrNot) {
  lab::ModelOptions mo;
  mo.name = "cnn";
  auto fused = lab::build_model(mo, 3), plain = lab::build_model(mo, 3);
  plain->set_fusion(false);
  lab::SgdOptions so;
  so.lr = 0.05;
  so.momentum = 0.9;
  lab::Optimizer opt_f(fused->params(), so), opt_p(plain->params(), so);
  std::vector<int> labels(16);
  for (int i = 0; i < 16; ++i) labels[static_cast<size_t>(i)] = (i * 7) % 10;
  for (int step = 0; step < 3; ++step) {
    const lab::Tensor x = random_tensor({16, 1, 28, 28}, 100 + static_cast<uint32_t>(step), false);
    lab::Tensor dl_f, dl_p;
    for (auto* m : {fused.get(), plain.get()}) m->zero_grad();
    const lab::Tensor& lf = fused->forward(x, lab::Mode::Train);
    const lab::Tensor& lp = plain->forward(x, lab::Mode::Train);
    if (step == 0) {
      EXPECT_EQ(lf.data, lp.data);  // the same weights: the same bits
    }
    EXPECT_TRUE(near(lf, lp, 1e-5));
    lab::cross_entropy(lf, labels, &dl_f, nullptr);
    lab::cross_entropy(lp, labels, &dl_p, nullptr);
    fused->backward(dl_f);
    plain->backward(dl_p);
    const auto pf = fused->params(), pp = plain->params();
    for (size_t i = 0; i < pf.size(); ++i) EXPECT_TRUE(near(pf[i]->grad, pp[i]->grad, 1e-4)) << "param " << i;
    opt_f.step();
    opt_p.step();
  }
  const lab::Tensor x = random_tensor({8, 1, 28, 28}, 200, false);
  EXPECT_TRUE(near(fused->forward(x, lab::Mode::Eval), plain->forward(x, lab::Mode::Eval), 1e-4));
}

}  // namespace
