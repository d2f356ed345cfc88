// The allreduce algorithms side by side (ring, naive, tree) over emulated ranks, through
// Communicator::allreduce_sum: exact sums on inputs built to be exact, the same bits on every
// rank and in each algorithm's documented summation order, the bytes each rank must send and
// receive, consistent events and gate calls, and failures that stop every rank quickly.
//
// Sections: variants (every algorithm, and the tree without its small-message path) | exact sums
// | summation orders and bits | pipelined ring against the plain ring | events, bytes, gate calls
// | failures | Native | --allreduce in the config and the CLI.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "config.h"
#include "errors.h"
#include "rank_threads.h"
#include "ring_allreduce.h"
#include "test_util.h"
#include "tree_allreduce.h"

namespace {

using lab::AllreduceAlgorithm;
using labtest::message_of;
using labtest::RankWorld;

#define EXPECT_CONTAINS(text, part) \
  EXPECT_NE(std::string(text).find(part), std::string::npos) << "message: " << (text)

const AllreduceAlgorithm kAlgorithms[] = {AllreduceAlgorithm::Ring, AllreduceAlgorithm::Naive,
                                          AllreduceAlgorithm::Tree};

// What the tests run: every algorithm through Communicator::allreduce_sum, plus the tree with its
// small-message (recursive doubling) path switched off, so that both tree paths meet small counts.
struct Variant {
  AllreduceAlgorithm algo;
  bool halving_only;  // tree: halving-doubling at every size
  std::string name() const { return std::string(lab::allreduce_algorithm_name(algo)) + (halving_only ? "-halving" : ""); }
  size_t doubling_max_bytes() const { return halving_only ? 0 : lab::kTreeDoublingBytes; }
  // Whether a buffer of count floats takes the tree's recursive-doubling path (an empty one does).
  bool doubling(size_t count) const {
    return algo == AllreduceAlgorithm::Tree && count * sizeof(float) <= doubling_max_bytes();
  }
  void run(lab::Communicator& comm, float* data, size_t count, lab::CollectiveInfo info) const {
    comm.set_allreduce_algorithm(algo);
    if (halving_only)
      lab::tree_allreduce(comm, data, count, info, doubling_max_bytes());
    else
      comm.allreduce_sum(data, count, info);
  }
};
const Variant kVariants[] = {{AllreduceAlgorithm::Ring, false},
                             {AllreduceAlgorithm::Naive, false},
                             {AllreduceAlgorithm::Tree, false},
                             {AllreduceAlgorithm::Tree, true}};

// Awkward counts: empty, single, one less or more than N, primes, and a large odd size.
std::vector<size_t> counts_for(int n) {
  return {0, 1, 2, static_cast<size_t>(n - 1), static_cast<size_t>(n + 1), 7, 13, 997, (size_t{1} << 16) + 3};
}

int mod(int a, int n) { return ((a % n) + n) % n; }

// p = the largest power of two <= n (the tree's core).
int core_size(int n) {
  int p = 1;
  while (p * 2 <= n) p *= 2;
  return p;
}

int log2_of(int p) {
  int l = 0;
  while ((1 << l) < p) ++l;
  return l;
}

void expect_no_errors(const std::vector<std::exception_ptr>& errors) {
  for (size_t r = 0; r < errors.size(); ++r) EXPECT_FALSE(errors[r]) << "rank " << r << ": " << message_of(errors[r]);
}

long first_mismatch(const std::vector<float>& got, const std::vector<float>& want) {
  if (got.size() != want.size()) return 0;
  for (size_t i = 0; i < got.size(); ++i)
    if (std::memcmp(&got[i], &want[i], sizeof(float)) != 0) return static_cast<long>(i);
  return -1;
}

TEST(AllreduceAlgorithm, NamesParseBack) {
  for (AllreduceAlgorithm a : {AllreduceAlgorithm::Ring, AllreduceAlgorithm::Naive, AllreduceAlgorithm::Tree,
                               AllreduceAlgorithm::Native})
    EXPECT_EQ(lab::parse_allreduce_algorithm(lab::allreduce_algorithm_name(a)), a);
  EXPECT_STREQ(lab::allreduce_algorithm_name(AllreduceAlgorithm::Native), "mpi");
  EXPECT_THROW(lab::parse_allreduce_algorithm("butterfly"), lab::ConfigError);
}

// Rank r contributes r (and, in a second call, r + 1): the sums n(n-1)/2 and n(n+1)/2 are exact
// whatever the order, so every algorithm must hit them exactly, on every rank, for every count.
TEST(AllreduceAlgorithms, ExactSumsForAllWorldSizesAndCounts) {
  for (const Variant& v : kVariants)
    for (int n = 1; n <= 8; ++n) {
      RankWorld w(n);
      const auto counts = counts_for(n);
      std::vector<std::vector<std::vector<float>>> a(n), b(n);  // [rank][count index]
      expect_no_errors(w.run([&](int r, lab::Communicator& comm) {
        for (size_t count : counts) {
          a[r].emplace_back(count, static_cast<float>(r));
          b[r].emplace_back(count, static_cast<float>(r + 1));
          v.run(comm, a[r].back().data(), count, {"test", 0});
          v.run(comm, b[r].back().data(), count, {"test", 1});
        }
      }));
      for (size_t ci = 0; ci < counts.size(); ++ci) {
        const std::vector<float> want_a(counts[ci], static_cast<float>(n * (n - 1) / 2));
        const std::vector<float> want_b(counts[ci], static_cast<float>(n * (n + 1) / 2));
        for (int r = 0; r < n; ++r) {
          EXPECT_EQ(first_mismatch(a[r][ci], want_a), -1) << v.name() << " n=" << n << " count=" << counts[ci] << " rank " << r;
          EXPECT_EQ(first_mismatch(b[r][ci], want_b), -1) << v.name() << " n=" << n << " count=" << counts[ci] << " rank " << r;
        }
      }
    }
}

// Each algorithm's summation order, as its header documents it, for element i of inputs x[rank].
float ring_order(const std::vector<std::vector<float>>& x, size_t i, int n, size_t count) {
  const lab::RingChunks ch{count, n};
  int c = 0;
  while (i >= ch.begin(c) + ch.size(c)) ++c;
  float acc = x[c][i];  // chunk c starts at rank c and is accumulated by c+1, ..., c-1
  for (int k = 1; k < n; ++k) acc = x[(c + k) % n][i] + acc;
  return acc;
}
float naive_order(const std::vector<std::vector<float>>& x, size_t i, int n) {
  float acc = x[0][i];
  for (int r = 1; r < n; ++r) acc = acc + x[r][i];
  return acc;
}
// Fold x[r + p] into x[r], then the butterfly: at step k (d = p >> (k+1)) every rank adds its
// partner's partial sum (float addition commutes, so who adds does not change the bits).
float tree_order(const std::vector<std::vector<float>>& x, size_t i, int n) {
  const int p = core_size(n);
  std::vector<float> v(p);
  for (int r = 0; r < p; ++r) v[r] = r + p < n ? x[r][i] + x[r + p][i] : x[r][i];
  for (int d = p / 2; d >= 1; d /= 2) {
    std::vector<float> next(p);
    for (int r = 0; r < p; ++r) next[r] = v[r] + v[r ^ d];
    v = next;
  }
  return v[0];
}

// Random floats of mixed magnitudes: sums are not exact, so the bits show the summation order.
// Every rank must hold the same bits, and they must be the algorithm's documented order.
TEST(AllreduceAlgorithms, BitwiseIdenticalAcrossRanksInTheDocumentedOrder) {
  std::mt19937 gen(99);
  std::uniform_real_distribution<float> mant(-1.0f, 1.0f);
  std::uniform_int_distribution<int> expo(-10, 10);
  for (const Variant& v : kVariants)
    for (int n = 2; n <= 8; ++n) {
      const AllreduceAlgorithm algo = v.algo;
      const size_t count = 1000 + 3 * n;
      std::vector<std::vector<float>> in(n, std::vector<float>(count));
      for (auto& v : in)
        for (auto& x : v) x = std::ldexp(mant(gen), expo(gen));
      std::vector<std::vector<float>> out = in;
      RankWorld w(n);
      expect_no_errors(w.run([&](int r, lab::Communicator& comm) {
        v.run(comm, out[r].data(), count, {});
      }));
      std::vector<float> want(count);
      for (size_t i = 0; i < count; ++i)
        want[i] = algo == AllreduceAlgorithm::Ring    ? ring_order(in, i, n, count)
                  : algo == AllreduceAlgorithm::Naive ? naive_order(in, i, n)
                                                      : tree_order(in, i, n);
      for (int r = 0; r < n; ++r) {
        EXPECT_EQ(first_mismatch(out[r], out[0]), -1)
            << v.name() << " n=" << n << " rank " << r << " differs from rank 0";
        EXPECT_EQ(first_mismatch(out[r], want), -1)
            << v.name() << " n=" << n << " rank " << r << " is not the documented order";
      }
    }
}

uint64_t want_sent(const Variant& v, int r, int n, size_t count);

// The pipelined ring (what AllreduceAlgorithm::Ring runs) against the plain ring, the reference:
// the same bits on random inputs for segment sizes that cut chunks into 1, 2, 3 and many
// segments, and per segment one Chunk event and one gate call, with the plain ring's steps,
// chunks and neighbours and the same bytes in total.
TEST(AllreduceAlgorithms, PipelinedRingMatchesThePlainRingBitForBit) {
  std::mt19937 gen(7);
  std::uniform_real_distribution<float> mant(-1.0f, 1.0f);
  std::uniform_int_distribution<int> expo(-10, 10);
  for (int n : {2, 3, 5, 8})
    for (size_t count : {size_t{0}, size_t{5}, static_cast<size_t>(n * 64 + 3), size_t{4099}})
      for (size_t segment_bytes : {size_t{4}, size_t{100}, size_t{1024}, lab::kRingSegmentBytes}) {
        if (segment_bytes < 100 && count > 1000) continue;  // thousands of steps: slow, adds nothing
        const std::string where =
            "n=" + std::to_string(n) + " count=" + std::to_string(count) + " segment=" + std::to_string(segment_bytes);
        std::vector<std::vector<float>> in(n, std::vector<float>(count));
        for (auto& v : in)
          for (auto& x : v) x = std::ldexp(mant(gen), expo(gen));
        std::vector<std::vector<float>> plain = in, piped = in;
        RankWorld wp(n), wq(n);
        expect_no_errors(wp.run([&](int r, lab::Communicator& comm) {
          lab::ring_allreduce(comm, plain[r].data(), count, {"grad bucket", 0});
        }));
        expect_no_errors(wq.run([&](int r, lab::Communicator& comm) {
          lab::ring_allreduce_pipelined(comm, piped[r].data(), count, {"grad bucket", 0}, segment_bytes);
        }));
        const lab::RingChunks ch{count, n};
        const size_t seg_elems = std::max<size_t>(1, segment_bytes / sizeof(float));
        const size_t segments = std::max<size_t>(1, (ch.size(0) + seg_elems - 1) / seg_elems);
        for (int r = 0; r < n; ++r) {
          EXPECT_EQ(first_mismatch(piped[r], plain[r]), -1) << where << " rank " << r;
          std::vector<lab::Event> sent;
          for (const auto& e : wq.events(r))
            if (e.kind == lab::EventKind::Chunk) sent.push_back(e);
          ASSERT_EQ(sent.size(), 2 * (n - 1) * segments) << where << " rank " << r;
          uint64_t bytes = 0;
          for (size_t i = 0; i < sent.size(); ++i) {
            const size_t j = i / (2 * (n - 1));  // segment
            const int k = static_cast<int>(i % (2 * (n - 1)));
            const bool rs = k < n - 1;
            const int s = rs ? k : k - (n - 1);
            const int c = rs ? mod(r - s, n) : mod(r + 1 - s, n);
            EXPECT_EQ(sent[i].phase, rs ? lab::Phase::ReduceScatter : lab::Phase::Allgather) << where;
            EXPECT_EQ(sent[i].ring_step, s) << where;
            EXPECT_EQ(sent[i].chunk, c) << where;
            EXPECT_EQ(sent[i].dst, mod(r + 1, n)) << where;
            EXPECT_EQ(sent[i].bytes, (ch.size(c) * (j + 1) / segments - ch.size(c) * j / segments) * sizeof(float))
                << where << " segment " << j;
            bytes += sent[i].bytes;
          }
          EXPECT_EQ(bytes, want_sent(Variant{AllreduceAlgorithm::Ring, false}, r, n, count)) << where << " rank " << r;
        }
      }
}

// Records every gate call per rank.
class RecordingGate : public lab::StepGate {
 public:
  explicit RecordingGate(int n) : m_calls(n) {}
  void before_step(int rank, const lab::Event& next) override { m_calls[rank].push_back(next); }
  const std::vector<lab::Event>& calls(int r) const { return m_calls[r]; }

 private:
  std::vector<std::vector<lab::Event>> m_calls;  // each rank writes only its own entry
};

// Bytes rank r must send, per the algorithm headers (S = count floats).
uint64_t want_sent(const Variant& v, int r, int n, size_t count) {
  const uint64_t s = count * sizeof(float);
  if (n == 1) return 0;
  switch (v.algo) {
    case AllreduceAlgorithm::Ring: {  // every chunk but (r + 1), then every chunk but (r + 2)
      const lab::RingChunks ch{count, n};
      return 2 * s - (ch.size(mod(r + 1, n)) + ch.size(mod(r + 2, n))) * sizeof(float);
    }
    case AllreduceAlgorithm::Naive:  // rank 0: the sum to each other rank; the others: their buffer
      return r == 0 ? (n - 1) * s : s;
    case AllreduceAlgorithm::Tree: {
      const int p = core_size(n);
      if (r >= p) return s;  // fold-in only
      if (v.doubling(count)) return log2_of(p) * s + (r + p < n ? s : 0);  // whole buffer per step
      const lab::RingChunks blocks{count, p};
      auto range = [&](int first, int len) { return (blocks.begin(first + len) - blocks.begin(first)) * sizeof(float); };
      uint64_t b = s - range(r, 1);                                         // reduce-scatter
      for (int d = 1; d < p; d *= 2) b += range(r & ~(d - 1), d);           // allgather
      if (r + p < n) b += s;                                                 // fold-out
      return b;
    }
    case AllreduceAlgorithm::Native: break;
  }
  return 0;
}

// The order of the phases within one allreduce (the tree's fold-in is a Gather, its fold-out a
// Broadcast).
int phase_order(lab::Phase ph) {
  switch (ph) {
    case lab::Phase::Gather: return 0;
    case lab::Phase::ReduceScatter: return 1;
    case lab::Phase::Allgather: return 2;
    case lab::Phase::Broadcast: return 3;
    default: return 4;
  }
}

// Every Chunk event: sent by the rank that records it, fields as the algorithm's header says,
// gated by sender and receiver; bytes sent per rank as documented (want_sent), bytes received
// per rank for naive ((N-1) S at rank 0, S elsewhere), totals over ranks for ring and tree.
TEST(AllreduceAlgorithms, EventsBytesAndGateCallsAreConsistent) {
  for (const Variant& v : kVariants)
    for (int n = 1; n <= 8; ++n)
      for (size_t count : {size_t{0}, size_t{1}, static_cast<size_t>(n + 1), size_t{1009}, size_t{20011}}) {
        const AllreduceAlgorithm algo = v.algo;
        RecordingGate gate(n);
        RankWorld w(n, 10.0, &gate);
        std::vector<std::vector<float>> data(n, std::vector<float>(count, 1.0f));
        expect_no_errors(w.run([&](int r, lab::Communicator& comm) {
          comm.set_train_step(5);
          v.run(comm, data[r].data(), count, {"grad bucket", 2});
        }));
        const std::string where = v.name() + " n=" + std::to_string(n) + " count=" + std::to_string(count);
        const int p = core_size(n), levels = log2_of(p);
        // Steps are numbered within their phase: 0 .. steps-1 (the tree's fold steps are step 0).
        const int steps = algo == AllreduceAlgorithm::Tree ? levels : n - 1;
        std::vector<uint64_t> received(n, 0);
        for (int r = 0; r < n; ++r) {
          int collectives = 0;
          std::vector<lab::Event> sent;
          for (const auto& e : w.events(r)) {
            EXPECT_STREQ(e.op, "allreduce");
            EXPECT_STREQ(e.what, "grad bucket");
            EXPECT_EQ(e.tag, 2);
            EXPECT_EQ(e.op_seq, 0u);
            EXPECT_EQ(e.train_step, 5);
            EXPECT_EQ(e.rank, r);
            EXPECT_LE(e.t_start, e.t_end);
            if (e.kind == lab::EventKind::Collective) {
              ++collectives;
              EXPECT_EQ(e.bytes, count * sizeof(float));
              continue;
            }
            ASSERT_EQ(e.kind, lab::EventKind::Chunk);
            sent.push_back(e);
            EXPECT_EQ(e.src, r) << where;  // the sender records
            ASSERT_TRUE(e.dst >= 0 && e.dst < n && e.dst != r) << where << " dst " << e.dst;
            EXPECT_TRUE(e.ring_step >= 0 && e.ring_step < steps) << where << " step " << e.ring_step;
            received[e.dst] += e.bytes;
            switch (algo) {
              case AllreduceAlgorithm::Ring:
                EXPECT_EQ(e.dst, mod(r + 1, n));
                EXPECT_TRUE(e.chunk >= 0 && e.chunk < n);
                break;
              case AllreduceAlgorithm::Naive:
                EXPECT_EQ(e.chunk, 0);
                EXPECT_EQ(e.bytes, count * sizeof(float));
                EXPECT_EQ(e.phase, r == 0 ? lab::Phase::Broadcast : lab::Phase::Gather) << where;
                EXPECT_EQ(e.ring_step, r == 0 ? e.dst - 1 : r - 1) << where;
                break;
              case AllreduceAlgorithm::Tree: {
                EXPECT_TRUE(e.chunk >= 0 && e.chunk < p);
                if (e.phase == lab::Phase::Gather) {  // fold-in
                  EXPECT_TRUE(r >= p && e.dst == r - p && e.ring_step == 0 && e.chunk == 0) << where << " rank " << r;
                } else if (e.phase == lab::Phase::Broadcast) {  // fold-out
                  EXPECT_TRUE(r < p && e.dst == r + p && e.ring_step == 0 && e.chunk == 0) << where << " rank " << r;
                } else {
                  const int k = e.ring_step;
                  const int d = e.phase == lab::Phase::Allgather ? 1 << k : p >> (k + 1);
                  EXPECT_EQ(e.dst, r ^ d) << where;
                  if (v.doubling(count)) {  // the whole buffer, reduce steps only
                    EXPECT_EQ(e.phase, lab::Phase::ReduceScatter) << where;
                    EXPECT_EQ(e.chunk, 0) << where;
                    EXPECT_EQ(e.bytes, count * sizeof(float)) << where;
                  } else {  // the first block of the range sent: the partner's half, or this rank's range
                    EXPECT_EQ(e.chunk, e.phase == lab::Phase::Allgather ? (r & ~(d - 1)) : ((r ^ d) & ~(d - 1))) << where;
                  }
                }
                break;
              }
              case AllreduceAlgorithm::Native: break;
            }
            // The receiver passed its gate for that very step (phase and step within it).
            bool gated = false;
            for (const auto& g : gate.calls(e.dst)) gated |= g.ring_step == e.ring_step && g.phase == e.phase;
            EXPECT_TRUE(gated) << where << ": rank " << e.dst << " never gated " << lab::phase_name(e.phase) << " step "
                               << e.ring_step;
          }
          EXPECT_EQ(collectives, 1) << where;
          // The gate saw each sent transfer before it happened, in the same order.
          std::vector<lab::Event> gated_sends;
          for (const auto& g : gate.calls(r))
            if (g.src == r) gated_sends.push_back(g);
          ASSERT_EQ(gated_sends.size(), sent.size()) << where << " rank " << r;
          uint64_t bytes = 0;
          for (size_t i = 0; i < sent.size(); ++i) {
            EXPECT_EQ(gated_sends[i].ring_step, sent[i].ring_step);
            EXPECT_EQ(gated_sends[i].phase, sent[i].phase);
            EXPECT_EQ(gated_sends[i].chunk, sent[i].chunk);
            EXPECT_EQ(gated_sends[i].dst, sent[i].dst);
            EXPECT_EQ(gated_sends[i].bytes, sent[i].bytes);
            if (i > 0) {  // in protocol order: phase by phase, steps ascending
              EXPECT_LT(std::make_pair(phase_order(sent[i - 1].phase), sent[i - 1].ring_step),
                        std::make_pair(phase_order(sent[i].phase), sent[i].ring_step))
                  << where << " rank " << r;
            }
            bytes += sent[i].bytes;
          }
          EXPECT_EQ(bytes, want_sent(v, r, n, count)) << where << " rank " << r;
          EXPECT_EQ(w.comms[r]->bytes_sent(), bytes) << where << " rank " << r;
        }
        const uint64_t s = count * sizeof(float);
        if (algo == AllreduceAlgorithm::Naive && n > 1) {
          for (int r = 0; r < n; ++r) EXPECT_EQ(received[r], r == 0 ? (n - 1) * s : s) << where << " rank " << r;
        }
        if (algo == AllreduceAlgorithm::Ring) {  // 2(N-1)/N of the buffer per rank, summed exactly
          uint64_t total = 0;
          for (int r = 0; r < n; ++r) total += received[r];
          EXPECT_EQ(total, 2 * static_cast<uint64_t>(n - 1) * s) << where;
        }
        if (algo == AllreduceAlgorithm::Tree && n > 1 && !v.doubling(count)) {  // 2(p-1) S in the core, 2 S per extra
          uint64_t total = 0;
          for (int r = 0; r < n; ++r) total += received[r];
          EXPECT_EQ(total, 2 * static_cast<uint64_t>(p - 1) * s + 2 * static_cast<uint64_t>(n - p) * s) << where;
        }
      }
}

// Throws "injected failure" on rank `victim` just before its step `step` of phase `phase`.
class FailingGate : public lab::StepGate {
 public:
  FailingGate(int victim, lab::Phase phase, int step) : m_victim(victim), m_phase(phase), m_step(step) {}
  void before_step(int rank, const lab::Event& next) override {
    if (rank == m_victim && next.phase == m_phase && next.ring_step == m_step)
      throw std::runtime_error("injected failure");
  }

 private:
  int m_victim;
  lab::Phase m_phase;
  int m_step;
};

// One rank fails in the middle of a naive or tree allreduce: every other rank gets a CommError
// naming it, long before the timeout.
TEST(AllreduceAlgorithms, AFailingRankStopsEveryRankQuickly) {
  const double kTimeout = 5.0;
  struct Case {
    AllreduceAlgorithm algo;
    int n, victim;
    lab::Phase phase;
    int step;
    size_t count;
  };
  // Failure points after which every rank still needs the victim (a rank that does not, e.g. the
  // pair that finishes a recursive-doubling step without it, may legitimately complete the call).
  // naive: a sender before its gather step; rank 0 before its first broadcast. tree: a core rank
  // on the doubling path (1000 floats) before step 0 and on the halving-doubling path (100000
  // floats) before step 1, with and without extra ranks waiting for their fold-out, and an extra
  // rank before its fold-in.
  for (const Case& c : {Case{AllreduceAlgorithm::Naive, 4, 2, lab::Phase::Gather, 1, 1000},
                        Case{AllreduceAlgorithm::Naive, 5, 0, lab::Phase::Broadcast, 0, 1000},
                        Case{AllreduceAlgorithm::Tree, 4, 1, lab::Phase::ReduceScatter, 0, 1000},
                        Case{AllreduceAlgorithm::Tree, 4, 1, lab::Phase::ReduceScatter, 1, 100000},
                        Case{AllreduceAlgorithm::Tree, 6, 3, lab::Phase::ReduceScatter, 0, 1000},
                        Case{AllreduceAlgorithm::Tree, 6, 3, lab::Phase::ReduceScatter, 1, 100000},
                        Case{AllreduceAlgorithm::Tree, 7, 6, lab::Phase::Gather, 0, 1000}}) {
    const std::string where = std::string(lab::allreduce_algorithm_name(c.algo)) + " n=" + std::to_string(c.n) +
                              " count=" + std::to_string(c.count);
    FailingGate gate(c.victim, c.phase, c.step);
    RankWorld w(c.n, kTimeout, &gate);
    std::vector<double> elapsed(c.n);
    const auto start = std::chrono::steady_clock::now();
    auto errors = w.run([&](int, lab::Communicator& comm) {
      comm.set_allreduce_algorithm(c.algo);
      std::vector<float> v(c.count, 1.0f);
      try {
        comm.allreduce_sum(v.data(), v.size(), {"grad bucket", 0});
      } catch (...) {
        elapsed[comm.rank()] = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        throw;
      }
    });
    for (int r = 0; r < c.n; ++r) {
      ASSERT_TRUE(errors[r]) << where << ": rank " << r << " finished without error";
      EXPECT_LT(elapsed[r], 1.0) << where << ": rank " << r;
      const std::string msg = message_of(errors[r]);
      if (r == c.victim) {
        EXPECT_EQ(msg, "injected failure");
        continue;
      }
      EXPECT_CONTAINS(msg, "rank " + std::to_string(r) + ": allreduce #0 (grad bucket 0): ");
      EXPECT_CONTAINS(msg, "rank " + std::to_string(c.victim) + " failed: injected failure");
    }
  }
}

// Native is the transport's own allreduce; the threads transport has none.
TEST(AllreduceAlgorithms, NativeNeedsATransportWithItsOwnAllreduce) {
  RankWorld w(2);
  auto errors = w.run([&](int, lab::Communicator& comm) {
    comm.set_allreduce_algorithm(AllreduceAlgorithm::Native);
    float x = 1.0f;
    comm.allreduce_sum(&x, 1, {});
  });
  for (const auto& e : errors) {
    ASSERT_TRUE(e);
    try {
      std::rethrow_exception(e);
    } catch (const lab::ConfigError& err) {
      EXPECT_STREQ(err.what(), "the threads transport has no allreduce of its own");
    } catch (...) {
      ADD_FAILURE() << "expected ConfigError, got: " << message_of(e);
    }
  }
}

// --allreduce: validated, written to config.toml under [distributed] and read back.
TEST(AllreduceAlgorithms, ConfigValidatesAndRoundTripsTheAlgorithm) {
  lab::RunConfig c;
  EXPECT_EQ(c.allreduce, "ring");
  c.allreduce = "tree";
  testutil::TempDir tmp;
  const std::string toml = lab::to_toml(c, {{"allreduce", "tree"}});
  EXPECT_NE(toml.find("[distributed]"), std::string::npos);
  EXPECT_NE(toml.find("allreduce = \"tree\""), std::string::npos);
  std::ofstream(tmp.file("config.toml")) << toml;
  EXPECT_EQ(lab::config_from_toml_file(tmp.file("config.toml")).allreduce, "tree");
  c.allreduce = "butterfly";
  EXPECT_THROW(lab::validate(c), lab::ConfigError);
  c.allreduce = "mpi";  // needs a transport with its own allreduce
  try {
    lab::validate(c);
    ADD_FAILURE() << "--allreduce mpi with --comm threads was accepted";
  } catch (const lab::ConfigError& e) {
    EXPECT_CONTAINS(e.what(), "--allreduce mpi needs --comm mpi");
  }
}

TEST(AllreduceAlgorithms, CliFlagPicksTheAlgorithm) {
  auto r = testutil::run_cli("run --help");
  EXPECT_CONTAINS(r.out, "--allreduce");
  r = testutil::run_cli("run --allreduce butterfly");
  EXPECT_EQ(r.exit_code, lab::kExitUsage) << r.out;
  EXPECT_CONTAINS(r.out, "butterfly");
  DTLAB_REQUIRE_DATASET();
  testutil::TempDir d;
  r = testutil::run_cli("run --model mlp --world-size 3 --batch-size 16 --limit-train 96 --limit-test 16 --steps 2 "
                        "--allreduce tree --out " + d.file("run"));
  EXPECT_EQ(r.exit_code, 0) << r.out;
  EXPECT_CONTAINS(r.out, "allreduce=tree");  // the header names the algorithm used
  EXPECT_CONTAINS(testutil::read_file(d.file("run/config.toml")), "allreduce = \"tree\"");
}

}  // namespace
