#include "batching_model.h"

#include <algorithm>

#include "data_parallel.h"
#include "errors.h"
#include "mode.h"
#include "sampler.h"

namespace viz {

int64_t EpochLayout::batch_len(int64_t b) const {
  if (b < 0 || b >= steps) return 0;
  return std::min(batch_size, num_samples - b * batch_size);
}

EpochLayout layout_epoch(const lab::RunConfig& c, int64_t dataset_size, int64_t epoch) {
  EpochLayout l;
  l.dataset_size = dataset_size;
  // the samplers: one per rank, or per data-parallel replica where every rank of one reads the
  // same batches (a pipeline's stages)
  const int samplers = lab::mode_of(c).caps().one_loader ? std::max(1, c.dp) : c.world_size;
  l.world = samplers;
  l.batch_size = c.batch_size;
  l.epoch = epoch;
  l.shuffle = c.shuffle;
  l.sampler_drop_last = c.sampler_drop_last;
  l.loader_drop_last = c.drop_last;
  lab::DistributedSampler s({dataset_size, samplers, 0, c.shuffle, c.seed, c.sampler_drop_last});
  s.set_epoch(epoch);
  l.num_samples = s.num_samples();
  l.total_size = s.total_size();
  l.global = s.global_indices();
  l.padding = std::max<int64_t>(0, l.total_size - dataset_size);
  l.steps = lab::batches_per_epoch(l.num_samples, c.batch_size, c.drop_last);
  if (l.steps > 0) l.last_batch = std::min(c.batch_size, l.num_samples - (l.steps - 1) * c.batch_size);
  l.loader_dropped = c.drop_last ? l.num_samples % c.batch_size : 0;
  if (c.sampler_drop_last && l.total_size < dataset_size) {
    // The same permutation without the cut: its tail is what drop_last removes.
    lab::DistributedSampler full({dataset_size, 1, 0, c.shuffle, c.seed, false});
    full.set_epoch(epoch);
    const std::vector<int64_t> all = full.global_indices();
    l.cut_tail.assign(all.begin() + l.total_size, all.begin() + dataset_size);
  }
  return l;
}

std::vector<int64_t> DpEpochLayout::chunks(int64_t b) const {
  if (b < 0 || b >= static_cast<int64_t>(batches.size())) return {};
  return lab::torch_chunk_sizes(static_cast<int64_t>(batches[static_cast<size_t>(b)].size()), devices);
}

int64_t DpEpochLayout::chunk_size() const { return (batch_size + devices - 1) / std::max(1, devices); }

DpEpochLayout layout_dp_epoch(const lab::RunConfig& c, int64_t dataset_size, int64_t epoch) {
  if (c.batch_size <= 0)
    throw lab::ConfigError("batch_size should be a positive integer value, but got batch_size=" +
                           std::to_string(c.batch_size));
  DpEpochLayout l;
  l.dataset_size = dataset_size;
  l.devices = std::max(1, c.world_size);
  l.batch_size = c.batch_size;
  l.epoch = epoch;
  l.shuffle = c.shuffle;
  l.drop_last = c.drop_last;
  // The generator's state carries over from epoch to epoch, as the training's loader's does.
  lab::SingleProcessLoader loader(dataset_size, c.batch_size, c.shuffle, false, c.seed);
  for (int64_t e = 0; e < epoch; ++e) loader.next_epoch();
  l.batches = loader.next_epoch();
  if (c.drop_last && !l.batches.empty() && static_cast<int64_t>(l.batches.back().size()) < c.batch_size) {
    l.dropped = std::move(l.batches.back());
    l.batches.pop_back();
  }
  return l;
}

std::string batch_of_one_problem(const EpochLayout& l, const lab::RunConfig& c) {
  if (l.steps == 0 || l.last_batch != 1) return "";
  // The cnn's BatchNorm2d sees 28 x 28 (or 14 x 14) values per channel even in a batch of one.
  if (c.model != "mlp") return "";
  if (c.bn == "sync" && c.world_size > 1) return "";
  const std::string where = "each rank's last batch of the epoch holds 1 sample (" + std::to_string(l.num_samples) +
                            " samples per rank = " + std::to_string(l.steps - 1) + " x " +
                            std::to_string(l.batch_size) + " + 1)";
  return where + ": BatchNorm in training mode needs more than one value per channel and fails with "
                 "\"Expected more than 1 value per channel when training\". Fix: drop_last, another batch "
                 "size" + std::string(c.world_size > 1 ? ", or sync BN (statistics over all ranks' samples)" : "");
}

}  // namespace viz
