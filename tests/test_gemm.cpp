// The linked sgemm backend (OpenBLAS, or the reference) against sgemm_ref: every transpose
// combination, odd sizes, padded leading dimensions, alpha and beta. Values are multiples of 1/8
// in [-1, 1] and K <= 67, so every product and partial sum is exact in float32 and the results
// must agree bit for bit whatever order the backend sums in.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "cpu/gemm_blocked.h"
#include "gemm.h"
#include "nn_fixture.h"
#include "test_util.h"
#include "torch_rng.h"

TEST(Gemm, BackendMatchesReferenceAllTransposes) {
  lab::TorchGenerator g(11);
  auto fill = [&](std::vector<float>& v) {
    for (float& e : v) e = static_cast<float>(static_cast<int>(g.random() % 17) - 8) / 8.0f;
  };
  const int sizes[][3] = {{1, 1, 1}, {3, 5, 7}, {17, 1, 9}, {1, 13, 4}, {33, 31, 67}, {64, 70, 5}};
  for (const auto& s : sizes) {
    const int m = s[0], n = s[1], k = s[2];
    for (int ta = 0; ta < 2; ++ta) {
      for (int tb = 0; tb < 2; ++tb) {
        for (float beta : {0.0f, 1.0f, -0.5f}) {
          // Stored shapes: A is (M, K) or (K, M) when transposed; row strides padded by 3.
          const int a_rows = ta ? k : m, a_cols = ta ? m : k;
          const int b_rows = tb ? n : k, b_cols = tb ? k : n;
          const int lda = a_cols + 3, ldb = b_cols + 3, ldc = n + 3;
          std::vector<float> a(static_cast<size_t>(a_rows) * lda), b(static_cast<size_t>(b_rows) * ldb),
              c0(static_cast<size_t>(m) * ldc);
          fill(a);
          fill(b);
          fill(c0);
          std::vector<float> c_ref = c0, c_got = c0;
          lab::sgemm_ref(ta, tb, m, n, k, 0.5f, a.data(), lda, b.data(), ldb, beta, c_ref.data(), ldc);
          lab::sgemm(ta, tb, m, n, k, 0.5f, a.data(), lda, b.data(), ldb, beta, c_got.data(), ldc);
          EXPECT_TRUE(nnfix::close(c_got, c_ref, 0, 0))
              << "m=" << m << " n=" << n << " k=" << k << " ta=" << ta << " tb=" << tb << " beta=" << beta
              << " backend " << lab::gemm_backend_name();
        }
      }
    }
  }
}

// The reference kernel in register blocks (DTLAB_SGEMM=reference, and the build without a BLAS)
// adds in sgemm_ref's order: on random values, where another order would change last bits, the
// two agree bit for bit. Shapes cross the 32-column blocks' edges; the large ones use threads
// (results must not depend on them).
TEST(Gemm, BlockedKernelIsTheReferenceBitForBit) {
  lab::TorchGenerator g(5);
  const int sizes[][3] = {{1, 1, 1}, {5, 17, 3}, {4, 16, 1}, {31, 33, 65}, {64, 100, 300}, {130, 70, 257}};
  int differing_orders = 0;
  for (const auto& s : sizes) {
    const int m = s[0], n = s[1], k = s[2];
    for (int ta = 0; ta < 2; ++ta)
      for (int tb = 0; tb < 2; ++tb)
        for (float beta : {0.0f, 0.75f})
          for (int threads : {1, 3}) {
            const int lda = (ta ? m : k) + 2, ldb = (tb ? k : n) + 1, ldc = n + 5;
            std::vector<float> a(static_cast<size_t>(ta ? k : m) * lda), b(static_cast<size_t>(tb ? n : k) * ldb),
                c0(static_cast<size_t>(m) * ldc);
            g.uniform_(a.data(), static_cast<int64_t>(a.size()), -1.0, 1.0);
            g.uniform_(b.data(), static_cast<int64_t>(b.size()), -1.0, 1.0);
            g.uniform_(c0.data(), static_cast<int64_t>(c0.size()), -1.0, 1.0);
            std::vector<float> c_ref = c0, c_got = c0;
            lab::sgemm_ref(ta, tb, m, n, k, 1.25f, a.data(), lda, b.data(), ldb, beta, c_ref.data(), ldc);
            lab::sgemm_blocked_set_threads(threads);
            lab::sgemm_blocked(ta, tb, m, n, k, 1.25f, a.data(), lda, b.data(), ldb, beta, c_got.data(), ldc);
            lab::sgemm_blocked_set_threads(1);
            EXPECT_EQ(0, std::memcmp(c_got.data(), c_ref.data(), c_ref.size() * sizeof(float)))
                << "m=" << m << " n=" << n << " k=" << k << " ta=" << ta << " tb=" << tb << " beta=" << beta
                << " threads=" << threads;
            // the yardstick can fail: summing the same products in reverse changes some bits
            if (k >= 65 && !ta && !tb && beta == 0.0f && threads == 1) {
              bool differs = false;
              for (int i = 0; i < m && !differs; ++i)
                for (int j = 0; j < n && !differs; ++j) {
                  float acc = 0.0f;
                  for (int p = k - 1; p >= 0; --p) acc += a[static_cast<size_t>(i) * lda + p] * b[static_cast<size_t>(p) * ldb + j];
                  differs = 1.25f * acc != c_ref[static_cast<size_t>(i) * ldc + j];
                }
              differing_orders += differs ? 1 : 0;
            }
          }
  }
  EXPECT_EQ(differing_orders, 3) << "random values where the order of additions shows";
}

// DTLAB_SGEMM picks the kernel; a value that names none is refused with the variable's name.
TEST(Gemm, DtlabSgemmChoosesTheKernelAndRefusesOthers) {
  const auto version = [](const std::string& env) { return testutil::run_cli_with_prefix(env, "version"); };
  const auto ref = version("DTLAB_SGEMM=reference");
  ASSERT_EQ(ref.exit_code, 0) << ref.out;
  EXPECT_NE(ref.out.find("sgemm: reference"), std::string::npos) << ref.out;
  const auto plain = version("env -u DTLAB_SGEMM");
  ASSERT_EQ(plain.exit_code, 0) << plain.out;
#ifdef DTLAB_TEST_HAVE_OPENBLAS
  EXPECT_NE(ref.out.find("sgemm: reference (DTLAB_SGEMM=reference)"), std::string::npos) << ref.out;
  EXPECT_NE(plain.out.find("sgemm: openblas"), std::string::npos) << plain.out;
  EXPECT_EQ(version("DTLAB_SGEMM=openblas").exit_code, 0);
#else
  EXPECT_NE(plain.out.find("sgemm: reference"), std::string::npos) << plain.out;
  EXPECT_EQ(version("DTLAB_SGEMM=openblas").exit_code, 2);
#endif
  const auto bad = version("DTLAB_SGEMM=mkl");
  EXPECT_EQ(bad.exit_code, 2) << bad.out;
  EXPECT_NE(bad.out.find("DTLAB_SGEMM=mkl"), std::string::npos) << bad.out;
  // a run names it in its header's backends (config.toml)
  testutil::TempDir d;
  const auto run = testutil::run_cli_with_prefix(
      "DTLAB_SGEMM=reference", "run --model mlp --world-size 2 --batch-size 16 --limit-train 64 --limit-test 16 --epochs 1 --out " +
                                   d.file("r"));
  ASSERT_EQ(run.exit_code, 0) << run.out;
  EXPECT_NE(testutil::read_file(d.file("r/config.toml")).find("reference (DTLAB_SGEMM=reference)"), std::string::npos);
}
