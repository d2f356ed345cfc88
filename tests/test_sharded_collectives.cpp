// Reduce-scatter and allgather of equal blocks, in place (sharded_collectives.h), over emulated
// ranks: exact sums for every algorithm, world size and count; the ring's summation order, and
// where it gives the ring allreduce's bits; bytes, events, refusals, and the device path.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "bench_allreduce.h"
#include "errors.h"
#include "rank_threads.h"
#include "ring_allreduce.h"
#include "sharded_collectives.h"
#include "test_util.h"

namespace {

using labtest::message_of;
using labtest::RankWorld;
using lab::AllreduceAlgorithm;

// Per-element input of rank r, exact in float, and so are all its sums over <= 8 ranks.
float pattern(int r, size_t i) { return static_cast<float>(static_cast<int>((i * 7 + r * 13) % 1001) - 500) * 0.25f; }

void expect_no_errors(const std::vector<std::exception_ptr>& errors) {
  for (size_t r = 0; r < errors.size(); ++r) EXPECT_FALSE(errors[r]) << "rank " << r << ": " << message_of(errors[r]);
}

std::vector<AllreduceAlgorithm> algorithms_for(int n) {
  std::vector<AllreduceAlgorithm> a = {AllreduceAlgorithm::Ring, AllreduceAlgorithm::Naive};
  if (lab::tree_collectives_fit(n)) a.push_back(AllreduceAlgorithm::Tree);
  return a;
}

// Counts per block: empty, shorter than a segment, and (1 << 17) + 3 floats, which the ring cuts
// into two segments of 512 KiB.
const std::vector<size_t> kCounts = {0, 1, 3, 1000, (size_t{1} << 17) + 3};

TEST(ReduceScatter, ExactSumsOfEachRanksBlockForEveryAlgorithmWorldSizeAndCount) {
  for (int n = 1; n <= 8; ++n)
    for (AllreduceAlgorithm algo : algorithms_for(n))
      for (size_t count : kCounts) {
        const size_t all = static_cast<size_t>(n) * count;
        std::vector<std::vector<float>> data(n, std::vector<float>(all));
        RankWorld w(n);
        expect_no_errors(w.run([&](int r, lab::Communicator& comm) {
          comm.set_allreduce_algorithm(algo);
          for (size_t i = 0; i < all; ++i) data[r][i] = pattern(r, i);
          comm.reduce_scatter_sum(data[r].data(), count, {"test", 0});
        }));
        for (int r = 0; r < n; ++r) {
          long bad = -1;
          for (size_t i = 0; i < count && bad < 0; ++i) {
            const size_t at = static_cast<size_t>(r) * count + i;
            double s = 0;
            for (int q = 0; q < n; ++q) s += pattern(q, at);
            if (data[r][at] != static_cast<float>(s)) bad = static_cast<long>(i);
          }
          EXPECT_EQ(bad, -1) << lab::allreduce_algorithm_name(algo) << " n=" << n << " count=" << count << " rank " << r;
        }
      }
}

TEST(Allgather, EveryRankEndsWithEveryBlockForEveryAlgorithmWorldSizeAndCount) {
  for (int n = 1; n <= 8; ++n)
    for (AllreduceAlgorithm algo : algorithms_for(n))
      for (size_t count : kCounts) {
        const size_t all = static_cast<size_t>(n) * count;
        std::vector<std::vector<float>> data(n, std::vector<float>(all, -1.0f));
        RankWorld w(n);
        expect_no_errors(w.run([&](int r, lab::Communicator& comm) {
          comm.set_allreduce_algorithm(algo);
          for (size_t i = 0; i < count; ++i) data[r][r * count + i] = pattern(r, i);
          comm.allgather_in_place(data[r].data(), count, {"test", 0});
        }));
        for (int r = 0; r < n; ++r) {
          long bad = -1;
          for (size_t i = 0; i < all && bad < 0; ++i)
            if (data[r][i] != pattern(static_cast<int>(i / count), i % count)) bad = static_cast<long>(i);
          EXPECT_EQ(bad, -1) << lab::allreduce_algorithm_name(algo) << " n=" << n << " count=" << count << " rank " << r;
        }
      }
}

// Random floats of mixed magnitudes: the ring's block b is added in NCCL's order, starting at rank
// b + 1 and ending at b (acc = x[b+k] + acc). dtlab's ring allreduce (gloo's order) leaves chunk
// c = b + 1 with rank b, summed from rank c: the same chain of ranks, so a reduce-scatter whose
// block b holds what the allreduce's chunk b + 1 holds has its bits; block b itself, summed from
// rank b + 1 rather than rank b, has them for N = 2 only (a + b = b + a) and differs for N >= 3.
TEST(ReduceScatter, TheRingAddsEachBlockFromTheNextRankRoundToItsOwner) {
  std::mt19937 gen(99);
  std::uniform_real_distribution<float> mant(-1.0f, 1.0f);
  std::uniform_int_distribution<int> expo(-8, 8);
  for (int n = 2; n <= 8; ++n) {
    const size_t count = 1000;  // per block: the allreduce's chunks of n x count are these blocks
    const size_t all = n * count;
    std::vector<std::vector<float>> in(n, std::vector<float>(all));
    for (auto& v : in)
      for (auto& x : v) x = std::ldexp(mant(gen), expo(gen));
    std::vector<std::vector<float>> rs = in, ar = in;
    RankWorld w(n);
    expect_no_errors(w.run([&](int r, lab::Communicator& comm) {
      comm.reduce_scatter_sum(rs[r].data(), count, {});
      comm.allreduce_sum(ar[r].data(), all, {});
    }));
    size_t differ = 0;
    for (int b = 0; b < n; ++b)
      for (size_t i = b * count; i < (b + 1) * count; ++i) {
        float acc = in[(b + 1) % n][i];
        for (int k = 2; k <= n; ++k) acc = in[(b + k) % n][i] + acc;
        ASSERT_EQ(std::memcmp(&rs[b][i], &acc, sizeof acc), 0) << "n=" << n << " block " << b << " element " << i;
        differ += std::memcmp(&rs[b][i], &ar[0][i], sizeof acc) != 0;
      }
    if (n == 2)
      EXPECT_EQ(differ, 0u) << "two ranks: one addition, the same bits as the allreduce";
    else
      EXPECT_GT(differ, all / 20) << "n=" << n << ": another order of additions than the allreduce's chunk";
  }
}

// Bytes and events: every algorithm moves (N-1)/N of the buffer per rank on average, the ring and
// the tree exactly that on every rank; the naive ones pile it onto rank 0.
TEST(ReduceScatter, BytesAndEventsPerAlgorithm) {
  const int n = 4;
  const size_t count = 1000, all = n * count, block_bytes = count * 4;
  for (AllreduceAlgorithm algo : algorithms_for(n)) {
    RankWorld w(n);
    std::vector<uint64_t> rs_bytes(n), ag_bytes(n);
    expect_no_errors(w.run([&](int r, lab::Communicator& comm) {
      comm.set_allreduce_algorithm(algo);
      std::vector<float> data(all, 1.0f);
      comm.reduce_scatter_sum(data.data(), count, {"shard", 3});
      rs_bytes[r] = comm.bytes_sent();
      comm.allgather_in_place(data.data(), count, {"shard", 3});
      ag_bytes[r] = comm.bytes_sent() - rs_bytes[r];
    }));
    const std::string name = lab::allreduce_algorithm_name(algo);
    for (int r = 0; r < n; ++r) {
      if (algo == AllreduceAlgorithm::Naive) {
        // reduce-scatter: ranks 1..3 send their whole buffer, rank 0 sends 3 blocks; allgather:
        // ranks 1..3 send their block, rank 0 sends the whole buffer to each
        EXPECT_EQ(rs_bytes[r], r == 0 ? 3 * block_bytes : all * 4) << name << " rank " << r;
        EXPECT_EQ(ag_bytes[r], r == 0 ? 3 * all * 4 : block_bytes) << name << " rank " << r;
      } else {
        EXPECT_EQ(rs_bytes[r], 3 * block_bytes) << name << " rank " << r;
        EXPECT_EQ(ag_bytes[r], 3 * block_bytes) << name << " rank " << r;
      }
      size_t chunks = 0, wholes = 0;
      for (const lab::Event& e : w.events(r)) {
        EXPECT_EQ(std::string(e.what), "shard");
        EXPECT_EQ(e.tag, 3);
        if (e.kind == lab::EventKind::Collective) {
          ++wholes;
          EXPECT_EQ(e.bytes, all * 4);
        } else if (e.kind == lab::EventKind::Chunk) {
          ++chunks;
          EXPECT_EQ(e.src, r);
        }
      }
      EXPECT_EQ(wholes, 2u) << name;
      const size_t steps = algo == AllreduceAlgorithm::Tree ? 2 : 3;  // log2 4 or N - 1 per collective
      EXPECT_EQ(chunks, algo == AllreduceAlgorithm::Naive ? (r == 0 ? 6u : 2u) : 2 * steps) << name << " rank " << r;
    }
  }
}

TEST(ReduceScatter, TheTransportsOwnAndATreeOverThreeRanksAreRefusedByName) {
  RankWorld w(3);
  auto errors = w.run([&](int r, lab::Communicator& comm) {
    std::vector<float> data(30, 1.0f);
    comm.set_allreduce_algorithm(r % 2 ? AllreduceAlgorithm::Tree : AllreduceAlgorithm::Native);
    if (r % 2) comm.reduce_scatter_sum(data.data(), 10, {});
    else comm.allgather_in_place(data.data(), 10, {});
  });
  EXPECT_NE(message_of(errors[0]).find("allgather: the transport's own (--allreduce mpi or nccl) is not available"),
            std::string::npos)
      << message_of(errors[0]);
  EXPECT_NE(message_of(errors[1]).find("reduce_scatter with --allreduce tree needs a power-of-two world size, not 3"),
            std::string::npos)
      << message_of(errors[1]);
}

// dtlab bench allreduce --collective reduce_scatter|allgather: every size rounded down to N whole
// floats per block, #wrong 0 for every algorithm (the rank's own block of the sum; every block
// gathered), busbw = algbw x (N-1)/N; tree refused by name for three ranks.
TEST(BenchCollectives, ReduceScatterAndAllgatherRowsAreExactAndRounded) {
  for (const char* collective : {"reduce_scatter", "allgather"}) {
    testutil::TempDir dir;
    lab::BenchAllreduceOptions opt;
    opt.collective = collective;
    opt.world_sizes = {3};
    opt.algorithms = {"ring", "naive"};
    opt.min_bytes = 4096;
    opt.max_bytes = 65536;
    opt.warmup = 1;
    opt.batches = 2;
    opt.batch_seconds = 0.001;
    opt.json_out = dir.file("result.json");
    std::FILE* out = std::tmpfile();
    opt.out = out;
    ASSERT_EQ(lab::bench_allreduce(opt), 0);
    std::fclose(out);
    nlohmann::json j;
    std::ifstream(opt.json_out) >> j;
    EXPECT_EQ(j["collective"], collective);
    const nlohmann::json& per_n = j["results"]["3"];
    for (const char* algo : {"ring", "naive"}) {
      ASSERT_EQ(per_n[algo].size(), 3u) << collective << " " << algo;
      const uint64_t want_bytes[] = {4092, 16380, 65532};  // 4096, 16384, 65536 rounded down to 3 x 4 bytes
      for (size_t i = 0; i < 3; ++i) {
        const nlohmann::json& row = per_n[algo][i];
        EXPECT_EQ(row["bytes"].get<uint64_t>(), want_bytes[i]) << collective;
        EXPECT_EQ(row["wrong"].get<uint64_t>(), 0u) << collective << " " << algo << " " << want_bytes[i];
        EXPECT_NEAR(row["busbw_gbps"].get<double>(), row["algbw_gbps"].get<double>() * 2 / 3, 1e-9);
      }
    }
  }
  lab::BenchAllreduceOptions opt;
  opt.collective = "allgather";
  opt.world_sizes = {2, 3};
  opt.algorithms = {"tree"};
  try {
    lab::bench_allreduce(opt);
    ADD_FAILURE() << "tree over 3 ranks was not refused";
  } catch (const lab::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("--algorithms tree with --collective allgather needs power-of-two world "
                                         "sizes, got 3"),
              std::string::npos)
        << e.what();
  }
  opt.collective = "alltoall";
  EXPECT_THROW(lab::bench_allreduce(opt), lab::ConfigError);
}

}  // namespace
