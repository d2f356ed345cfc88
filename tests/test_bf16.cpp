// bf16 rounding (bf16.h), case by case on bit patterns. Every non-NaN expectation is also what
// PyTorch 1.13 gives for `torch.tensor([x]).to(torch.bfloat16)` (checked with Debian's
// python3-torch); NaN payloads are ours (PyTorch writes 0xFFFF: a NaN too).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "bf16.h"

namespace {

float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

uint32_t to_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

struct Case {
  uint32_t in;
  uint16_t out;
  const char* what;
};

const Case kCases[] = {
    {0x3F800000u, 0x3F80, "1.0 is exact"},
    {0x00000000u, 0x0000, "+0"},
    {0x80000000u, 0x8000, "-0 keeps its sign"},
    {0x3F808000u, 0x3F80, "1 + 2^-8: a tie, to the even 1.0"},
    {0x3F818000u, 0x3F82, "1 + 3 * 2^-8: a tie, to the even 1 + 2^-6"},
    {0x3F808001u, 0x3F81, "just above a tie: up"},
    {0x3F807FFFu, 0x3F80, "just below a tie: down"},
    {0xBF808000u, 0xBF80, "-(1 + 2^-8): a tie, to the even -1.0"},
    {0xBF818000u, 0xBF82, "-(1 + 3 * 2^-8): a tie, to the even"},
    {0x3F80FFFFu, 0x3F81, "the largest float below 1 + 2^-7 rounds up to it"},
    {0x00000001u, 0x0000, "smallest subnormal: to +0"},
    {0x00008000u, 0x0000, "subnormal tie: to the even 0"},
    {0x00018000u, 0x0002, "subnormal tie: to the even 0x0002"},
    {0x00028000u, 0x0002, "subnormal tie: to the even 0x0002 (down)"},
    {0x00008001u, 0x0001, "subnormal above a tie: up to the smallest bf16 subnormal"},
    {0x807FFFFFu, 0x8080, "largest negative subnormal: up to the smallest normal"},
    {0x7F800000u, 0x7F80, "+inf"},
    {0xFF800000u, 0xFF80, "-inf"},
    {0x7F7F0000u, 0x7F7F, "the largest bf16 (3.3895e38) is exact"},
    {0x7F7F7FFFu, 0x7F7F, "just below the tie past the largest bf16: down to it"},
    {0x7F7F8000u, 0x7F80, "the tie past the largest bf16: to the even, which is inf"},
    {0x7F7FFFFFu, 0x7F80, "FLT_MAX: inf"},
    {0xFF7FFFFFu, 0xFF80, "-FLT_MAX: -inf"},
    {0x7FC00000u, 0x7FC0, "quiet NaN"},
    {0x7F800001u, 0x7FC0, "NaN with its payload in the low bits: NaN, not inf"},
    {0xFF812345u, 0xFFC1, "negative signalling NaN: quiet, sign and top payload kept"},
    {0x7FFFFFFFu, 0x7FFF, "NaN with every payload bit: no carry into the sign"},
};

}  // namespace

TEST(Bf16, RoundingCases) {
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.what);
    EXPECT_EQ(lab::bf16_bits(from_bits(c.in)), c.out) << std::hex << "in 0x" << c.in;
    EXPECT_EQ(to_bits(lab::round_bf16(from_bits(c.in))), static_cast<uint32_t>(c.out) << 16);
    float v = from_bits(c.in);
    lab::round_bf16(&v, 1);
    EXPECT_EQ(to_bits(v), static_cast<uint32_t>(c.out) << 16) << "array version";
  }
}

TEST(Bf16, NanStaysNanInfStaysInf) {
  for (const Case& c : kCases) {
    const float x = from_bits(c.in), r = lab::round_bf16(x);
    EXPECT_EQ(std::isnan(r), std::isnan(x)) << c.what;
    if (std::isinf(x)) {
      EXPECT_EQ(r, x) << c.what;
    }
  }
}

// The array version (branch-free) and the scalar one agree on every bit pattern class; a bf16
// value rounds to itself; rounding is monotonic (what the fused BatchNorm-ReLU-pool relies on).
TEST(Bf16, ArrayMatchesScalarAndIsIdempotentAndMonotonic) {
  std::mt19937 rng(7);
  std::vector<float> v(1 << 18);
  for (float& e : v) e = from_bits(static_cast<uint32_t>(rng()));
  std::vector<float> r = v;
  lab::round_bf16(r.data(), r.size());
  for (size_t i = 0; i < v.size(); ++i) {
    ASSERT_EQ(to_bits(r[i]), to_bits(lab::round_bf16(v[i]))) << std::hex << to_bits(v[i]);
    ASSERT_EQ(to_bits(lab::round_bf16(r[i])), to_bits(r[i]));
    ASSERT_EQ(to_bits(r[i]) & 0xFFFFu, 0u);
  }
  for (size_t i = 0; i + 1 < v.size(); ++i) {
    const float a = v[i], b = v[i + 1];
    if (std::isnan(a) || std::isnan(b)) continue;
    const float lo = std::min(a, b), hi = std::max(a, b);
    ASSERT_LE(lab::round_bf16(lo), lab::round_bf16(hi)) << lo << " " << hi;
  }
}

// Round to nearest: |round(x) - x| <= half a bf16 step (2^-8 relative, for normals).
TEST(Bf16, ErrorAtMostHalfAStep) {
  std::mt19937 rng(3);
  std::normal_distribution<float> d(0.0f, 10.0f);
  for (int i = 0; i < 100000; ++i) {
    const float x = d(rng);
    if (x == 0.0f) continue;
    const float r = lab::round_bf16(x);
    const float step = std::ldexp(1.0f, std::ilogb(x) - 7);
    ASSERT_LE(std::fabs(r - x), 0.5f * step) << x;
  }
}
