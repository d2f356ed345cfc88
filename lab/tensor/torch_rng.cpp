// Mirrors ATen's CPUGeneratorImpl (mt19937, seeded with the low 32 bits of the seed),
// at::uniform_real_distribution<float> and randperm_cpu, as of PyTorch 1.13.
#include "torch_rng.h"

#include <cmath>

namespace lab {

TorchGenerator::TorchGenerator(uint64_t seed) : m_engine(static_cast<uint32_t>(seed & 0xffffffffu)) {}

uint32_t TorchGenerator::random() { return static_cast<uint32_t>(m_engine()); }

uint64_t TorchGenerator::random64() {
  const uint32_t hi = random();
  const uint32_t lo = random();
  return (static_cast<uint64_t>(hi) << 32) | lo;
}

void TorchGenerator::uniform_(float* data, int64_t n, double from, double to) {
  // uniform_real_distribution<float>: 24 random bits scaled to [0, 1), then x * (to - from) + from
  // in float (DistAccumType<float> is float). PyTorch's build contracts that into one fused
  // multiply-add, so we use fma explicitly: checked bit for bit on a 784x256 Linear weight.
  const float f = static_cast<float>(from);
  const float t = static_cast<float>(to);
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t bits = random() & ((1u << 24) - 1);
    const float x = static_cast<float>(bits) * (1.0f / static_cast<float>(1u << 24));
    data[i] = std::fma(x, t - f, f);
  }
}

std::vector<int64_t> randperm(int64_t n, TorchGenerator& g) {
  std::vector<int64_t> r(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) r[static_cast<size_t>(i)] = i;
  // PyTorch keeps this form for n < 2^32 / 20 ("preserve old behavior" for small n).
  for (int64_t i = 0; i + 1 < n; ++i) {
    const int64_t z = static_cast<int64_t>(g.random() % static_cast<uint64_t>(n - i));
    std::swap(r[static_cast<size_t>(i)], r[static_cast<size_t>(z + i)]);
  }
  return r;
}

void kaiming_uniform_default(float* w, int64_t n, int64_t fan_in, TorchGenerator& g) {
  // torch.nn.init.kaiming_uniform_(w, a=math.sqrt(5)):
  //   gain = sqrt(2 / (1 + a^2)); std = gain / sqrt(fan_in); bound = sqrt(3) * std
  const double a = std::sqrt(5.0);
  const double gain = std::sqrt(2.0 / (1.0 + a * a));
  const double std_ = gain / std::sqrt(static_cast<double>(fan_in));
  const double bound = std::sqrt(3.0) * std_;
  g.uniform_(w, n, -bound, bound);
}

void bias_uniform_default(float* b, int64_t n, int64_t fan_in, TorchGenerator& g) {
  const double bound = fan_in > 0 ? 1.0 / std::sqrt(static_cast<double>(fan_in)) : 0.0;
  g.uniform_(b, n, -bound, bound);
}

}  // namespace lab
