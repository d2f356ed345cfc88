#include "batching_model.h"

#include <algorithm>

#include "sampler.h"

namespace viz {

int64_t EpochLayout::batch_len(int64_t b) const {
  if (b < 0 || b >= steps) return 0;
  return std::min(batch_size, num_samples - b * batch_size);
}

EpochLayout layout_epoch(const lab::RunConfig& c, int64_t dataset_size, int64_t epoch) {
  EpochLayout l;
  l.dataset_size = dataset_size;
  l.world = c.world_size;
  l.batch_size = c.batch_size;
  l.epoch = epoch;
  l.shuffle = c.shuffle;
  l.sampler_drop_last = c.sampler_drop_last;
  l.loader_drop_last = c.drop_last;
  lab::DistributedSampler s({dataset_size, c.world_size, 0, c.shuffle, c.seed, c.sampler_drop_last});
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
