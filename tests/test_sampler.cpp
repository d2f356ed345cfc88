// DistributedSampler and DataLoader batching against PyTorch: tests/fixtures/sampler.json is
// written by tools/fixtures/gen_sampler.py with torch 1.13 (the test itself needs no torch).
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "errors.h"
#include "sampler.h"

namespace {

using Index = std::vector<int64_t>;
using json = nlohmann::json;

const json& fixture() {
  static const json fx = [] {
    std::ifstream f(std::string(DTLAB_FIXTURES_DIR) + "/sampler.json");
    if (!f) throw std::runtime_error("missing fixture sampler.json (tools/fixtures/gen_sampler.py)");
    return json::parse(f);
  }();
  return fx;
}

lab::SamplerOptions options_of(const json& c, int rank) {
  lab::SamplerOptions o;
  o.dataset_size = c.at("L").get<int64_t>();
  o.num_replicas = c.at("R").get<int>();
  o.rank = rank;
  o.shuffle = c.at("shuffle").get<bool>();
  o.seed = c.at("seed").get<uint64_t>();
  o.drop_last = c.at("drop_last").get<bool>();
  return o;
}

std::string describe(const json& c, int rank) {
  std::ostringstream s;
  s << "L=" << c.at("L") << " R=" << c.at("R") << " rank=" << rank << " shuffle=" << c.at("shuffle")
    << " drop_last=" << c.at("drop_last") << " seed=" << c.at("seed") << " epoch=" << c.at("epoch");
  return s.str();
}

// Message of the ConfigError fn throws ("" and a test failure if it throws nothing).
template <typename Fn>
std::string config_error(Fn fn) {
  try {
    fn();
  } catch (const lab::ConfigError& e) {
    EXPECT_EQ(e.exit_code(), lab::kExitUsage);
    return e.what();
  }
  ADD_FAILURE() << "expected lab::ConfigError";
  return {};
}

Index iota(int64_t n) {
  Index v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), 0);
  return v;
}

}  // namespace

// docs/semantics.md's worked example, spelled out.
TEST(Sampler, SemanticsExampleTenSamplesFourRanks) {
  lab::SamplerOptions o;
  o.dataset_size = 10;
  o.num_replicas = 4;
  o.shuffle = false;

  const std::vector<Index> padded = {{0, 4, 8}, {1, 5, 9}, {2, 6, 0}, {3, 7, 1}};
  const std::vector<Index> cut = {{0, 4}, {1, 5}, {2, 6}, {3, 7}};
  for (int rank = 0; rank < 4; ++rank) {
    o.rank = rank;
    o.drop_last = false;
    const lab::DistributedSampler pad(o);
    EXPECT_EQ(pad.num_samples(), 3);
    EXPECT_EQ(pad.total_size(), 12);
    EXPECT_EQ(pad.indices(), padded[static_cast<size_t>(rank)]) << "rank " << rank;
    EXPECT_EQ(pad.global_indices(), (Index{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1}));

    o.drop_last = true;
    const lab::DistributedSampler drop(o);
    EXPECT_EQ(drop.num_samples(), 2);
    EXPECT_EQ(drop.total_size(), 8);
    EXPECT_EQ(drop.indices(), cut[static_cast<size_t>(rank)]) << "rank " << rank;
  }
}

// Every (L, R, shuffle, drop_last, seed, epoch) of the fixture grid, every rank.
TEST(Sampler, MatchesTorchDistributedSampler) {
  const json& cases = fixture().at("samplers");
  ASSERT_GT(cases.size(), 500u);
  size_t full = 0, digested = 0;
  for (const json& c : cases) {
    const int world = c.at("R").get<int>();
    Index global;
    for (int rank = 0; rank < world; ++rank) {
      lab::DistributedSampler s(options_of(c, rank));
      s.set_epoch(c.at("epoch").get<int64_t>());
      const std::string what = describe(c, rank);
      ASSERT_EQ(s.num_samples(), c.at("num_samples").get<int64_t>()) << what;
      ASSERT_EQ(s.total_size(), c.at("total_size").get<int64_t>()) << what;
      const Index mine = s.indices();
      if (c.contains("indices")) {
        ASSERT_EQ(mine, c.at("indices").at(static_cast<size_t>(rank)).get<Index>()) << what;
        ++full;
      } else {
        // Digest: count, first 16, sum and sum of (position + 1) * index, as gen_sampler.py.
        const json& d = c.at("digests").at(static_cast<size_t>(rank));
        ASSERT_EQ(static_cast<int64_t>(mine.size()), d.at("count").get<int64_t>()) << what;
        const Index head = d.at("head").get<Index>();
        ASSERT_EQ(Index(mine.begin(), mine.begin() + static_cast<std::ptrdiff_t>(head.size())), head) << what;
        int64_t sum = 0, weighted = 0;
        for (size_t i = 0; i < mine.size(); ++i) {
          sum += mine[i];
          weighted += static_cast<int64_t>(i + 1) * mine[i];
        }
        ASSERT_EQ(sum, d.at("sum").get<int64_t>()) << what;
        ASSERT_EQ(weighted, d.at("weighted_sum").get<int64_t>()) << what;
        ++digested;
      }
      // Every rank sees the same global list, and its own share is that list strided.
      const Index g = s.global_indices();
      ASSERT_EQ(static_cast<int64_t>(g.size()), s.total_size()) << what;
      if (rank == 0) global = g;
      ASSERT_EQ(g, global) << what;
      for (size_t i = 0; i < mine.size(); ++i) {
        ASSERT_EQ(mine[i], g[static_cast<size_t>(rank) + i * static_cast<size_t>(world)]) << what;
      }
    }
  }
  EXPECT_GT(full, 0u);
  EXPECT_GT(digested, 0u);
}

TEST(Sampler, EpochReshufflesOnlyWhenSet) {
  lab::SamplerOptions o;
  o.dataset_size = 100;
  o.num_replicas = 4;
  o.seed = 42;
  lab::DistributedSampler s(o);
  const Index first = s.indices();
  EXPECT_EQ(s.indices(), first);  // no set_epoch: the same order again
  s.set_epoch(1);
  EXPECT_EQ(s.epoch(), 1);
  EXPECT_NE(s.indices(), first);
  s.set_epoch(0);
  EXPECT_EQ(s.indices(), first);

  // L divisible by R: the ranks' shares are disjoint and cover the dataset.
  std::set<int64_t> seen;
  for (int rank = 0; rank < 4; ++rank) {
    o.rank = rank;
    for (int64_t i : lab::DistributedSampler(o).indices()) EXPECT_TRUE(seen.insert(i).second) << i;
  }
  EXPECT_EQ(seen.size(), 100u);
}

TEST(Sampler, InvalidRankUsesTorchWording) {
  for (const json& e : fixture().at("errors").at("invalid_rank")) {
    lab::SamplerOptions o;
    o.dataset_size = 10;
    o.num_replicas = e.at("num_replicas").get<int>();
    o.rank = e.at("rank").get<int>();
    EXPECT_EQ(config_error([&] { lab::DistributedSampler s(o); }), e.at("message").get<std::string>());
  }
  EXPECT_EQ(config_error([] {
              lab::SamplerOptions o;
              o.num_replicas = 4;
              o.rank = 4;
              lab::DistributedSampler s(o);
            }),
            "Invalid rank 4, rank should be in the interval [0, 3]");
}

TEST(Sampler, WorldSizeBelowOneIsSaidPlainly) {
  // torch would say "Invalid rank 0, rank should be in the interval [0, -1]".
  for (int world : {0, -2}) {
    lab::SamplerOptions o;
    o.dataset_size = 10;
    o.num_replicas = world;
    const std::string msg = config_error([&] { lab::DistributedSampler s(o); });
    EXPECT_NE(msg.find("world size"), std::string::npos) << msg;
    EXPECT_NE(msg.find("must be at least 1"), std::string::npos) << msg;
    EXPECT_NE(msg.find(std::to_string(world)), std::string::npos) << msg;
  }
}

// ---- DataLoader batching ----

TEST(Batching, BatchSamplerDocstringExample) {
  // torch.utils.data.BatchSampler's own example: range(10), batch_size 3.
  EXPECT_EQ(lab::make_batches(iota(10), 3, false),
            (std::vector<Index>{{0, 1, 2}, {3, 4, 5}, {6, 7, 8}, {9}}));
  EXPECT_EQ(lab::make_batches(iota(10), 3, true), (std::vector<Index>{{0, 1, 2}, {3, 4, 5}, {6, 7, 8}}));
  EXPECT_TRUE(lab::make_batches({}, 3, false).empty());
}

TEST(Batching, CountsMatchTorchDataLoader) {
  for (const json& c : fixture().at("loader")) {
    const int64_t n = c.at("n").get<int64_t>();
    const int64_t b = c.at("B").get<int64_t>();
    const bool drop = c.at("drop_last").get<bool>();
    const std::string what =
        "n=" + std::to_string(n) + " B=" + std::to_string(b) + " drop_last=" + (drop ? "1" : "0");
    EXPECT_EQ(lab::batches_per_epoch(n, b, drop), c.at("len").get<int64_t>()) << what;
    const Index indices = iota(n);
    const std::vector<Index> batches = lab::make_batches(indices, b, drop);
    ASSERT_EQ(static_cast<int64_t>(batches.size()), c.at("num_batches").get<int64_t>()) << what;
    if (batches.empty()) {
      EXPECT_TRUE(c.at("last_batch_size").is_null()) << what;
      continue;
    }
    EXPECT_EQ(static_cast<int64_t>(batches.back().size()), c.at("last_batch_size").get<int64_t>()) << what;
    if (c.contains("batch_sizes")) {
      std::vector<int64_t> sizes;
      for (const Index& batch : batches) sizes.push_back(static_cast<int64_t>(batch.size()));
      EXPECT_EQ(sizes, c.at("batch_sizes").get<std::vector<int64_t>>()) << what;
    }
    // Batches are consecutive slices of the index list.
    Index joined;
    for (const Index& batch : batches) joined.insert(joined.end(), batch.begin(), batch.end());
    EXPECT_TRUE(std::equal(joined.begin(), joined.end(), indices.begin())) << what;
  }
}

TEST(Batching, SamplerThroughDataLoaderMatchesTorch) {
  for (const json& c : fixture().at("loader_with_sampler")) {
    const int world = c.at("R").get<int>();
    for (int rank = 0; rank < world; ++rank) {
      lab::SamplerOptions o;
      o.dataset_size = c.at("L").get<int64_t>();
      o.num_replicas = world;
      o.rank = rank;
      o.shuffle = c.at("shuffle").get<bool>();
      o.seed = c.at("seed").get<uint64_t>();
      o.drop_last = c.at("sampler_drop_last").get<bool>();
      lab::DistributedSampler s(o);
      s.set_epoch(c.at("epoch").get<int64_t>());
      const auto batches =
          lab::make_batches(s.indices(), c.at("B").get<int64_t>(), c.at("loader_drop_last").get<bool>());
      EXPECT_EQ(batches, c.at("batches").at(static_cast<size_t>(rank)).get<std::vector<Index>>())
          << "L=" << c.at("L") << " R=" << world << " B=" << c.at("B")
          << " sampler_drop_last=" << c.at("sampler_drop_last")
          << " loader_drop_last=" << c.at("loader_drop_last") << " rank " << rank;
    }
  }
}

TEST(Batching, NonPositiveBatchSizeUsesTorchWording) {
  for (const json& e : fixture().at("errors").at("batch_size")) {
    const int64_t b = e.at("batch_size").get<int64_t>();
    const std::string expected = e.at("message").get<std::string>();
    EXPECT_EQ(config_error([&] { lab::make_batches(iota(10), b, false); }), expected);
    EXPECT_EQ(config_error([&] { lab::batches_per_epoch(10, b, true); }), expected);
  }
  EXPECT_EQ(config_error([] { lab::make_batches(iota(4), 0, false); }),
            "batch_size should be a positive integer value, but got batch_size=0");
}
