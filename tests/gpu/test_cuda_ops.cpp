// The GPU backend's ops against the CPU reference ops (lab/nn, lab::sgemm) on random inputs, the
// deterministic ones run twice for bitwise equality, and the error path. Label "gpu". Without a
// GPU every test reports SKIPPED with the probe's reason (never passed): tools/gpu_check.sh runs
// them on a GPU machine, under compute-sanitizer too.
//
// Every output buffer is poisoned with NaN (all bytes 0xFF) before the op runs, so a value the op
// fails to write shows up as a mismatch.
//
// Yardsticks, per op (err = |gpu - cpu|):
//   bitwise (the formula is elementwise.h's on both sides, no FMA contraction): bias_add, ReLU
//     forward/backward, max-pool forward/backward, BatchNorm coefficients / apply / input
//     gradient / running statistics from the same inputs, SGD in every variant;
//   err <= 1e-6 * scale, scale = the same sum over absolute values (sum |a||b| for a product, sum
//     |x| for a mean, ...), because the GPU adds in another order than the CPU: sgemm (IEEE fp32),
//     bias_grad, BatchNorm statistics and gradient sums, the loss and dlogits, convolutions with a
//     direct algorithm forced (implicit GEMM, backward ALGO_1);
//   err <= 5e-5 * scale: convolutions with the algorithm cuDNN picks (heuristic, benchmark,
//     deterministic): FFT and Winograd algorithms transform the operands, which costs fp32 bits
//     (an estimate, not yet measured: tighten it from the first GPU run's JSON);
//   err <= 2e-3 * scale: TF32 (10-bit mantissa operands, each rounding 2^-11 relative).
//
// Sections: helpers | sgemm | convolution | bias | ReLU | max-pool | BatchNorm | cross-entropy |
// SGD | determinism | errors
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "batchnorm.h"
#include "conv2d.h"
#include "cuda_context.h"
#include "cuda_conv.h"
#include "cuda_device.h"
#include "gpu_test_util.h"
#include "cuda_gemm.h"
#include "cuda_ops.h"
#include "device_buffer.h"
#include "elementwise.h"
#include "errors.h"
#include "gemm.h"
#include "maxpool2d.h"
#include "optim.h"
#include "relu.h"

using lab::cuda::CudaContext;
using lab::cuda::CudaContextOptions;
using lab::cuda::DeviceBuffer;

namespace {

// ---- helpers ----

using gputest::probe;
using gputest::randn;
using testutil::bits;
using testutil::same_bits;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

// Values from a small set, so that windows hold ties (and, with nan_every > 0, NaNs).
std::vector<float> quantized(size_t n, uint32_t seed, int nan_every = 0) {
  std::mt19937 g(seed);
  std::uniform_int_distribution<int> d(-3, 3);
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = nan_every > 0 && i % static_cast<size_t>(nan_every) == 7 ? kNaN : 0.5f * d(g);
  return v;
}

std::vector<float> abs_of(std::vector<float> v) {
  for (float& x : v) x = std::abs(x);
  return v;
}

template <class T>
DeviceBuffer<T> on_device(CudaContext& ctx, const std::vector<T>& host) {
  DeviceBuffer<T> d;
  d.upload(host, ctx.stream());
  return d;
}

// An output buffer of n values, every byte 0xFF (NaN floats, -1 integers).
template <class T>
DeviceBuffer<T> poisoned(CudaContext& ctx, size_t n) {
  DeviceBuffer<T> d(n);
  d.fill_bytes(0xFF, ctx.stream());
  return d;
}

// err_i = |got_i - want_i| <= tol * scale_i for every i (scale: the same computation over absolute
// values; a NaN anywhere fails). Prints the first mismatches and the largest err / scale.
::testing::AssertionResult close_scaled(const std::vector<float>& got, const std::vector<float>& want,
                                        const std::vector<float>& scale, double tol) {
  if (got.size() != want.size() || got.size() != scale.size())
    return ::testing::AssertionFailure() << "sizes " << got.size() << ", " << want.size() << ", " << scale.size();
  int64_t bad = 0;
  double worst = 0.0;
  std::string first;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::abs(static_cast<double>(got[i]) - want[i]);
    const double s = std::max(static_cast<double>(scale[i]), 1e-30);
    if (!(err <= tol * s)) {
      if (bad++ < 5)
        first += "\n  [" + std::to_string(i) + "] gpu " + std::to_string(got[i]) + " cpu " + std::to_string(want[i]) +
                 " scale " + std::to_string(scale[i]);
      if (std::isnan(err)) worst = std::numeric_limits<double>::infinity();
    }
    if (!std::isnan(err)) worst = std::max(worst, err / s);
  }
  if (bad == 0) return ::testing::AssertionSuccess() << "max err/scale " << worst;
  return ::testing::AssertionFailure() << bad << " of " << got.size() << " values off by more than " << tol
                                       << " x scale (max err/scale " << worst << "):" << first;
}

// The same relative yardstick with one scale for a whole tensor: the largest |want|.
::testing::AssertionResult close_to_max(const std::vector<float>& got, const std::vector<float>& want, double tol) {
  float m = 0.0f;
  for (float v : want) m = std::max(m, std::abs(v));
  return close_scaled(got, want, std::vector<float>(want.size(), m), tol);
}

class CudaOps : public ::testing::Test {
 protected:
  void SetUp() override {
    SKIP_WITHOUT_GPU();
    ctx = std::make_unique<CudaContext>();
  }
  std::unique_ptr<CudaContext> ctx;
};

// ---- sgemm ----

struct GemmCase {
  bool ta, tb;
  int m, n, k;
};

// The models' products: the mlp's first layer forward (x W^T), its weight gradient (dy^T x), its
// input gradient (dy W), and the cnn's classifier (3136 inputs).
const GemmCase kGemmCases[] = {
    {false, true, 64, 256, 784}, {true, false, 256, 784, 64}, {false, false, 64, 784, 256},
    {false, true, 32, 128, 3136}, {true, true, 33, 17, 65},
};

// op(X) of a row-major matrix stored as rows x cols
void run_gemm_case(CudaContext& ctx, const GemmCase& c, double tol, float beta) {
  const int a_rows = c.ta ? c.k : c.m, a_cols = c.ta ? c.m : c.k;
  const int b_rows = c.tb ? c.n : c.k, b_cols = c.tb ? c.k : c.n;
  const std::vector<float> a = randn(static_cast<size_t>(a_rows) * a_cols, 11);
  const std::vector<float> b = randn(static_cast<size_t>(b_rows) * b_cols, 12);
  const std::vector<float> c0 = randn(static_cast<size_t>(c.m) * c.n, 13);
  std::vector<float> want = c0, scale = abs_of(c0);
  lab::sgemm(c.ta, c.tb, c.m, c.n, c.k, 1.0f, a.data(), a_cols, b.data(), b_cols, beta, want.data(), c.n);
  const std::vector<float> aa = abs_of(a), ab = abs_of(b);
  lab::sgemm_ref(c.ta, c.tb, c.m, c.n, c.k, 1.0f, aa.data(), a_cols, ab.data(), b_cols, std::abs(beta), scale.data(),
                 c.n);
  auto da = on_device(ctx, a), db = on_device(ctx, b);
  DeviceBuffer<float> dc = beta != 0.0f ? on_device(ctx, c0) : poisoned<float>(ctx, c0.size());
  lab::cuda::sgemm(ctx, c.ta, c.tb, c.m, c.n, c.k, 1.0f, da.data(), a_cols, db.data(), b_cols, beta, dc.data(), c.n);
  EXPECT_TRUE(close_scaled(dc.download(ctx.stream()), want, scale, tol));
}

TEST_F(CudaOps, SgemmMatchesCpuInFp32) {
  for (const GemmCase& c : kGemmCases) {
    SCOPED_TRACE(std::to_string(c.m) + "x" + std::to_string(c.n) + "x" + std::to_string(c.k) + " ta=" +
                 std::to_string(c.ta) + " tb=" + std::to_string(c.tb));
    run_gemm_case(*ctx, c, 1e-6, 0.0f);
    run_gemm_case(*ctx, c, 1e-6, 1.0f);  // accumulate, as the layers' weight gradients do
  }
}

TEST(CudaOpsTf32, SgemmWithinTf32Rounding) {
  SKIP_WITHOUT_GPU();
  CudaContextOptions opt;
  opt.matmul_tf32 = true;
  CudaContext ctx(opt);
  for (const GemmCase& c : kGemmCases) run_gemm_case(ctx, c, 2e-3, 0.0f);
}

// ---- convolution ----

struct ConvRun {
  std::vector<float> y, dx, dw;
};

// The CPU layer: y = conv(x, w), then backward(dy): dx and dw (from zero).
ConvRun cpu_conv(const lab::cuda::Conv2dShape& s, const std::vector<float>& x, const std::vector<float>& w,
                 const std::vector<float>& dy) {
  lab::Conv2d conv(s.cin, s.cout, s.k, s.pad, false);
  conv.weight().value.data = w;
  lab::Tensor tx({s.n, s.cin, s.h, s.w}), ty, tdy({s.n, s.cout, s.ho(), s.wo()}), tdx;
  tx.data = x;
  tdy.data = dy;
  conv.forward(tx, ty, lab::Mode::Train);
  conv.weight().grad.zero();
  conv.backward(tdy, &tdx);
  return {ty.data, tdx.data, conv.weight().grad.data};
}

ConvRun gpu_conv(CudaContext& ctx, lab::cuda::CudnnConv2d& conv, const std::vector<float>& x,
                 const std::vector<float>& w, const std::vector<float>& dy) {
  const lab::cuda::Conv2dShape& s = conv.shape();
  auto dxin = on_device(ctx, x), dwin = on_device(ctx, w), ddy = on_device(ctx, dy);
  auto y = poisoned<float>(ctx, static_cast<size_t>(s.n) * s.cout * s.ho() * s.wo());
  auto dx = poisoned<float>(ctx, x.size());
  DeviceBuffer<float> dw(w.size());
  dw.fill_bytes(0, ctx.stream());
  conv.forward(dxin.data(), dwin.data(), y.data());
  conv.backward_data(dwin.data(), ddy.data(), dx.data());
  conv.backward_filter(dxin.data(), ddy.data(), dw.data(), 1.0f);
  return {y.download(ctx.stream()), dx.download(ctx.stream()), dw.download(ctx.stream())};
}

// The cnn's two convolutions at batch 16.
const lab::cuda::Conv2dShape kConvShapes[] = {{16, 1, 28, 28, 32, 3, 1}, {16, 32, 14, 14, 64, 3, 1}};

void check_conv(CudaContext& ctx, const lab::cuda::ConvAlgoForce& force, double tol) {
  for (const lab::cuda::Conv2dShape& s : kConvShapes) {
    SCOPED_TRACE("conv Cin " + std::to_string(s.cin) + " Cout " + std::to_string(s.cout));
    const std::vector<float> x = randn(static_cast<size_t>(s.n) * s.cin * s.h * s.w, 21);
    const std::vector<float> w = randn(static_cast<size_t>(s.cout) * s.cin * s.k * s.k, 22, 0.3f);
    const std::vector<float> dy = randn(static_cast<size_t>(s.n) * s.cout * s.ho() * s.wo(), 23);
    const ConvRun want = cpu_conv(s, x, w, dy);
    const ConvRun scale = cpu_conv(s, abs_of(x), abs_of(w), abs_of(dy));
    lab::cuda::CudnnConv2d conv(ctx, s, force);
    const ConvRun got = gpu_conv(ctx, conv, x, w, dy);
    for (const lab::cuda::ConvAlgoRecord* r : {&conv.forward_algo(), &conv.backward_data_algo(), &conv.backward_filter_algo()})
      ::testing::Test::RecordProperty(r->layer + " " + r->pass, r->algo + " (" + r->how + ", " + r->math + ")");
    EXPECT_TRUE(close_scaled(got.y, want.y, scale.y, tol)) << conv.forward_algo().algo;
    EXPECT_TRUE(close_scaled(got.dx, want.dx, scale.dx, tol)) << conv.backward_data_algo().algo;
    EXPECT_TRUE(close_scaled(got.dw, want.dw, scale.dw, tol)) << conv.backward_filter_algo().algo;
  }
}

TEST_F(CudaOps, ConvolutionDirectAlgorithmsMatchCpu) {
  lab::cuda::ConvAlgoForce force;
  force.forward = CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM;
  force.backward_data = CUDNN_CONVOLUTION_BWD_DATA_ALGO_1;
  force.backward_filter = CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1;
  check_conv(*ctx, force, 1e-6);
}

constexpr double kChosenConvTol = 5e-5;  // cuDNN's own choice may be FFT or Winograd (header comment)

TEST_F(CudaOps, ConvolutionHeuristicChoiceMatchesCpu) { check_conv(*ctx, {}, kChosenConvTol); }

TEST(CudaOpsConv, BenchmarkAndDeterministicChoicesMatchCpu) {
  SKIP_WITHOUT_GPU();
  for (int mode = 0; mode < 2; ++mode) {
    CudaContextOptions opt;
    opt.cudnn_benchmark = mode == 0;
    opt.cudnn_deterministic = mode == 1;
    SCOPED_TRACE(mode == 0 ? "cudnn_benchmark" : "cudnn_deterministic");
    CudaContext ctx(opt);
    check_conv(ctx, {}, kChosenConvTol);
    EXPECT_FALSE(ctx.conv_algorithms().empty());
    for (const lab::cuda::ConvAlgoRecord& r : ctx.conv_algorithms()) {
      EXPECT_EQ(r.how, mode == 0 ? "benchmark" : "heuristic");
      EXPECT_EQ(r.math, "FMA");
      if (mode == 1) {
        EXPECT_TRUE(r.deterministic) << r.algo;
      } else {
        EXPECT_GE(r.time_ms, 0.0f) << r.algo;
      }
      EXPECT_EQ(r.algo.rfind("CUDNN_CONVOLUTION_", 0), 0u) << r.algo;
    }
  }
}

TEST(CudaOpsTf32, ConvolutionWithinTf32Rounding) {
  SKIP_WITHOUT_GPU();
  CudaContextOptions opt;
  opt.conv_tf32 = true;
  CudaContext ctx(opt);
  check_conv(ctx, {}, 2e-3);
}

// ---- bias ----

TEST_F(CudaOps, BiasAddIsBitwiseAndBiasGradMatches) {
  const int64_t n = 16, c = 32, inner = 196;
  const std::vector<float> y0 = randn(static_cast<size_t>(n * c * inner), 31), b = randn(static_cast<size_t>(c), 32);
  std::vector<float> want = y0;
  for (size_t i = 0; i < want.size(); ++i) want[i] += b[(i / static_cast<size_t>(inner)) % static_cast<size_t>(c)];
  auto dy = on_device(*ctx, y0), db = on_device(*ctx, b);
  lab::cuda::bias_add(*ctx, dy.data(), db.data(), n, c, inner);
  EXPECT_TRUE(same_bits(dy.download(ctx->stream()), want));

  // bias gradient: db += sum over N and inner of dy, in double, then float (Conv2d::backward, Linear::backward)
  for (int64_t in : {int64_t{1}, inner}) {
    const std::vector<float> g = randn(static_cast<size_t>(n * c * in), 33);
    const std::vector<float> db0 = randn(static_cast<size_t>(c), 34);
    std::vector<float> want_db = db0, scale(static_cast<size_t>(c));
    for (int64_t ch = 0; ch < c; ++ch) {
      double s = 0.0, a = 0.0;
      for (int64_t b2 = 0; b2 < n; ++b2)
        for (int64_t i = 0; i < in; ++i) {
          s += g[static_cast<size_t>((b2 * c + ch) * in + i)];
          a += std::abs(g[static_cast<size_t>((b2 * c + ch) * in + i)]);
        }
      want_db[ch] += static_cast<float>(s);
      scale[ch] = static_cast<float>(a) + std::abs(db0[ch]);
    }
    auto dg = on_device(*ctx, g), dgrad = on_device(*ctx, db0);
    lab::cuda::bias_grad(*ctx, dg.data(), dgrad.data(), n, c, in);
    EXPECT_TRUE(close_scaled(dgrad.download(ctx->stream()), want_db, scale, 1e-6));
  }
}

// ---- ReLU ----

TEST_F(CudaOps, ReluIsBitwiseTheCpuLayer) {
  lab::Tensor x({64, 256}), y, g({64, 256}), dx;
  x.data = randn(x.data.size(), 41);
  x.data[1] = kNaN;
  x.data[2] = -0.0f;
  x.data[3] = kInf;
  x.data[4] = -kInf;
  g.data = randn(g.data.size(), 42);
  lab::ReLU relu;
  relu.forward(x, y, lab::Mode::Train);
  relu.backward(g, &dx);
  const size_t count = x.data.size();
  auto dxin = on_device(*ctx, x.data), dg = on_device(*ctx, g.data);
  auto dy = poisoned<float>(*ctx, count), ddx = poisoned<float>(*ctx, count);
  auto mask = poisoned<uint8_t>(*ctx, count);
  lab::cuda::relu_forward(*ctx, dxin.data(), dy.data(), mask.data(), static_cast<int64_t>(count));
  lab::cuda::relu_backward(*ctx, dg.data(), mask.data(), ddx.data(), static_cast<int64_t>(count));
  EXPECT_TRUE(same_bits(dy.download(ctx->stream()), y.data));
  EXPECT_TRUE(same_bits(ddx.download(ctx->stream()), dx.data));
  const std::vector<uint8_t> m = mask.download(ctx->stream());
  for (size_t i = 0; i < count; ++i) ASSERT_EQ(m[i], lab::relu_passes(x.data[i]) ? 1 : 0) << i;
}

// ---- max-pool ----

TEST_F(CudaOps, MaxPoolIsBitwiseTheCpuLayer) {
  // even planes (the CPU's fast path) and odd ones (its general path: the last row/column unused);
  // ties and NaNs in the windows
  for (const std::vector<int64_t>& shape : {std::vector<int64_t>{16, 32, 28, 28}, std::vector<int64_t>{4, 3, 7, 9}}) {
    SCOPED_TRACE(lab::shape_str(shape));
    lab::Tensor x(shape), y, g, dx;
    x.data = quantized(x.data.size(), 51, 97);
    lab::MaxPool2d pool(2);
    pool.forward(x, y, lab::Mode::Train);
    g = lab::Tensor(y.shape);
    g.data = randn(g.data.size(), 52);
    pool.backward(g, &dx);
    const int64_t planes = shape[0] * shape[1];
    const int h = static_cast<int>(shape[2]), w = static_cast<int>(shape[3]);
    auto dxin = on_device(*ctx, x.data), dg = on_device(*ctx, g.data);
    auto dy = poisoned<float>(*ctx, y.data.size()), ddx = poisoned<float>(*ctx, x.data.size());
    auto arg = poisoned<int32_t>(*ctx, y.data.size());
    lab::cuda::maxpool2x2_forward(*ctx, dxin.data(), dy.data(), arg.data(), planes, h, w);
    lab::cuda::maxpool2x2_backward(*ctx, dg.data(), arg.data(), ddx.data(), planes, h, w);
    EXPECT_TRUE(same_bits(dy.download(ctx->stream()), y.data));
    EXPECT_TRUE(same_bits(ddx.download(ctx->stream()), dx.data));
  }
}

// ---- BatchNorm ----

struct BnCase {
  const char* name;
  std::vector<int64_t> shape;  // (N, C) or (N, C, H, W)
};
const BnCase kBnCases[] = {{"BatchNorm1d(256)", {64, 256}}, {"BatchNorm2d(32)", {16, 32, 28, 28}}};

TEST_F(CudaOps, BatchNormMatchesTheCpuLayer) {
  for (const BnCase& bc : kBnCases) {
    SCOPED_TRACE(bc.name);
    const int64_t nb = bc.shape[0], c = bc.shape[1];
    const int64_t inner = bc.shape.size() == 4 ? bc.shape[2] * bc.shape[3] : 1;
    const int64_t n = nb * inner;
    const size_t cs = static_cast<size_t>(c);
    lab::BatchNormOptions opt;
    opt.num_features = static_cast<int>(c);
    opt.spatial_dims = bc.shape.size() == 4 ? 2 : 0;
    lab::BatchNorm bn(opt);
    bn.weight().value.data = randn(cs, 61);
    bn.bias().value.data = randn(cs, 62);
    lab::Tensor x(bc.shape), y, dy(bc.shape), dx;
    x.data = randn(x.data.size(), 63, 2.0f);
    for (float& v : x.data) v += 1.5f;  // a mean far from 0: the two-pass variance matters
    dy.data = randn(dy.data.size(), 64);
    bn.forward(x, y, lab::Mode::Train);
    bn.weight().grad.zero();
    bn.bias().grad.zero();
    bn.backward(dy, &dx);
    const lab::BnBatchStats& st = bn.last_stats();

    // statistics: mean within 1e-6 of the mean of |x|; variance within 1e-6 of itself (a sum of squares)
    auto dxin = on_device(*ctx, x.data);
    auto mean = poisoned<float>(*ctx, cs), var_sum = poisoned<float>(*ctx, cs), var = poisoned<float>(*ctx, cs);
    lab::cuda::bn_batch_stats(*ctx, dxin.data(), nb, c, inner, mean.data(), var_sum.data(), var.data());
    std::vector<float> mean_scale(cs, 0.0f);
    for (int64_t ch = 0; ch < c; ++ch) {
      double a = 0.0;
      for (int64_t b = 0; b < nb; ++b)
        for (int64_t i = 0; i < inner; ++i) a += std::abs(x.data[static_cast<size_t>((b * c + ch) * inner + i)]);
      mean_scale[static_cast<size_t>(ch)] = static_cast<float>(a / static_cast<double>(n));
    }
    EXPECT_TRUE(close_scaled(mean.download(ctx->stream()), st.mean, mean_scale, 1e-6));
    EXPECT_TRUE(close_scaled(var.download(ctx->stream()), st.var, st.var, 1e-6));

    // everything downstream from the CPU's own statistics and sums: bitwise
    auto cpu_mean = on_device(*ctx, st.mean), cpu_var = on_device(*ctx, st.var);
    auto w = on_device(*ctx, bn.weight().value.data), b = on_device(*ctx, bn.bias().value.data);
    auto invstd = poisoned<float>(*ctx, cs), alpha = poisoned<float>(*ctx, cs), beta = poisoned<float>(*ctx, cs);
    lab::cuda::bn_forward_coefficients(*ctx, cpu_mean.data(), cpu_var.data(), w.data(), b.data(), opt.eps, c,
                                       invstd.data(), alpha.data(), beta.data());
    EXPECT_TRUE(same_bits(alpha.download(ctx->stream()), bn.alpha()));
    EXPECT_TRUE(same_bits(beta.download(ctx->stream()), bn.beta()));
    auto gy = poisoned<float>(*ctx, x.data.size());
    lab::cuda::bn_apply(*ctx, dxin.data(), alpha.data(), beta.data(), gy.data(), nb, c, inner);
    EXPECT_TRUE(same_bits(gy.download(ctx->stream()), y.data));

    // running statistics: the kernel is bn_running_update; fed the same var_sum it gives the
    // host's bits, and from its own statistics the layer's values within 1e-6
    std::vector<float> var_sum_host(cs), rm_want(cs, 0.0f), rv_want(cs, 1.0f);
    for (size_t ch = 0; ch < cs; ++ch) {
      var_sum_host[ch] = st.var[ch] * static_cast<float>(n);
      lab::bn_running_update(rm_want[ch], rv_want[ch], st.mean[ch], var_sum_host[ch], n, 0.1f);
    }
    auto rm = on_device(*ctx, std::vector<float>(cs, 0.0f)), rv = on_device(*ctx, std::vector<float>(cs, 1.0f));
    auto dvs = on_device(*ctx, var_sum_host);
    lab::cuda::bn_running_update(*ctx, cpu_mean.data(), dvs.data(), n, 0.1f, rm.data(), rv.data(), c);
    EXPECT_TRUE(same_bits(rm.download(ctx->stream()), rm_want));
    EXPECT_TRUE(same_bits(rv.download(ctx->stream()), rv_want));
    auto rm2 = on_device(*ctx, std::vector<float>(cs, 0.0f)), rv2 = on_device(*ctx, std::vector<float>(cs, 1.0f));
    lab::cuda::bn_running_update(*ctx, mean.data(), var_sum.data(), n, 0.1f, rm2.data(), rv2.data(), c);
    EXPECT_TRUE(close_scaled(rm2.download(ctx->stream()), bn.running_mean().value.data, abs_of(mean_scale), 1e-6));
    EXPECT_TRUE(close_scaled(rv2.download(ctx->stream()), bn.running_var().value.data, bn.running_var().value.data, 1e-6));

    // backward sums within 1e-6 of the sums of absolute terms
    auto ddy = on_device(*ctx, dy.data);
    DeviceBuffer<double> sum_dy(cs), sum_xmu(cs);
    sum_dy.fill_bytes(0xFF, ctx->stream());
    sum_xmu.fill_bytes(0xFF, ctx->stream());
    lab::cuda::bn_grad_sums(*ctx, ddy.data(), dxin.data(), cpu_mean.data(), nb, c, inner, sum_dy.data(), sum_xmu.data());
    const std::vector<double> gs_dy = sum_dy.download(ctx->stream()), gs_xmu = sum_xmu.download(ctx->stream());
    std::vector<double> want_dy(cs, 0.0), want_xmu(cs, 0.0), abs_dy(cs, 0.0), abs_xmu(cs, 0.0);
    for (int64_t ch = 0; ch < c; ++ch)
      for (int64_t bb = 0; bb < nb; ++bb)
        for (int64_t i = 0; i < inner; ++i) {
          const size_t at = static_cast<size_t>((bb * c + ch) * inner + i);
          const float t = lab::bn_xmu_dy(x.data[at], st.mean[static_cast<size_t>(ch)], dy.data[at]);
          want_dy[static_cast<size_t>(ch)] += dy.data[at];
          want_xmu[static_cast<size_t>(ch)] += t;
          abs_dy[static_cast<size_t>(ch)] += std::abs(dy.data[at]);
          abs_xmu[static_cast<size_t>(ch)] += std::abs(t);
        }
    for (size_t ch = 0; ch < cs; ++ch) {
      EXPECT_NEAR(gs_dy[ch], want_dy[ch], 1e-6 * abs_dy[ch]) << "channel " << ch;
      EXPECT_NEAR(gs_xmu[ch], want_xmu[ch], 1e-6 * abs_xmu[ch]) << "channel " << ch;
    }
    // coefficients and dx from the GPU's sums: parameter gradients within 1e-6 of the sums of
    // absolute terms, dx within 1e-6 of its largest value (the coefficients may differ by an ulp)
    auto dweight = on_device(*ctx, std::vector<float>(cs, 0.0f)), dbias = on_device(*ctx, std::vector<float>(cs, 0.0f));
    auto gm = poisoned<float>(*ctx, cs), kk = poisoned<float>(*ctx, cs), sc = poisoned<float>(*ctx, cs);
    auto cpu_invstd = on_device(*ctx, [&] {
      std::vector<float> v(cs);
      for (size_t ch = 0; ch < cs; ++ch) v[ch] = lab::bn_invstd(st.var[ch], opt.eps);
      return v;
    }());
    lab::cuda::bn_backward_coefficients(*ctx, sum_dy.data(), sum_xmu.data(), nullptr, cpu_invstd.data(), w.data(), n, c,
                                        dweight.data(), dbias.data(), gm.data(), kk.data(), sc.data());
    std::vector<float> wscale(cs), bscale(cs);
    for (size_t ch = 0; ch < cs; ++ch) {
      wscale[ch] = static_cast<float>(abs_xmu[ch] * lab::bn_invstd(st.var[ch], opt.eps));
      bscale[ch] = static_cast<float>(abs_dy[ch]);
    }
    EXPECT_TRUE(close_scaled(dweight.download(ctx->stream()), bn.weight().grad.data, wscale, 1e-6));
    EXPECT_TRUE(close_scaled(dbias.download(ctx->stream()), bn.bias().grad.data, bscale, 1e-6));
    auto gdx = poisoned<float>(*ctx, x.data.size());
    lab::cuda::bn_input_grad(*ctx, ddy.data(), dxin.data(), cpu_mean.data(), gm.data(), kk.data(), sc.data(),
                             gdx.data(), nb, c, inner);
    EXPECT_TRUE(close_to_max(gdx.download(ctx->stream()), dx.data, 1e-6));
  }
}

// BatchNorm whole on the device (the executor's resident layer): the per-channel steps the host's
// layer used to finish, as kernels, bitwise the CPU layer's from the same inputs. SyncBN over 3
// ranks, one of them empty: the gathered rows, their combination and the running statistics; the
// eval coefficients from running statistics; the backward coefficients from allreduced float sums.
TEST_F(CudaOps, BatchNormsPerChannelStepsAreBitwiseTheCpuLayers) {
  const int64_t c = 37;
  const size_t cs = static_cast<size_t>(c);
  const int world = 3;
  const int64_t counts[world] = {48, 0, 80};
  lab::BatchNormOptions opt;
  opt.num_features = static_cast<int>(c);
  // every rank's row as the CPU layer sends it: [mean | biased var | count], zeros for an empty rank
  std::vector<float> all;
  for (int r = 0; r < world; ++r) {
    std::vector<float> mean = randn(cs, 70 + static_cast<uint32_t>(r)), var = abs_of(randn(cs, 80 + static_cast<uint32_t>(r)));
    auto dm = on_device(*ctx, mean), dv = on_device(*ctx, var);
    auto row = poisoned<float>(*ctx, 2 * cs + 1);
    lab::cuda::bn_pack_row(*ctx, dm.data(), dv.data(), counts[r], c, row.data());
    std::vector<float> want(2 * cs + 1, 0.0f);
    if (counts[r] > 0) {
      std::copy(mean.begin(), mean.end(), want.begin());
      std::copy(var.begin(), var.end(), want.begin() + c);
      want[2 * cs] = static_cast<float>(counts[r]);
    }
    const std::vector<float> got = row.download(ctx->stream());
    EXPECT_TRUE(same_bits(got, want)) << "rank " << r;
    all.insert(all.end(), want.begin(), want.end());
  }
  // the combination and the running statistics (momentum None after 3 batches: factor 1/3)
  const double factor = 1.0 / 3.0;
  std::vector<float> rm = randn(cs, 90), rv = abs_of(randn(cs, 91)), mean_want(cs), var_want(cs);
  std::vector<float> rm_want = rm, rv_want = rv;
  for (int64_t ch = 0; ch < c; ++ch) {
    const lab::BnGlobalStats g = lab::bn_combine_channel(all.data(), world, c, ch);
    mean_want[ch] = static_cast<float>(g.avg);
    var_want[ch] = static_cast<float>(g.m2 / g.cnt);
    lab::bn_running_update_global(rm_want[ch], rv_want[ch], g.avg, g.m2, g.cnt, factor);
  }
  auto dall = on_device(*ctx, all), drm = on_device(*ctx, rm), drv = on_device(*ctx, rv);
  auto gmean = poisoned<float>(*ctx, cs), gvar = poisoned<float>(*ctx, cs);
  lab::cuda::bn_combine_stats(*ctx, dall.data(), world, c, true, factor, drm.data(), drv.data(), gmean.data(), gvar.data());
  EXPECT_TRUE(same_bits(gmean.download(ctx->stream()), mean_want));
  EXPECT_TRUE(same_bits(gvar.download(ctx->stream()), var_want));
  EXPECT_TRUE(same_bits(drm.download(ctx->stream()), rm_want));
  EXPECT_TRUE(same_bits(drv.download(ctx->stream()), rv_want));
  // ... and the CPU layer's own combination (SyncBN through its BnSync) gives those bits too
  {
    struct TableSync : lab::BnSync {
      const std::vector<float>& table;
      explicit TableSync(const std::vector<float>& t) : table(t) {}
      int world_size() const override { return 3; }
      void allgather(const float*, int, std::vector<float>& out) override { out = table; }
      void allreduce_sum(float*, int) override {}
    } sync(all);
    lab::BatchNormOptions o = opt;
    o.momentum = std::nullopt;
    lab::BatchNorm cum(o);
    cum.set_sync(&sync);
    cum.running_mean().value.data = rm;
    cum.running_var().value.data = rv;
    cum.num_batches_tracked().i64 = 2;
    lab::Tensor x({48, c});
    x.data = randn(x.data.size(), 92);
    lab::Tensor y;
    cum.forward(x, y, lab::Mode::Train);
    EXPECT_TRUE(same_bits(cum.last_stats().mean, mean_want));
    EXPECT_TRUE(same_bits(cum.last_stats().var, var_want));
    EXPECT_TRUE(same_bits(cum.running_mean().value.data, rm_want));
    EXPECT_TRUE(same_bits(cum.running_var().value.data, rv_want));
  }
  // eval with running statistics: the layer's mean, alpha and beta
  lab::BatchNorm ev(opt);
  ev.weight().value.data = randn(cs, 93);
  ev.bias().value.data = randn(cs, 94);
  ev.running_mean().value.data = rm;
  ev.running_var().value.data = rv;
  lab::Tensor xe({4, c});
  xe.data = randn(xe.data.size(), 95);
  ev.prepare_forward(xe, lab::Mode::Eval);
  auto w = on_device(*ctx, ev.weight().value.data), b = on_device(*ctx, ev.bias().value.data);
  auto emean = poisoned<float>(*ctx, cs), einv = poisoned<float>(*ctx, cs), ea = poisoned<float>(*ctx, cs),
       eb = poisoned<float>(*ctx, cs);
  auto drm0 = on_device(*ctx, rm), drv0 = on_device(*ctx, rv);
  lab::cuda::bn_eval_coefficients(*ctx, drm0.data(), drv0.data(), w.data(), b.data(), static_cast<float>(opt.eps), c,
                                  emean.data(), einv.data(), ea.data(), eb.data());
  EXPECT_TRUE(same_bits(emean.download(ctx->stream()), ev.mean()));
  EXPECT_TRUE(same_bits(ea.download(ctx->stream()), ev.alpha()));
  EXPECT_TRUE(same_bits(eb.download(ctx->stream()), ev.beta()));
  // backward: the sums rounded to float for SyncBN's allreduce; the coefficients from the reduced
  // sums, the weight and bias gradients from this rank's own
  std::vector<double> sdy(cs), sxmu(cs);
  std::vector<float> global(2 * cs), invstd(cs);
  {
    const std::vector<float> a = randn(2 * cs, 96), g = randn(2 * cs, 97), is = abs_of(randn(cs, 98));
    for (size_t ch = 0; ch < cs; ++ch) {
      sdy[ch] = 3.0 * a[ch] + 1e-9;  // not a float: the rounding shows
      sxmu[ch] = 5.0 * a[cs + ch] - 1e-9;
      global[ch] = g[ch];
      global[cs + ch] = g[cs + ch];
      invstd[ch] = is[ch] + 0.5f;
    }
  }
  auto dsdy = on_device(*ctx, sdy), dsxmu = on_device(*ctx, sxmu);
  auto rounded = poisoned<float>(*ctx, 2 * cs);
  lab::cuda::bn_sums_to_float(*ctx, dsdy.data(), dsxmu.data(), c, rounded.data());
  std::vector<float> rounded_want(2 * cs);
  for (size_t ch = 0; ch < cs; ++ch) {
    rounded_want[ch] = static_cast<float>(sdy[ch]);
    rounded_want[cs + ch] = static_cast<float>(sxmu[ch]);
  }
  EXPECT_TRUE(same_bits(rounded.download(ctx->stream()), rounded_want));
  auto dglobal = on_device(*ctx, global), dinv = on_device(*ctx, invstd);
  auto dw = on_device(*ctx, std::vector<float>(cs, 0.25f)), db = on_device(*ctx, std::vector<float>(cs, -0.5f));
  auto gm = poisoned<float>(*ctx, cs), kk = poisoned<float>(*ctx, cs), sc = poisoned<float>(*ctx, cs);
  const int64_t count = 128;
  lab::cuda::bn_backward_coefficients(*ctx, dsdy.data(), dsxmu.data(), dglobal.data(), dinv.data(), w.data(), count, c,
                                      dw.data(), db.data(), gm.data(), kk.data(), sc.data());
  std::vector<float> gm_want(cs), k_want(cs), sc_want(cs), dw_want(cs, 0.25f), db_want(cs, -0.5f);
  for (size_t ch = 0; ch < cs; ++ch) {
    dw_want[ch] += lab::bn_weight_grad(sxmu[ch], invstd[ch]);
    db_want[ch] += lab::bn_bias_grad(sdy[ch]);
    const lab::BnInputGradCoefficients k = lab::bn_input_grad_coefficients(
        global[ch], global[cs + ch], invstd[ch], ev.weight().value.data[ch], static_cast<double>(count));
    gm_want[ch] = k.grad_mean;
    k_want[ch] = k.k;
    sc_want[ch] = k.scale;
  }
  EXPECT_TRUE(same_bits(dw.download(ctx->stream()), dw_want));
  EXPECT_TRUE(same_bits(db.download(ctx->stream()), db_want));
  EXPECT_TRUE(same_bits(gm.download(ctx->stream()), gm_want));
  EXPECT_TRUE(same_bits(kk.download(ctx->stream()), k_want));
  EXPECT_TRUE(same_bits(sc.download(ctx->stream()), sc_want));
}

// ---- cross-entropy ----

TEST_F(CudaOps, CrossEntropyMatchesCpu) {
  for (int64_t n : {int64_t{7}, int64_t{64}, int64_t{1000}}) {
    SCOPED_TRACE("N = " + std::to_string(n));
    const int64_t c = 10;
    lab::Tensor logits({n, c}), dlogits;
    logits.data = randn(static_cast<size_t>(n * c), 71, 4.0f);
    std::vector<int> labels(static_cast<size_t>(n));
    std::mt19937 g(72);
    for (int& l : labels) l = static_cast<int>(g() % 10);
    int correct = -1;
    const float loss = lab::cross_entropy(logits, labels, &dlogits, &correct);
    auto dl = on_device(*ctx, logits.data);
    auto dlab = on_device(*ctx, std::vector<int32_t>(labels.begin(), labels.end()));
    auto dloss = poisoned<float>(*ctx, 1);
    auto dcorrect = poisoned<int32_t>(*ctx, 1);
    auto dd = poisoned<float>(*ctx, logits.data.size());
    lab::cuda::cross_entropy(*ctx, dl.data(), dlab.data(), n, c, dloss.data(), dcorrect.data(), dd.data());
    EXPECT_TRUE(close_scaled(dloss.download(ctx->stream()), {loss}, {std::abs(loss)}, 1e-6));
    EXPECT_EQ(dcorrect.download(ctx->stream())[0], correct);
    EXPECT_TRUE(close_to_max(dd.download(ctx->stream()), dlogits.data, 1e-6));
  }
}

// ---- SGD ----

TEST_F(CudaOps, SgdIsBitwiseTheCpuOptimizer) {
  const size_t count = 100000;
  for (bool nesterov : {false, true})
    for (double momentum : {0.0, 0.9})
      for (double wd : {0.0, 5e-4}) {
        if (nesterov && momentum == 0.0) continue;
        SCOPED_TRACE("nesterov=" + std::to_string(nesterov) + " momentum=" + std::to_string(momentum) +
                     " wd=" + std::to_string(wd));
        lab::SgdOptions opt;
        opt.lr = 0.05;
        opt.momentum = momentum;
        opt.weight_decay = wd;
        opt.nesterov = nesterov;
        opt.dampening = nesterov ? 0.0 : 0.1;
        lab::Param p{"w", lab::Tensor({static_cast<int64_t>(count)}), lab::Tensor({static_cast<int64_t>(count)})};
        p.value.data = randn(count, 81);
        lab::Optimizer sgd({&p}, opt);
        auto w = on_device(*ctx, p.value.data);
        DeviceBuffer<float> buf(count);
        buf.fill_bytes(0xFF, ctx->stream());  // the first step must not read it
        for (int step = 0; step < 3; ++step) {
          p.grad.data = randn(count, 82 + static_cast<uint32_t>(step));
          sgd.step();
          auto g = on_device(*ctx, p.grad.data);
          lab::cuda::sgd_step(*ctx, w.data(), g.data(), buf.data(), static_cast<int64_t>(count), opt, step == 0);
          EXPECT_TRUE(same_bits(w.download(ctx->stream()), p.value.data)) << "step " << step;
          if (momentum != 0.0) {
            EXPECT_TRUE(same_bits(buf.download(ctx->stream()), sgd.momentum_buffers()[0].data));
          }
        }
      }
}

// ---- several tensors per kernel (a captured step's) ----

// 60 tensors (more than one kernel's 48) of sizes from 1 to 100000: the flags of nonfinite_flags
// are the host's test of each (a NaN in one, an infinity in another, the rest finite), and
// sgd_step_multi gives every tensor the bits of the CPU optimizer, or leaves all unchanged when
// its skip flag is set.
TEST_F(CudaOps, MultiTensorFlagsAndSgdAreThePerTensorOnes) {
  const size_t n = 60;
  std::vector<lab::Param> ps(n);
  std::vector<std::unique_ptr<DeviceBuffer<float>>> w, g, buf;
  std::vector<const float*> gs;
  std::vector<float*> ws, bufs;
  std::vector<int64_t> counts;
  for (size_t t = 0; t < n; ++t) {
    const size_t count = t % 7 == 0 ? 1 : t % 5 == 0 ? 100000 : 37 * t + 3;
    ps[t] = lab::Param{"p" + std::to_string(t), lab::Tensor({static_cast<int64_t>(count)}),
                       lab::Tensor({static_cast<int64_t>(count)})};
    ps[t].value.data = randn(count, 300 + static_cast<uint32_t>(t));
    ps[t].grad.data = randn(count, 400 + static_cast<uint32_t>(t));
    w.push_back(std::make_unique<DeviceBuffer<float>>(on_device(*ctx, ps[t].value.data)));
    g.push_back(std::make_unique<DeviceBuffer<float>>(on_device(*ctx, ps[t].grad.data)));
    buf.push_back(std::make_unique<DeviceBuffer<float>>(count));
    buf.back()->fill_bytes(0xFF, ctx->stream());  // the first step must not read it
    gs.push_back(g.back()->data());
    ws.push_back(w.back()->data());
    bufs.push_back(buf.back()->data());
    counts.push_back(static_cast<int64_t>(count));
  }
  DeviceBuffer<int32_t> flags(n + 1);
  lab::cuda::nonfinite_flags(*ctx, gs, counts, flags.data());
  lab::cuda::any_flag(*ctx, flags.data(), static_cast<int64_t>(n), flags.data() + n);
  std::vector<int32_t> f = flags.download(ctx->stream());
  for (size_t t = 0; t < n; ++t) EXPECT_EQ(f[t], 0) << "tensor " << t;
  EXPECT_EQ(f[n], 0);
  lab::SgdOptions opt;
  opt.lr = 0.05;
  opt.momentum = 0.9;
  opt.weight_decay = 5e-4;
  std::vector<lab::Param*> pp;
  for (auto& p : ps) pp.push_back(&p);
  lab::Optimizer sgd(pp, opt);
  for (int step = 0; step < 2; ++step) {
    sgd.step();
    lab::cuda::sgd_step_multi(*ctx, ws, gs, bufs, counts, opt, step == 0, flags.data() + n);
    for (size_t t = 0; t < n; ++t) {
      EXPECT_TRUE(same_bits(w[t]->download(ctx->stream()), ps[t].value.data)) << "step " << step << " tensor " << t;
      EXPECT_TRUE(same_bits(buf[t]->download(ctx->stream()), sgd.momentum_buffers()[t].data)) << "tensor " << t;
    }
  }
  // a NaN in tensor 5 (100000 values, at the end), an infinity in tensor 52 (beyond the first kernel)
  ps[5].grad.data.back() = std::numeric_limits<float>::quiet_NaN();
  ps[52].grad.data[3] = -std::numeric_limits<float>::infinity();
  g[5]->upload(ps[5].grad.data.data(), ps[5].grad.data.size(), ctx->stream());
  g[52]->upload(ps[52].grad.data.data(), ps[52].grad.data.size(), ctx->stream());
  lab::cuda::nonfinite_flags(*ctx, gs, counts, flags.data());
  lab::cuda::any_flag(*ctx, flags.data(), static_cast<int64_t>(n), flags.data() + n);
  f = flags.download(ctx->stream());
  for (size_t t = 0; t < n; ++t) EXPECT_EQ(f[t], t == 5 || t == 52 ? 1 : 0) << "tensor " << t;
  EXPECT_EQ(f[n], 1);
  const std::vector<float> before = w[0]->download(ctx->stream());
  lab::cuda::sgd_step_multi(*ctx, ws, gs, bufs, counts, opt, false, flags.data() + n);  // skipped
  EXPECT_TRUE(same_bits(w[0]->download(ctx->stream()), before));
  EXPECT_TRUE(same_bits(w[5]->download(ctx->stream()), ps[5].value.data));
}

// ---- Adam / AdamW ----

// The moments start at zero on both (PyTorch's lazy state); five steps with fresh gradients, the
// bias corrections of each step (adam_coeffs, on the host for both) and adam_element's two
// roundings per product (--fmad=false): every weight and moment bit for bit.
TEST_F(CudaOps, AdamIsBitwiseTheCpuOptimizer) {
  const size_t count = 100000;
  for (bool decoupled : {false, true})
    for (double wd : {0.0, 0.01}) {
      SCOPED_TRACE(std::string(decoupled ? "adamw" : "adam") + " wd=" + std::to_string(wd));
      lab::OptimizerOptions opt;
      opt.kind = decoupled ? "adamw" : "adam";
      opt.adam.lr = 1e-3;
      opt.adam.weight_decay = wd;
      opt.adam.decoupled = decoupled;
      lab::Param p{"w", lab::Tensor({static_cast<int64_t>(count)}), lab::Tensor({static_cast<int64_t>(count)})};
      p.value.data = randn(count, 83);
      lab::Optimizer adam({&p}, opt);
      auto w = on_device(*ctx, p.value.data);
      DeviceBuffer<float> m(count), v(count);
      m.fill_bytes(0, ctx->stream());
      v.fill_bytes(0, ctx->stream());
      for (int step = 1; step <= 5; ++step) {
        p.grad.data = randn(count, 84 + static_cast<uint32_t>(step));
        if (step == 3) p.grad.data[7] = 0.0f;  // a zero gradient: the step is the momentum's alone
        adam.step();
        auto g = on_device(*ctx, p.grad.data);
        lab::cuda::adam_step(*ctx, w.data(), g.data(), m.data(), v.data(), static_cast<int64_t>(count), opt.adam, step);
        EXPECT_TRUE(same_bits(w.download(ctx->stream()), p.value.data)) << "step " << step;
        EXPECT_TRUE(same_bits(m.download(ctx->stream()), adam.state("exp_avg")[0].data)) << "step " << step;
        EXPECT_TRUE(same_bits(v.download(ctx->stream()), adam.state("exp_avg_sq")[0].data)) << "step " << step;
      }
    }
}

// ---- determinism: two runs of every op without atomics give the same bits ----

TEST_F(CudaOps, DeterministicOpsRepeatBitwise) {
  const int64_t nb = 64, c = 32, inner = 196;
  const size_t count = static_cast<size_t>(nb * c * inner);
  auto x = on_device(*ctx, randn(count, 91)), g = on_device(*ctx, randn(count, 92));
  auto run = [&] {
    std::vector<float> out;
    auto append = [&](const std::vector<float>& v) { out.insert(out.end(), v.begin(), v.end()); };
    auto mean = poisoned<float>(*ctx, static_cast<size_t>(c)), vs = poisoned<float>(*ctx, static_cast<size_t>(c)),
         var = poisoned<float>(*ctx, static_cast<size_t>(c));
    lab::cuda::bn_batch_stats(*ctx, x.data(), nb, c, inner, mean.data(), vs.data(), var.data());
    DeviceBuffer<double> s1(static_cast<size_t>(c)), s2(static_cast<size_t>(c));
    lab::cuda::bn_grad_sums(*ctx, g.data(), x.data(), mean.data(), nb, c, inner, s1.data(), s2.data());
    auto db = on_device(*ctx, std::vector<float>(static_cast<size_t>(c), 0.0f));
    lab::cuda::bias_grad(*ctx, g.data(), db.data(), nb, c, inner);
    append(mean.download(ctx->stream()));
    append(var.download(ctx->stream()));
    append(db.download(ctx->stream()));
    for (double v : s1.download(ctx->stream())) append({static_cast<float>(v), static_cast<float>(v - static_cast<float>(v))});
    for (double v : s2.download(ctx->stream())) append({static_cast<float>(v), static_cast<float>(v - static_cast<float>(v))});
    // the loss over 4096 rows of 10
    auto loss = poisoned<float>(*ctx, 1);
    auto correct = poisoned<int32_t>(*ctx, 1);
    auto labels = on_device(*ctx, std::vector<int32_t>(4096, 3));
    lab::cuda::cross_entropy(*ctx, x.data(), labels.data(), 4096, 10, loss.data(), correct.data(), nullptr);
    append(loss.download(ctx->stream()));
    // a product
    auto prod = poisoned<float>(*ctx, 256 * 256);
    lab::cuda::sgemm(*ctx, false, true, 256, 256, 784, 1.0f, x.data(), 784, g.data(), 784, 0.0f, prod.data(), 256);
    append(prod.download(ctx->stream()));
    return out;
  };
  EXPECT_TRUE(same_bits(run(), run()));
}

TEST(CudaOpsConv, DeterministicModeRepeatsBitwiseAndAForcedAtomicAlgorithmIsMarked) {
  SKIP_WITHOUT_GPU();
  CudaContextOptions opt;
  opt.cudnn_deterministic = true;
  CudaContext ctx(opt);
  const lab::cuda::Conv2dShape s = kConvShapes[1];
  const std::vector<float> x = randn(static_cast<size_t>(s.n) * s.cin * s.h * s.w, 101);
  const std::vector<float> w = randn(static_cast<size_t>(s.cout) * s.cin * s.k * s.k, 102, 0.3f);
  const std::vector<float> dy = randn(static_cast<size_t>(s.n) * s.cout * s.ho() * s.wo(), 103);
  lab::cuda::CudnnConv2d det(ctx, s);
  const ConvRun a = gpu_conv(ctx, det, x, w, dy), b = gpu_conv(ctx, det, x, w, dy);
  EXPECT_TRUE(same_bits(a.y, b.y));
  EXPECT_TRUE(same_bits(a.dx, b.dx));
  EXPECT_TRUE(same_bits(a.dw, b.dw));
  // BWD_FILTER_ALGO_0 adds with atomics: recorded as non-deterministic. Whether two runs differ
  // depends on timing; the number of distinct results over 10 runs is recorded, not asserted.
  lab::cuda::ConvAlgoForce force;
  force.backward_filter = CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0;
  lab::cuda::CudnnConv2d atomic(ctx, s, force);
  EXPECT_FALSE(atomic.backward_filter_algo().deterministic);
  EXPECT_EQ(atomic.backward_filter_algo().how, "forced");
  std::set<std::vector<uint32_t>> distinct;
  for (int i = 0; i < 10; ++i) {
    const ConvRun r = gpu_conv(ctx, atomic, x, w, dy);
    std::vector<uint32_t> key;
    for (float v : r.dw) key.push_back(bits(v));
    distinct.insert(key);
  }
  ::testing::Test::RecordProperty("bwd_filter_algo_0_distinct_results_of_10", static_cast<int>(distinct.size()));
  std::printf("BWD_FILTER_ALGO_0: %zu distinct weight gradients in 10 runs\n", distinct.size());
}

// ---- errors: the typed error, with the library's own status string and a hint ----

TEST(CudaErrors, InvalidArgumentsGiveDeviceErrorsWithTheLibrarysString) {
  SKIP_WITHOUT_GPU();
  CudaContext ctx;
  auto expect_device_error = [](const std::function<void()>& f, const std::string& status) {
    try {
      f();
      ADD_FAILURE() << "no error; expected " << status;
    } catch (const lab::DeviceError& e) {
      EXPECT_NE(std::string(e.what()).find(status), std::string::npos) << e.what();
      EXPECT_FALSE(e.hint().empty());
      EXPECT_EQ(e.exit_code(), lab::kExitDevice);
    }
  };
  DeviceBuffer<float> a(64), c(64);
  // cuBLAS: a leading dimension shorter than a row
  expect_device_error([&] { lab::cuda::sgemm(ctx, false, false, 8, 8, 8, 1.0f, a.data(), 4, a.data(), 8, 0.0f, c.data(), 8); },
                      "CUBLAS_STATUS_INVALID_VALUE");
  // CUDA: a copy in a direction that does not exist, and an allocation no GPU has (1 PiB)
  expect_device_error(
      [&] { DTLAB_CUDA_CHECK(cudaMemcpyAsync(c.data(), a.data(), 4, static_cast<cudaMemcpyKind>(99), ctx.stream())); },
      "cudaErrorInvalidMemcpyDirection");
  expect_device_error([&] { DeviceBuffer<float> huge(size_t{1} << 48); }, "cudaErrorMemoryAllocation");
  // cuDNN: an algorithm number that does not exist (cuDNN's own status name, e.g. CUDNN_STATUS_BAD_PARAM)
  lab::cuda::ConvAlgoForce force;
  force.forward = 99;
  expect_device_error([&] { lab::cuda::CudnnConv2d conv(ctx, kConvShapes[0], force); }, "CUDNN_STATUS_");
  // NCCL: a null output pointer
  expect_device_error([&] { DTLAB_NCCL_CHECK(ncclGetVersion(nullptr)); }, "invalid argument");
  // a device that does not exist
  CudaContextOptions opt;
  opt.device = 99;
  expect_device_error([&] { CudaContext bad(opt); }, "GPU 99 does not exist");
  ctx.synchronize();  // none of the errors above is sticky: the context still works
}

}  // namespace
