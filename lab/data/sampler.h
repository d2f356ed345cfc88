// DistributedSampler and per-rank batching, exactly as torch.utils.data does them.
#pragma once

#include <cstdint>
#include <vector>

namespace lab {

struct SamplerOptions {
  int64_t dataset_size = 0;  // L
  int num_replicas = 1;      // R
  int rank = 0;
  bool shuffle = true;
  uint64_t seed = 0;
  bool drop_last = false;    // the sampler's drop_last (cut the tail instead of padding)
};

// torch.utils.data.distributed.DistributedSampler. Throws ConfigError with PyTorch's wording
// ("Invalid rank 4, rank should be in the interval [0, 3]").
class DistributedSampler {
 public:
  explicit DistributedSampler(const SamplerOptions& opt);
  void set_epoch(int64_t epoch) { m_epoch = epoch; }
  int64_t epoch() const { return m_epoch; }
  int64_t num_samples() const { return m_num_samples; }  // per rank
  int64_t total_size() const { return m_total_size; }    // num_samples * R
  // This rank's indices for the current epoch: permutation by seed + epoch (shuffle), padding
  // from the head (or cut tail), then every R-th index starting at rank.
  std::vector<int64_t> indices() const;
  // The whole padded/cut list before striding (for the GUI's epoch strip).
  std::vector<int64_t> global_indices() const;

 private:
  SamplerOptions m_opt;
  int64_t m_epoch = 0;
  int64_t m_num_samples = 0;
  int64_t m_total_size = 0;
};

// DataLoader(batch_size, drop_last) over a list of indices. Throws ConfigError with PyTorch's
// wording for batch_size <= 0.
std::vector<std::vector<int64_t>> make_batches(const std::vector<int64_t>& indices, int64_t batch_size,
                                               bool drop_last);
// floor(n / B) with drop_last, ceil(n / B) without.
int64_t batches_per_epoch(int64_t n, int64_t batch_size, bool drop_last);

}  // namespace lab
