// The batching view's model (viz/data/batching_model.h): how DistributedSampler pads and cuts,
// short last batches, DataParallel's chunks of each global batch, as PyTorch does them.
#include <gtest/gtest.h>

#include <vector>

#include "batching_model.h"
#include "data_parallel.h"
#include "test_util.h"

TEST(VizBatching, PaddingCutAndShortBatchesAsTorchDoesThem) {
  lab::RunConfig c;
  c.world_size = 4;
  c.batch_size = 2;
  c.shuffle = false;
  // docs/semantics.md: L = 10, R = 4, no shuffle -> [0,4,8] [1,5,9] [2,6,0] [3,7,1]
  viz::EpochLayout l = viz::layout_epoch(c, 10, 0);
  EXPECT_EQ(l.num_samples, 3);
  EXPECT_EQ(l.total_size, 12);
  EXPECT_EQ(l.padding, 2);
  EXPECT_EQ(l.global, (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1}));
  EXPECT_TRUE(l.is_padding(10));
  EXPECT_EQ(l.rank_of(10), 2);
  EXPECT_EQ(l.steps, 2);
  EXPECT_EQ(l.last_batch, 1);
  EXPECT_EQ(l.position(2, 1, 0), 10) << "rank 2's batch 1 is the padded sample 0";
  EXPECT_TRUE(viz::batch_of_one_problem(l, c).empty()) << "the cnn's BatchNorm2d has 28 x 28 values per channel";
  c.model = "mlp";
  EXPECT_FALSE(viz::batch_of_one_problem(l, c).empty()) << "local BN, last batch of one";
  c.bn = "sync";
  EXPECT_TRUE(viz::batch_of_one_problem(l, c).empty()) << "sync BN counts 4 samples";
  c.bn = "local";
  c.drop_last = true;
  l = viz::layout_epoch(c, 10, 0);
  EXPECT_EQ(l.steps, 1);
  EXPECT_EQ(l.loader_dropped, 1);
  EXPECT_TRUE(l.is_loader_dropped(l.position(0, 1, 0)));
  EXPECT_TRUE(viz::batch_of_one_problem(l, c).empty());
  c.drop_last = false;
  c.sampler_drop_last = true;
  l = viz::layout_epoch(c, 10, 0);
  EXPECT_EQ(l.global, (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(l.cut_tail, (std::vector<int64_t>{8, 9}));
  EXPECT_EQ(l.padding, 0);
}

TEST(VizBatching, DataParallelCutsEachGlobalBatchLikeTorchChunk) {
  lab::RunConfig c;
  c.mode = "dp";
  c.world_size = 3;
  c.batch_size = 4;
  c.shuffle = false;
  viz::DpEpochLayout l = viz::layout_dp_epoch(c, 10, 0);
  ASSERT_EQ(l.batches.size(), 3u);
  EXPECT_EQ(l.batches[0], (std::vector<int64_t>{0, 1, 2, 3}));
  EXPECT_EQ(l.batches[2], (std::vector<int64_t>{8, 9}));
  EXPECT_EQ(l.chunks(0), (std::vector<int64_t>{2, 2})) << "ceil(4 / 3) = 2: two chunks, device 2 idles";
  EXPECT_EQ(l.chunks(2), (std::vector<int64_t>{1, 1}));
  EXPECT_EQ(l.chunk_size(), 2);
  EXPECT_TRUE(l.dropped.empty());
  c.drop_last = true;
  l = viz::layout_dp_epoch(c, 10, 0);
  EXPECT_EQ(l.batches.size(), 2u);
  EXPECT_EQ(l.dropped, (std::vector<int64_t>{8, 9}));
  // shuffled: the training's own loader, its generator carried from epoch to epoch
  c.shuffle = true;
  c.drop_last = false;
  c.seed = 7;
  lab::SingleProcessLoader loader(10, 4, true, false, 7);
  loader.next_epoch();
  EXPECT_EQ(viz::layout_dp_epoch(c, 10, 1).batches, loader.next_epoch());
}
