// bfloat16 rounding, emulated in float32 storage: a bf16 value is a float whose low 16 bits are
// zero (same sign, same 8-bit exponent, 7 of the 23 mantissa bits). The lab keeps bf16 tensors as
// floats rounded with round_bf16(), which gives the value PyTorch's `t.to(torch.bfloat16)` holds.
//
//   round to nearest, ties to even (c10::BFloat16's round_to_nearest_even): add 0x7FFF plus the
//   lowest kept bit, drop the low 16 bits. Subnormals round the same way (the integer add is
//   exact for them), and values past the largest bf16 (0x7F7F0000 = 3.3895e38) round to inf from
//   0x7F7F8000 on (the tie goes to the even 0x7F80 = inf), as in PyTorch.
//   NaN stays NaN: the rule above would turn a NaN whose payload sits in the low bits into inf, so a
//   NaN keeps its sign and top payload bits with the quiet bit set (what VCVTNEPS2BF16 does).
//   PyTorch's own bits differ (0xFFFF from a tensor's .to(), 0x7FC0 from c10::BFloat16): every
//   one of them is a NaN, and nothing the lab computes depends on a NaN's payload.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace lab {

// The bf16 bits (upper half of the float) of x rounded to nearest even.
inline uint16_t bf16_bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);  // NaN
  return static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

// The float that bf16 bits b stand for (exact).
inline float bf16_to_float(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}

// x rounded to bf16, kept as a float: bf16_to_float(bf16_bits(x)).
inline float round_bf16(float x) { return bf16_to_float(bf16_bits(x)); }

// p[i] = round_bf16(p[i]) for i in [0, n): the same rule, 4 values at a time in a GCC/Clang vector
// (so that -O2 builds, which do not vectorize the scalar loop, still get vector code).
inline void round_bf16(float* p, size_t n) {
  typedef uint32_t U32x4 __attribute__((vector_size(16)));
  // the rule on 4 lanes, and on a partial vector padded with zeros
  auto round4 = [](float* q, size_t count) {
    U32x4 u = {0, 0, 0, 0};
    std::memcpy(&u, q, count * sizeof(float));
    const U32x4 rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) & 0xFFFF0000u;
    const U32x4 nan = (u | 0x00400000u) & 0xFFFF0000u;
    const U32x4 is_nan = (U32x4)((u & 0x7FFFFFFFu) > 0x7F800000u);  // all ones in a NaN's lane
    u = (nan & is_nan) | (rounded & ~is_nan);
    std::memcpy(q, &u, count * sizeof(float));
  };
  size_t i = 0;
  for (; i + 4 <= n; i += 4) round4(p + i, 4);
  if (i < n) round4(p + i, n - i);
}

}  // namespace lab
