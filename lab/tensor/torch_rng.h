// TorchGenerator: PyTorch's CPU generator, bit for bit. torch.manual_seed(s) seeds an mt19937
// with s; random() is one 32-bit draw, random64() two. With it the lab reproduces PyTorch's
// default initialization of a freshly built model and torch.randperm (DistributedSampler's
// shuffle) exactly, so the same seed gives the same weights and the same data order as PyTorch.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

namespace lab {

class TorchGenerator {
 public:
  explicit TorchGenerator(uint64_t seed = 67280421310721ULL);
  uint32_t random();
  uint64_t random64();
  // Tensor.uniform_(from, to) on a float32 tensor of n elements (serial, in index order).
  void uniform_(float* data, int64_t n, double from, double to);

 private:
  std::mt19937 m_engine;
};

// torch.randperm(n, generator=g): a permutation of 0..n-1.
std::vector<int64_t> randperm(int64_t n, TorchGenerator& g);

// nn.init.kaiming_uniform_(w, a=sqrt(5)) as nn.Linear / nn.Conv2d reset_parameters do it:
// U(-b, b) with b = 1/sqrt(fan_in), computed in double exactly like torch.nn.init.
void kaiming_uniform_default(float* w, int64_t n, int64_t fan_in, TorchGenerator& g);
// The matching bias init: U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
void bias_uniform_default(float* b, int64_t n, int64_t fan_in, TorchGenerator& g);

}  // namespace lab
