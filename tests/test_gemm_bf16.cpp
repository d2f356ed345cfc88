// The bf16 gemm (gemm_bf16.h): the reference rounds its operands, and the backend's kernels (the
// AVX512-BF16 one where this CPU has it, the sgemm on rounded operands everywhere) agree with it:
//   - bit for bit on inputs whose sums are exact: operands (k/8) * (1 + 2^-10) round to k/8
//     (the perturbation is under half a bf16 step), so the result must equal sgemm_ref on the
//     multiples of 1/8 themselves, whatever the order of the sum (K <= 67, as tests/test_gemm.cpp),
//     with each epilogue (bias per row or column, rounding) applied to that exact sum;
//   - within a summation-order bound on random data at the models' shapes: the products of bf16
//     values are exact in float32, each kernel's sum is within (K - 1) u sum|a b| of the exact
//     one (u = 2^-24), so two kernels differ by at most 2 K u sum|a b|.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "bf16.h"
#include "gemm.h"
#include "gemm_bf16.h"
#include "nn_fixture.h"
#include "torch_rng.h"

namespace {

using GemmFn = std::function<void(bool, int, int, int, const float*, int, const float*, int, float*, int,
                                  const lab::Bf16Epilogue&)>;

struct Kernel {
  std::string name;
  GemmFn fn;
};

// The kernels this machine can run (the reference first).
std::vector<Kernel> kernels() {
  std::vector<Kernel> k;
  k.push_back({"reference", lab::gemm_bf16_ref});
  k.push_back({"sgemm on rounded operands", lab::gemm_bf16_sgemm});
  k.push_back({std::string("gemm_bf16 (") + lab::gemm_bf16_kernel_name() + ")", lab::gemm_bf16});
  if (lab::gemm_bf16_avx512_supported()) k.push_back({"avx512-bf16", lab::gemm_bf16_avx512});
  return k;
}

}  // namespace

TEST(GemmBf16, KernelsRoundOperandsAndMatchExactSums) {
  lab::TorchGenerator g(5);
  // exact[i]: a multiple of 1/8 in [-1, 1]; given[i]: it times (1 +- 2^-10), which rounds back
  auto fill = [&](std::vector<float>& exact, std::vector<float>& given) {
    given.resize(exact.size());
    for (size_t i = 0; i < exact.size(); ++i) {
      exact[i] = static_cast<float>(static_cast<int>(g.random() % 17) - 8) / 8.0f;
      const float rel = g.random() % 2 ? 0x1p-10f : -0x1p-10f;
      given[i] = exact[i] * (1.0f + rel);
      ASSERT_EQ(lab::round_bf16(given[i]), exact[i]);
    }
  };
  const int sizes[][3] = {{1, 1, 1},  {3, 5, 7},   {17, 1, 9},  {1, 13, 4}, {7, 33, 67},
                          {64, 70, 5}, {13, 64, 2}, {6, 64, 1},  {12, 65, 0}, {19, 100, 66}};
  // epilogues: none, bias per column (Linear), bias per row (Conv2d), each with and without rounding
  struct Ep {
    bool bias, per_row, round;
  };
  const Ep eps[] = {{false, false, false}, {true, false, false}, {true, true, false},
                    {false, false, true},  {true, false, true},  {true, true, true}};
  for (const Kernel& kernel : kernels()) {
    for (const auto& s : sizes) {
      const int m = s[0], n = s[1], k = s[2];
      for (int tb = 0; tb < 2; ++tb) {
        for (const Ep& e : eps) {
          const int b_rows = tb ? n : k, b_cols = tb ? k : n;
          const int lda = k + 3, ldb = b_cols + 3, ldc = n + 3;  // padded row strides
          std::vector<float> a(static_cast<size_t>(m) * lda), b(static_cast<size_t>(b_rows) * ldb),
              bias(static_cast<size_t>(e.per_row ? m : n)), a_in, b_in, unused;
          fill(a, a_in);
          fill(b, b_in);
          fill(bias, unused);
          lab::Bf16Epilogue ep;
          ep.bias = e.bias ? bias.data() : nullptr;
          ep.bias_per_row = e.per_row;
          ep.round = e.round;
          // the exact sums (sgemm_ref on the multiples of 1/8), + bias (exact too), rounded
          std::vector<float> want(static_cast<size_t>(m) * ldc, 5.0f), got = want;
          lab::sgemm_ref(false, tb, m, n, k, 1.0f, a.data(), lda, b.data(), ldb, 0.0f, want.data(), ldc);
          for (int i = 0; i < m; ++i)
            for (int j = 0; j < n; ++j) {
              float& w = want[static_cast<size_t>(i) * ldc + j];
              if (e.bias) w += bias[static_cast<size_t>(e.per_row ? i : j)];
              if (e.round) w = lab::round_bf16(w);
            }
          kernel.fn(tb, m, n, k, a_in.data(), lda, b_in.data(), ldb, got.data(), ldc, ep);
          EXPECT_TRUE(nnfix::close(got, want, 0, 0))
              << kernel.name << ": m=" << m << " n=" << n << " k=" << k << " trans_b=" << tb << " bias=" << e.bias
              << " per_row=" << e.per_row << " round=" << e.round;
        }
      }
    }
  }
}

// Random data at the shapes the models run: Linear (rows, out, in; W stored (out, in)) and
// Conv2d per sample (Cout, Ho*Wo, Cin*k*k; the columns stored (Cin*k*k, Ho*Wo)).
TEST(GemmBf16, KernelsMatchReferenceWithinSummationOrderBound) {
  struct Shape {
    const char* what;
    bool trans_b;
    int m, n, k;
  };
  const Shape shapes[] = {{"mlp Linear(784, 256)", true, 64, 256, 784},   {"mlp Linear(256, 128)", true, 100, 128, 256},
                          {"Linear(128, 10)", true, 37, 10, 128},        {"cnn Linear(3136, 128)", true, 50, 128, 3136},
                          {"cnn Conv2d(1, 32, 3)", false, 32, 784, 9},   {"cnn Conv2d(32, 64, 3)", false, 64, 196, 288}};
  std::mt19937 rng(1);
  std::normal_distribution<float> unit(0.0f, 1.0f), small(0.0f, 0.05f);
  for (const Shape& s : shapes) {
    const int b_rows = s.trans_b ? s.n : s.k, b_cols = s.trans_b ? s.k : s.n;
    std::vector<float> a(static_cast<size_t>(s.m) * s.k), b(static_cast<size_t>(b_rows) * b_cols);
    for (float& e : a) e = unit(rng);
    for (float& e : b) e = small(rng);
    // bound[i][j] = 2 K u sum_p |bf16(a_ip) bf16(b_pj)|
    std::vector<double> bound(static_cast<size_t>(s.m) * s.n);
    for (int i = 0; i < s.m; ++i)
      for (int j = 0; j < s.n; ++j) {
        double sum = 0;
        for (int p = 0; p < s.k; ++p) {
          const float bv = s.trans_b ? b[static_cast<size_t>(j) * s.k + p] : b[static_cast<size_t>(p) * s.n + j];
          sum += std::fabs(static_cast<double>(lab::round_bf16(a[static_cast<size_t>(i) * s.k + p])) * lab::round_bf16(bv));
        }
        bound[static_cast<size_t>(i) * s.n + j] = 2.0 * s.k * 0x1p-24 * sum;
      }
    std::vector<float> want(bound.size());
    lab::gemm_bf16_ref(s.trans_b, s.m, s.n, s.k, a.data(), s.k, b.data(), b_cols, want.data(), s.n);
    for (const Kernel& kernel : kernels()) {
      std::vector<float> got(bound.size(), 7.0f);
      kernel.fn(s.trans_b, s.m, s.n, s.k, a.data(), s.k, b.data(), b_cols, got.data(), s.n, {});
      size_t bad = 0, same = 0;
      double worst = 0;  // largest |got - want| / bound
      for (size_t i = 0; i < got.size(); ++i) {
        const double d = std::fabs(static_cast<double>(got[i]) - want[i]);
        same += got[i] == want[i];
        worst = std::max(worst, d / bound[i]);
        if (!(d <= bound[i]) && bad++ < 3)
          ADD_FAILURE() << kernel.name << " " << s.what << ": element " << i << " got " << got[i] << " want " << want[i]
                        << " bound " << bound[i];
      }
      std::printf("  %-34s %-24s bit-identical to the reference: %5.1f%%, largest |diff| / bound %.3f\n", s.what,
                  kernel.name.c_str(), 100.0 * static_cast<double>(same) / static_cast<double>(got.size()), worst);
      EXPECT_EQ(bad, 0u) << kernel.name << " " << s.what;
    }
  }
}

TEST(GemmBf16, ReportsItsKernel) {
  const std::string name = lab::gemm_bf16_kernel_name();
  EXPECT_TRUE(name == "avx512-bf16" || name == "sgemm on bf16-rounded operands") << name;
  EXPECT_EQ(name == "avx512-bf16", lab::gemm_bf16_avx512_supported());
}
