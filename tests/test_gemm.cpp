// The linked sgemm backend (OpenBLAS, or the reference) against sgemm_ref: every transpose
// combination, odd sizes, padded leading dimensions, alpha and beta. Values are multiples of 1/8
// in [-1, 1] and K <= 67, so every product and partial sum is exact in float32 and the results
// must agree bit for bit whatever order the backend sums in.
#include <gtest/gtest.h>

#include <vector>

#include "gemm.h"
#include "nn_fixture.h"
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
