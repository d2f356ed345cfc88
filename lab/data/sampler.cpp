// DistributedSampler and BatchSampler as torch/utils/data/{distributed,sampler}.py (1.13) do them.
// Golden lists from PyTorch: tests/fixtures/sampler.json (tools/fixtures/gen_sampler.py).
#include "sampler.h"

#include <algorithm>
#include <cassert>
#include <string>

#include "errors.h"
#include "mutation.h"
#include "torch_rng.h"

namespace lab {
namespace {

// Python's math.ceil(a / b) for b > 0 and any sign of a (C++ '/' truncates toward zero, which is
// the ceiling for negative quotients). a can be negative: drop_last with L < R gives L - R < 0.
int64_t ceil_div(int64_t a, int64_t b) { return a / b + ((a % b > 0) ? 1 : 0); }

void check_batch_size(int64_t batch_size) {
  if (batch_size <= 0) {
    throw ConfigError("batch_size should be a positive integer value, but got batch_size=" +
                      std::to_string(batch_size));
  }
}

}  // namespace

DistributedSampler::DistributedSampler(const SamplerOptions& opt) : m_opt(opt) {
  if (opt.num_replicas < 1) {
    // PyTorch would say "Invalid rank 0, rank should be in the interval [0, -1]": unhelpful.
    throw ConfigError("Invalid world size " + std::to_string(opt.num_replicas) +
                      ": the world size (number of ranks, num_replicas) must be at least 1");
  }
  if (opt.rank < 0 || opt.rank >= opt.num_replicas) {
    throw ConfigError("Invalid rank " + std::to_string(opt.rank) + ", rank should be in the interval [0, " +
                      std::to_string(opt.num_replicas - 1) + "]");
  }
  if (opt.dataset_size < 0) {
    throw ConfigError("Invalid dataset size " + std::to_string(opt.dataset_size) + ": it must be >= 0");
  }
  if (mutated("sampler-drop-last-inverted")) m_opt.drop_last = !m_opt.drop_last;  // a lesson's mutation test
  if (mutated("sampler-no-sharding")) m_opt.num_replicas = 1, m_opt.rank = 0;  // (mutation.h)
  const int64_t len = opt.dataset_size;
  const int64_t world = m_opt.num_replicas;
  if (m_opt.drop_last && len % world != 0) {
    // Largest multiple of R not above L, as torch computes it: ceil((L - R) / R).
    m_num_samples = ceil_div(len - world, world);
  } else {
    m_num_samples = ceil_div(len, world);
  }
  m_total_size = m_num_samples * world;
}

std::vector<int64_t> DistributedSampler::global_indices() const {
  const int64_t len = m_opt.dataset_size;
  std::vector<int64_t> order;  // (L,) then (total_size,)
  if (m_opt.shuffle) {
    // torch: g.manual_seed(seed + epoch) in Python ints; a negative sum reaches the generator
    // as its two's complement, which unsigned wrap-around reproduces.
    TorchGenerator g(m_opt.seed + static_cast<uint64_t>(m_epoch));
    order = randperm(len, g);
  } else {
    order.resize(static_cast<size_t>(len));
    for (int64_t i = 0; i < len; ++i) order[static_cast<size_t>(i)] = i;
  }

  if (!m_opt.drop_last) {
    // Pad from the head. When padding_size > L torch repeats the whole list
    // ((indices * ceil(padding / L))[:padding]); both cases are element i -> order[i mod L].
    const int64_t padding = m_total_size - len;
    assert(padding >= 0 && (padding == 0 || len > 0));
    order.reserve(static_cast<size_t>(m_total_size));
    for (int64_t i = 0; i < padding; ++i) order.push_back(order[static_cast<size_t>(i % len)]);
  } else {
    order.resize(static_cast<size_t>(m_total_size));  // cut the tail
  }
  assert(static_cast<int64_t>(order.size()) == m_total_size);
  return order;
}

std::vector<int64_t> DistributedSampler::indices() const {
  const std::vector<int64_t> global = global_indices();  // (total_size,)
  std::vector<int64_t> mine;                             // (num_samples,)
  mine.reserve(static_cast<size_t>(m_num_samples));
  for (int64_t i = m_opt.rank; i < m_total_size; i += m_opt.num_replicas) {
    mine.push_back(global[static_cast<size_t>(i)]);
  }
  assert(static_cast<int64_t>(mine.size()) == m_num_samples);
  return mine;
}

std::vector<std::vector<int64_t>> make_batches(const std::vector<int64_t>& indices, int64_t batch_size,
                                               bool drop_last) {
  check_batch_size(batch_size);
  drop_last = drop_last || mutated("loader-drops-last-always");  // a lesson's mutation test (mutation.h)
  const int64_t n = static_cast<int64_t>(indices.size());
  std::vector<std::vector<int64_t>> batches;
  batches.reserve(static_cast<size_t>(batches_per_epoch(n, batch_size, drop_last)));
  for (int64_t start = 0; start < n; start += batch_size) {
    const int64_t end = std::min(n, start + batch_size);
    if (drop_last && end - start < batch_size) break;
    batches.emplace_back(indices.begin() + start, indices.begin() + end);
  }
  return batches;
}

int64_t batches_per_epoch(int64_t n, int64_t batch_size, bool drop_last) {
  check_batch_size(batch_size);
  drop_last = drop_last || mutated("loader-drops-last-always");  // as make_batches
  assert(n >= 0);
  return drop_last ? n / batch_size : ceil_div(n, batch_size);
}

}  // namespace lab
