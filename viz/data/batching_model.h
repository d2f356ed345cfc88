// EpochLayout: one epoch of DistributedSampler + per-rank DataLoader, position by position, for
// the batching view. Computed with the lab's own sampler (lab/data/sampler.h), so the picture is the
// training's order, not a re-derivation.
//
// Positions p = 0 .. total_size-1 index the padded (or cut) global list. Rank r takes positions
// r, r + R, r + 2R, ... (strided); its i-th sample is position i*R + r and lands in batch i / B.
// So iteration b covers the contiguous positions b*R*B .. (b+1)*R*B - 1 of the global list.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "config.h"

namespace viz {

struct EpochLayout {
  int64_t dataset_size = 0;   // L
  int world = 1;              // R
  int64_t batch_size = 1;     // B, per rank
  int64_t epoch = 0;
  bool shuffle = true, sampler_drop_last = false, loader_drop_last = false;
  int64_t num_samples = 0;    // per rank: ceil(L / R), or floor with the sampler's drop_last
  int64_t total_size = 0;     // num_samples * R
  int64_t padding = 0;        // positions repeating the head (sampler drop_last off)
  int64_t steps = 0;          // iterations per epoch: ceil(n / B), floor with the loader's drop_last
  int64_t last_batch = 0;     // size of each rank's last batch (0: no step at all)
  int64_t loader_dropped = 0; // per rank: samples of the incomplete batch the loader drops
  std::vector<int64_t> global;    // (total_size,) dataset index at each position
  std::vector<int64_t> cut_tail;  // dataset indices the sampler's drop_last cuts off

  int rank_of(int64_t p) const { return static_cast<int>(p % world); }
  int64_t sample_of(int64_t p) const { return p / world; }  // index within the rank's list
  int64_t batch_of(int64_t p) const { return sample_of(p) / batch_size; }
  bool is_padding(int64_t p) const { return p >= dataset_size; }
  bool is_loader_dropped(int64_t p) const { return loader_drop_last && batch_of(p) >= steps; }
  // The position of rank r's j-th sample of batch b (may be >= total_size for a short batch).
  int64_t position(int r, int64_t b, int64_t j) const { return (b * batch_size + j) * world + r; }
  // Samples rank r gets in batch b (0 past the end).
  int64_t batch_len(int64_t b) const;
};

// Throws lab::ConfigError for settings the sampler or loader rejects (batch_size <= 0, ...).
EpochLayout layout_epoch(const lab::RunConfig& c, int64_t dataset_size, int64_t epoch);

// --mode dp: one epoch of DataParallel's one DataLoader (lab::SingleProcessLoader: the seeded
// permutation, batches of the global batch_size B) and each batch cut over the devices as
// torch.chunk does: ceil(B / devices) samples each, the last device the rest, fewer chunks than
// devices when B is small (those devices idle).
struct DpEpochLayout {
  int64_t dataset_size = 0;   // L
  int devices = 1;
  int64_t batch_size = 1;     // B, global
  int64_t epoch = 0;
  bool shuffle = true, drop_last = false;
  std::vector<std::vector<int64_t>> batches;  // per iteration: dataset indices, in order
  std::vector<int64_t> dropped;               // drop_last: the short last batch, left out
  // Sizes of batch b's chunks, device by device (torch.chunk).
  std::vector<int64_t> chunks(int64_t b) const;
  int64_t chunk_size() const;  // ceil(B / devices): the size of a full batch's chunks
};
DpEpochLayout layout_dp_epoch(const lab::RunConfig& c, int64_t dataset_size, int64_t epoch);

// The batch-of-one BatchNorm failure this layout runs into, or "" when it does not: a rank's last
// batch holds one sample and its statistics are that one sample's (local BN, or one rank), in the
// mlp (BatchNorm1d: one value per channel per sample; the cnn's BatchNorm2d has 28 x 28).
std::string batch_of_one_problem(const EpochLayout& l, const lab::RunConfig& c);

}  // namespace viz
