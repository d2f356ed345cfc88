// lab/tensor/elementwise.h, the per-element math the CPU layers and the GPU kernels share, tested
// on the CPU: each function against the rule it implements (written out here independently, with
// the same float/double types), and each CPU layer against the shared function, bit for bit. With
// both, a GPU kernel that calls the same function (built without FMA contraction) computes the
// CPU layer's bits; tests/gpu checks that on a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "batchnorm.h"
#include "elementwise.h"
#include "float_compare.h"
#include "maxpool2d.h"
#include "optim.h"
#include "relu.h"

namespace {

using testutil::bits;
using testutil::randn;
using testutil::same_bits;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

}  // namespace

TEST(Elementwise, ReluRules) {
  EXPECT_EQ(lab::relu_value(2.5f), 2.5f);
  EXPECT_EQ(lab::relu_value(-2.5f), 0.0f);
  EXPECT_EQ(bits(lab::relu_value(-0.0f)), bits(-0.0f));  // torch.relu(-0.) is -0.
  EXPECT_TRUE(std::isnan(lab::relu_value(kNaN)));
  EXPECT_EQ(lab::relu_value(kInf), kInf);
  EXPECT_EQ(lab::relu_value(-kInf), 0.0f);
  EXPECT_TRUE(lab::relu_passes(1e-30f));
  EXPECT_FALSE(lab::relu_passes(0.0f));
  EXPECT_FALSE(lab::relu_passes(-0.0f));
  EXPECT_FALSE(lab::relu_passes(-1.0f));
  EXPECT_TRUE(lab::relu_passes(kNaN));  // threshold_backward lets a NaN's gradient through
  EXPECT_EQ(lab::relu_grad(3.0f, true), 3.0f);
  EXPECT_EQ(bits(lab::relu_grad(3.0f, false)), bits(0.0f));
}

// Every 2x2 window over {-inf, -1, 0, 1, NaN} (625 of them: ties and NaNs everywhere): the
// tournament picks the sequential scan's winner (from -inf, strictly greater or NaN), and
// MaxPool2d's forward returns that winner's value.
TEST(Elementwise, PoolTournamentIsTheSequentialScan) {
  const float values[] = {-kInf, -1.0f, 0.0f, 1.0f, kNaN};
  std::vector<float> x, want;
  for (float a : values)
    for (float b : values)
      for (float c : values)
        for (float d : values) {
          const float win[4] = {a, b, c, d};
          int best_i = 0;
          float best = -kInf;
          for (int i = 0; i < 4; ++i)
            if (win[i] > best || std::isnan(win[i])) {
              best = win[i];
              best_i = i;
            }
          const int place = lab::pool2x2_place(a, b, c, d);
          ASSERT_EQ(place, best_i) << a << " " << b << " / " << c << " " << d;
          x.insert(x.end(), {a, b, c, d});
          want.push_back(win[place]);
        }
  const int64_t planes = static_cast<int64_t>(want.size());
  lab::Tensor in({planes, 1, 2, 2}), out;
  in.data = x;
  lab::MaxPool2d pool(2);
  pool.forward(in, out, lab::Mode::Train);
  EXPECT_TRUE(same_bits(out.data, want));
  EXPECT_TRUE(lab::pool_takes(kNaN, 1.0f));
  EXPECT_FALSE(lab::pool_takes(1.0f, 1.0f));  // the first of equal maxima stays
}

TEST(Elementwise, BatchNormFormulas) {
  // statistics: the mean rounded from a double sum, biased variance in float
  EXPECT_EQ(bits(lab::bn_mean(10.0, 4)), bits(2.5f));
  EXPECT_EQ(bits(lab::bn_sq_dev(3.0f, 0.5f)), bits(6.25f));
  EXPECT_EQ(bits(lab::bn_biased_var(10.0f, 4)), bits(2.5f));
  // running statistics, with PyTorch's types: float momentum, unbiased variance in float, mix in double
  float rm = 0.25f, rv = 1.5f;
  const float m = 0.1f, mean = 0.7f, var_sum = 3.3f;
  const int64_t n = 7;
  lab::bn_running_update(rm, rv, mean, var_sum, n, m);
  EXPECT_EQ(bits(rm), bits(m * mean + (1.0f - m) * 0.25f));
  const double unbiased = static_cast<double>(var_sum / 6.0f);
  EXPECT_EQ(bits(rv), bits(static_cast<float>(static_cast<double>(m) * unbiased + static_cast<double>((1.0f - m) * 1.5f))));
  float gm = 0.25f, gv = 1.5f;
  lab::bn_running_update_global(gm, gv, 0.7, 3.3, 7.0, 0.1);
  EXPECT_EQ(bits(gm), bits(static_cast<float>(0.9 * 0.25 + 0.1 * 0.7)));
  EXPECT_EQ(bits(gv), bits(static_cast<float>(0.9 * 1.5 + 0.1 * (3.3 / 6.0))));
  // normalization
  EXPECT_EQ(bits(lab::bn_invstd(3.0f, 1e-5)), bits(static_cast<float>(1.0 / std::sqrt(3.0 + 1e-5))));
  EXPECT_EQ(bits(lab::bn_invstd_running(3.0f, 1e-5f)), bits(1.0f / std::sqrt(3.0f + 1e-5f)));
  const float alpha = lab::bn_alpha(0.5f, 3.0f), beta = lab::bn_beta(1.0f, 2.0f, alpha);
  EXPECT_EQ(alpha, 1.5f);
  EXPECT_EQ(beta, -2.0f);
  EXPECT_EQ(lab::bn_affine(4.0f, alpha, beta), 4.0f);
  // backward: dx = (dy - grad_mean - (x - mean) * k) * scale, coefficients in double
  const lab::BnInputGradCoefficients c = lab::bn_input_grad_coefficients(8.0f, 6.0f, 0.5f, 3.0f, 4.0);
  EXPECT_EQ(c.grad_mean, 2.0f);
  EXPECT_EQ(c.k, 0.375f);
  EXPECT_EQ(c.scale, 1.5f);
  EXPECT_EQ(lab::bn_input_grad(5.0f, 4.0f, c.grad_mean, 2.0f, c.k, c.scale), (5.0f - 2.0f - 2.0f * 0.375f) * 1.5f);
  EXPECT_EQ(lab::bn_weight_grad(6.0, 0.5f), 3.0f);
  EXPECT_EQ(lab::bn_bias_grad(8.0), 8.0f);
  EXPECT_EQ(lab::bn_xmu_dy(4.0f, 2.0f, 1.5f), 3.0f);
}

// BatchNorm2d and BatchNorm1d forward and backward on random inputs: the layer's statistics,
// outputs, running statistics and gradients are exactly what the shared functions give from the
// layer's own sums.
TEST(Elementwise, BatchNormLayerIsTheSharedMath) {
  for (int dims : {0, 2}) {
    SCOPED_TRACE(dims == 2 ? "BatchNorm2d" : "BatchNorm1d");
    const int64_t nb = 8, c = 5, inner = dims == 2 ? 12 : 1;
    const std::vector<int64_t> shape = dims == 2 ? std::vector<int64_t>{nb, c, 3, 4} : std::vector<int64_t>{nb, c};
    lab::BatchNormOptions opt;
    opt.num_features = static_cast<int>(c);
    opt.spatial_dims = dims;
    lab::BatchNorm bn(opt);
    bn.weight().value.data = randn(static_cast<size_t>(c), 1);
    bn.bias().value.data = randn(static_cast<size_t>(c), 2);
    lab::Tensor x(shape), y, dy(shape), dx;
    x.data = randn(x.data.size(), 3, 2.0f);
    dy.data = randn(dy.data.size(), 4);
    bn.forward(x, y, lab::Mode::Train);
    const int64_t n = nb * inner;
    std::vector<float> want_y(y.data.size()), want_rm(static_cast<size_t>(c), 0.0f), want_rv(static_cast<size_t>(c), 1.0f);
    std::vector<float> invstd(static_cast<size_t>(c));
    for (int64_t ch = 0; ch < c; ++ch) {
      double s = 0.0;
      for (int64_t b = 0; b < nb; ++b)
        for (int64_t i = 0; i < inner; ++i) s += x.data[static_cast<size_t>((b * c + ch) * inner + i)];
      const float mean = lab::bn_mean(s, n);
      double q = 0.0;
      for (int64_t b = 0; b < nb; ++b)
        for (int64_t i = 0; i < inner; ++i) q += lab::bn_sq_dev(x.data[static_cast<size_t>((b * c + ch) * inner + i)], mean);
      const float var_sum = static_cast<float>(q), var = lab::bn_biased_var(var_sum, n);
      // summation order differs from the layer's (8 accumulators): equal to double rounding
      EXPECT_NEAR(bn.last_stats().mean[ch], mean, 1e-6 * std::abs(mean) + 1e-12);
      EXPECT_NEAR(bn.last_stats().var[ch], var, 1e-6 * var);
      invstd[ch] = lab::bn_invstd(bn.last_stats().var[ch], opt.eps);
      const float alpha = lab::bn_alpha(invstd[ch], bn.weight().value.data[ch]);
      EXPECT_EQ(bits(bn.alpha()[ch]), bits(alpha));
      EXPECT_EQ(bits(bn.beta()[ch]), bits(lab::bn_beta(bn.bias().value.data[ch], bn.mean()[ch], alpha)));
      lab::bn_running_update(want_rm[ch], want_rv[ch], bn.last_stats().mean[ch], bn.last_stats().var[ch] * n, n, 0.1f);
      for (int64_t b = 0; b < nb; ++b)
        for (int64_t i = 0; i < inner; ++i) {
          const size_t at = static_cast<size_t>((b * c + ch) * inner + i);
          want_y[at] = lab::bn_affine(x.data[at], bn.alpha()[ch], bn.beta()[ch]);
        }
    }
    EXPECT_TRUE(same_bits(y.data, want_y));
    // var * n only approximates the layer's var_sum: the running variance agrees to a few ulps
    for (int64_t ch = 0; ch < c; ++ch) {
      EXPECT_EQ(bits(bn.running_mean().value.data[ch]), bits(want_rm[ch]));
      EXPECT_NEAR(bn.running_var().value.data[ch], want_rv[ch], 1e-6 * want_rv[ch]);
    }

    bn.weight().grad.zero();
    bn.bias().grad.zero();
    bn.backward(dy, &dx);
    std::vector<float> want_dx(dx.data.size());
    for (int64_t ch = 0; ch < c; ++ch) {
      double sdy = 0.0, sxmu = 0.0;
      for (int64_t b = 0; b < nb; ++b)
        for (int64_t i = 0; i < inner; ++i) {
          const size_t at = static_cast<size_t>((b * c + ch) * inner + i);
          sdy += dy.data[at];
          sxmu += lab::bn_xmu_dy(x.data[at], bn.mean()[ch], dy.data[at]);
        }
      EXPECT_NEAR(bn.weight().grad.data[ch], lab::bn_weight_grad(sxmu, invstd[ch]), 1e-5 * std::abs(sxmu * invstd[ch]) + 1e-6);
      EXPECT_NEAR(bn.bias().grad.data[ch], lab::bn_bias_grad(sdy), 1e-5 * std::abs(sdy) + 1e-6);
      const lab::BnInputGradCoefficients k = lab::bn_input_grad_coefficients(
          static_cast<float>(sdy), static_cast<float>(sxmu), invstd[ch], bn.weight().value.data[ch], static_cast<double>(n));
      for (int64_t b = 0; b < nb; ++b)
        for (int64_t i = 0; i < inner; ++i) {
          const size_t at = static_cast<size_t>((b * c + ch) * inner + i);
          want_dx[at] = lab::bn_input_grad(dy.data[at], x.data[at], k.grad_mean, bn.mean()[ch], k.k, k.scale);
        }
    }
    // the sums' order differs (the layer adds float blocks): dx agrees to float rounding of them
    double max_diff = 0.0, max_val = 0.0;
    for (size_t i = 0; i < dx.data.size(); ++i) {
      max_diff = std::max(max_diff, static_cast<double>(std::abs(dx.data[i] - want_dx[i])));
      max_val = std::max(max_val, static_cast<double>(std::abs(want_dx[i])));
    }
    EXPECT_LE(max_diff, 1e-5 * max_val);
  }
}

TEST(Elementwise, ReluLayerIsTheSharedMath) {
  lab::Tensor x({3, 40}), y, dy({3, 40}), dx;
  x.data = randn(x.data.size(), 5);
  x.data[3] = kNaN;
  x.data[4] = -0.0f;
  x.data[5] = 0.0f;
  dy.data = randn(dy.data.size(), 6);
  lab::ReLU relu;
  relu.forward(x, y, lab::Mode::Train);
  relu.backward(dy, &dx);
  std::vector<float> want_y, want_dx;
  for (size_t i = 0; i < x.data.size(); ++i) {
    want_y.push_back(lab::relu_value(x.data[i]));
    want_dx.push_back(lab::relu_grad(dy.data[i], lab::relu_passes(x.data[i])));
  }
  EXPECT_TRUE(same_bits(y.data, want_y));
  EXPECT_TRUE(same_bits(dx.data, want_dx));
}

// torch.optim.SGD's update, written out, against sgd_element; and Optimizer::step against sgd_element
// for every variant, first step and later steps.
TEST(Elementwise, SgdIsTheSharedMath) {
  const lab::SgdCoeffs k = lab::sgd_coeffs(0.05, 0.9, 0.1, 5e-4);
  EXPECT_EQ(k.neg_lr, -0.05f);
  EXPECT_EQ(k.keep, 1.0f - 0.1f);
  float w = 1.5f, buf = 0.25f;
  lab::sgd_element<true, true, false, true>(w, 0.5f, buf, k);
  const float d = 0.5f + 5e-4f * 1.5f, b = 0.25f * 0.9f + (1.0f - 0.1f) * d;
  EXPECT_EQ(bits(buf), bits(b));
  EXPECT_EQ(bits(w), bits(1.5f + -0.05f * (d + 0.9f * b)));

  for (bool nesterov : {false, true})
    for (double momentum : {0.0, 0.9})
      for (double wd : {0.0, 5e-4}) {
        if (nesterov && momentum == 0.0) continue;
        SCOPED_TRACE("nesterov=" + std::to_string(nesterov) + " momentum=" + std::to_string(momentum) +
                     " wd=" + std::to_string(wd));
        lab::Param p{"w", lab::Tensor({37}), lab::Tensor({37})};
        p.value.data = randn(37, 7);
        lab::SgdOptions opt;
        opt.lr = 0.05;
        opt.momentum = momentum;
        opt.weight_decay = wd;
        opt.nesterov = nesterov;
        opt.dampening = nesterov ? 0.0 : 0.1;
        lab::Optimizer sgd({&p}, opt);
        std::vector<float> w_ref = p.value.data, buf_ref(37, 0.0f);
        const lab::SgdCoeffs kk = lab::sgd_coeffs(opt.lr, opt.momentum, opt.dampening, opt.weight_decay);
        for (int step = 0; step < 3; ++step) {
          p.grad.data = randn(37, 10 + static_cast<uint32_t>(step));
          sgd.step();
          for (size_t i = 0; i < 37; ++i) {
            const float g = p.grad.data[i];
            float& wi = w_ref[i];
            float& bi = buf_ref[i];
            const bool first = step == 0;
            if (momentum == 0.0) {
              if (wd != 0.0) lab::sgd_element<true, false, false, false>(wi, g, bi, kk);
              else lab::sgd_element<false, false, false, false>(wi, g, bi, kk);
            } else if (wd != 0.0) {
              if (first) nesterov ? lab::sgd_element<true, true, true, true>(wi, g, bi, kk)
                                  : lab::sgd_element<true, true, true, false>(wi, g, bi, kk);
              else nesterov ? lab::sgd_element<true, true, false, true>(wi, g, bi, kk)
                            : lab::sgd_element<true, true, false, false>(wi, g, bi, kk);
            } else {
              if (first) nesterov ? lab::sgd_element<false, true, true, true>(wi, g, bi, kk)
                                  : lab::sgd_element<false, true, true, false>(wi, g, bi, kk);
              else nesterov ? lab::sgd_element<false, true, false, true>(wi, g, bi, kk)
                            : lab::sgd_element<false, true, false, false>(wi, g, bi, kk);
            }
          }
          EXPECT_TRUE(same_bits(p.value.data, w_ref));
          if (momentum != 0.0) {
            EXPECT_TRUE(same_bits(sgd.momentum_buffers()[0].data, buf_ref));
          }
        }
      }
}

// One row of the loss against log-softmax in long double; cross_entropy() is the sum of its rows.
TEST(Elementwise, CrossEntropyRow) {
  const std::vector<float> z = randn(4 * 10, 8, 3.0f);
  const std::vector<int> labels = {3, 0, 9, 5};
  std::vector<float> d(z.size());
  double total = 0.0;
  int hits = 0;
  for (int i = 0; i < 4; ++i) {
    const float* row = z.data() + i * 10;
    int64_t best = -1;
    const double loss = lab::cross_entropy_row(row, 10, labels[static_cast<size_t>(i)], 4, d.data() + i * 10, &best);
    long double mx = row[0], sum = 0.0L;
    int64_t arg = 0;
    for (int j = 1; j < 10; ++j)
      if (row[j] > mx) {
        mx = row[j];
        arg = j;
      }
    for (int j = 0; j < 10; ++j) sum += std::exp(static_cast<long double>(row[j]) - mx);
    const long double want = std::log(sum) + mx - row[labels[static_cast<size_t>(i)]];
    EXPECT_EQ(best, arg);
    EXPECT_NEAR(loss, static_cast<double>(want), 1e-6 * static_cast<double>(want));
    for (int j = 0; j < 10; ++j) {
      const long double p = std::exp(static_cast<long double>(row[j]) - mx) / sum;
      EXPECT_NEAR(d[static_cast<size_t>(i * 10 + j)], static_cast<double>((p - (j == labels[static_cast<size_t>(i)])) / 4), 1e-7);
    }
    total += loss;
    hits += best == labels[static_cast<size_t>(i)];
  }
  lab::Tensor logits({4, 10}), dlogits;
  logits.data = z;
  int correct = -1;
  const float mean = lab::cross_entropy(logits, labels, &dlogits, &correct);
  EXPECT_EQ(bits(mean), bits(static_cast<float>(total / 4.0)));
  EXPECT_EQ(correct, hits);
  EXPECT_TRUE(same_bits(dlogits.data, d));
  // torch.argmax's NaN rule: a NaN is the maximum
  const float nan_row[3] = {1.0f, kNaN, 2.0f};
  int64_t best = -1;
  lab::cross_entropy_row(nan_row, 3, 0, 1, nullptr, &best);
  EXPECT_EQ(best, 1);
}
