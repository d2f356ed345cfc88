// The ring view's model (viz/data/ring_model.h), rebuilt from the chunk events of real
// allreduces: the ring's rule, the naive and tree algorithms' blocks and shares, a trace cut short.
#include <gtest/gtest.h>

#include <vector>

#include "rank_threads.h"
#include "ring_allreduce.h"
#include "ring_model.h"
#include "test_util.h"
#include "tree_allreduce.h"

namespace {

// Events of one real allreduce of `count` floats on n ranks (ring unless told).
std::vector<std::vector<lab::Event>> allreduce_events(int n, size_t count,
                                                      lab::AllreduceAlgorithm a = lab::AllreduceAlgorithm::Ring) {
  labtest::RankWorld w(n);
  auto errors = w.run([&](int, lab::Communicator& comm) {
    comm.set_allreduce_algorithm(a);
    std::vector<float> data(count, 1.0f);
    comm.allreduce_sum(data.data(), data.size(), lab::CollectiveInfo{"grad bucket", 0});
  });
  for (auto& e : errors) EXPECT_FALSE(e);
  std::vector<std::vector<lab::Event>> ev(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) ev[static_cast<size_t>(r)] = w.events(r);
  return ev;
}

}  // namespace

TEST(VizRing, TraceOfARingAllreduceFollowsTheRule) {
  for (int n : {2, 3, 4, 7}) {
    const size_t count = 1000;
    const auto ev = allreduce_events(n, count);
    uint64_t seq = 0;
    ASSERT_TRUE(viz::latest_collective(ev, viz::CollectiveFilter{}, true, seq));
    const viz::CollectiveTrace t = viz::collect_trace(ev, seq);
    EXPECT_TRUE(t.complete());
    EXPECT_EQ(t.steps, 2 * (n - 1));
    EXPECT_EQ(t.chunks, n);
    EXPECT_EQ(t.bytes, count * 4);
    EXPECT_EQ(t.transfers.size(), static_cast<size_t>(n * 2 * (n - 1)));
    for (int r = 0; r < n; ++r) {
      EXPECT_EQ(viz::owned_chunk(t, r), (r + 1) % n) << "rank " << r << " of " << n;
      EXPECT_EQ(t.rank_messages[static_cast<size_t>(r)], 2 * (n - 1));
    }
    // after reduce-scatter: only the owned chunk is complete on each rank
    const viz::BufferState half = viz::buffer_state(t, n - 1);
    for (int r = 0; r < n; ++r)
      for (int c = 0; c < n; ++c) EXPECT_EQ(half.full(r, c), c == (r + 1) % n) << r << " " << c;
    // after allgather: everything everywhere
    const viz::BufferState all = viz::buffer_state(t, 2 * (n - 1));
    for (int r = 0; r < n; ++r)
      for (int c = 0; c < n; ++c) EXPECT_TRUE(all.full(r, c));
    // links: ring neighbours only, each carrying 2(N-1)/N of S when N divides the count
    const auto links = viz::link_bytes(t, t.steps);
    EXPECT_EQ(links.size(), static_cast<size_t>(n));
    uint64_t total = 0;
    for (const auto& l : links) {
      EXPECT_EQ(l.dst, (l.src + 1) % n);
      EXPECT_EQ(l.messages, 2 * (n - 1));
      total += l.bytes;
    }
    if (count % static_cast<size_t>(n) == 0) {
      for (const auto& l : links) EXPECT_EQ(l.bytes, 2 * (n - 1) * count * 4 / static_cast<size_t>(n));
    }
    EXPECT_EQ(total, static_cast<uint64_t>(2 * (n - 1)) * count * 4) << "every chunk travels 2(N-1) links";
    const viz::Bandwidth bw = viz::allreduce_bandwidth(t);
    ASSERT_TRUE(bw.valid);
    EXPECT_NEAR(bw.busbw, bw.algbw * 2.0 * (n - 1) / n, 1e-6 * bw.busbw);
  }
}

// The view's model of the other algorithms, rebuilt from their real events: the blocks each cuts
// the buffer into, who owns what after the combining steps, every rank's share of the bytes and
// messages, and the global step of an event on its own (what --ring-steps stops at).
TEST(VizRing, NaiveAndTreeTracesFollowTheirAlgorithms) {
  struct Case {
    lab::AllreduceAlgorithm a;
    const char* name;
    int n;
    size_t count;
  };
  const Case cases[] = {{lab::AllreduceAlgorithm::Ring, "ring", 4, 1000},   {lab::AllreduceAlgorithm::Naive, "naive", 4, 1000},
                        {lab::AllreduceAlgorithm::Naive, "naive", 3, 999},  {lab::AllreduceAlgorithm::Tree, "tree", 4, 40000},
                        {lab::AllreduceAlgorithm::Tree, "tree", 6, 40001},  {lab::AllreduceAlgorithm::Tree, "tree", 8, 40000},
                        {lab::AllreduceAlgorithm::Tree, "tree", 6, 1000}};  // the last: recursive doubling
  for (const Case& k : cases) {
    SCOPED_TRACE(std::string(k.name) + " on " + std::to_string(k.n) + " ranks, " + std::to_string(k.count) + " floats");
    const auto ev = allreduce_events(k.n, k.count, k.a);
    uint64_t seq = 0;
    ASSERT_TRUE(viz::latest_collective(ev, viz::CollectiveFilter{}, true, seq));
    const viz::CollectiveTrace t = viz::collect_trace(ev, seq, k.name);
    EXPECT_EQ(t.bytes, k.count * 4);
    EXPECT_EQ(t.chunks, viz::allreduce_blocks(k.name, k.n));
    int expected_steps = 0, combining = 0;
    for (const viz::PhaseSteps& p : viz::allreduce_phases(k.name, k.n, t.bytes)) {
      expected_steps += p.steps;
      if (p.phase == lab::Phase::Gather || p.phase == lab::Phase::ReduceScatter) combining += p.steps;
    }
    EXPECT_EQ(t.steps, expected_steps);
    for (int r = 0; r < k.n; ++r) {
      const viz::RankSends share = viz::allreduce_rank_sends(k.name, k.n, t.bytes, r);
      EXPECT_EQ(t.rank_bytes_sent[static_cast<size_t>(r)], share.bytes) << "rank " << r;
      EXPECT_EQ(t.rank_messages[static_cast<size_t>(r)], share.messages) << "rank " << r;
    }
    // after the combining steps: naive's rank 0 holds the sum; a tree's core rank r owns block r
    const viz::BufferState mid = viz::buffer_state(t, combining);
    const std::string name = k.name;
    int p = 1;
    while (p * 2 <= k.n) p *= 2;
    const bool doubling = name == "tree" && k.count * 4 <= lab::kTreeDoublingBytes;
    for (int r = 0; r < k.n; ++r) {
      if (name == "naive") {
        EXPECT_EQ(viz::owned_chunk(t, r), r == 0 ? 0 : -1) << r;
      }
      if (name == "tree" && !doubling) {
        EXPECT_EQ(viz::owned_chunk(t, r), r < p ? r : -1) << r;
      }
      if (doubling && r < p) {
        for (int c = 0; c < t.chunks; ++c) EXPECT_TRUE(mid.full(r, c)) << "doubling: the whole sum on rank " << r;
      }
    }
    const viz::BufferState end = viz::buffer_state(t, t.steps);
    for (int r = 0; r < k.n; ++r)
      for (int c = 0; c < t.chunks; ++c) EXPECT_TRUE(end.full(r, c)) << r << " " << c;
    // the global step from an event alone is the one the trace gives it
    for (const auto& log : ev)
      for (const lab::Event& e : log) {
        if (e.kind != lab::EventKind::Chunk || e.op_seq != seq) continue;
        bool found = false;
        for (const viz::Transfer& x : t.transfers)
          if (x.src == e.src && x.dst == e.dst && x.phase == e.phase && x.ring_step == e.ring_step && x.chunk == e.chunk) {
            EXPECT_EQ(viz::allreduce_global_step(k.name, k.n, e), x.global_step);
            found = true;
          }
        EXPECT_TRUE(found);
      }
  }
}

TEST(VizRing, IncompleteTraceKnowsItsBufferSize) {
  const auto full = allreduce_events(4, 1000);
  // keep only the first reduce-scatter step of every rank
  std::vector<std::vector<lab::Event>> part(4);
  for (int r = 0; r < 4; ++r)
    for (const auto& e : full[static_cast<size_t>(r)])
      if (e.kind == lab::EventKind::Chunk && e.phase == lab::Phase::ReduceScatter && e.ring_step == 0)
        part[static_cast<size_t>(r)].push_back(e);
  uint64_t seq = 0;
  ASSERT_TRUE(viz::latest_collective(part, viz::CollectiveFilter{}, false, seq));
  EXPECT_FALSE(viz::latest_collective(part, viz::CollectiveFilter{}, true, seq)) << "nothing finished";
  const viz::CollectiveTrace t = viz::collect_trace(part, seq);
  EXPECT_FALSE(t.complete());
  EXPECT_EQ(t.bytes, 4000u);
  EXPECT_EQ(t.steps, 1);
  const viz::BufferState s = viz::buffer_state(t, 1);
  // rank 1 received chunk 0 from rank 0 and added it: {0, 1}
  EXPECT_EQ(s.at(1, 0), 0b11u);
  EXPECT_EQ(s.at(1, 1), 0b10u);
}

// A lesson's observed iteration: the ring view shows that iteration's first collective of its
// filter (the buffers' broadcast before it is not a gradient collective), in the order rank 0
// recorded them; an iteration the trace lacks has none.
TEST(VizRing, CollectiveOfAnIterationIsItsFirstMatchingOne) {
  auto collective = [](uint64_t seq, int64_t iteration, const char* op, const char* what) {
    lab::Event e;
    e.kind = lab::EventKind::Collective;
    e.op = op;
    e.what = what;
    e.op_seq = seq;
    e.train_step = iteration;
    return e;
  };
  std::vector<std::vector<lab::Event>> ev(2);
  uint64_t seq = 0;
  for (int64_t it = 0; it < 3; ++it) {
    ev[0].push_back(collective(seq++, it, "broadcast", "buffers"));
    ev[0].push_back(collective(seq++, it, "allreduce", "grad bucket"));
    ev[0].push_back(collective(seq++, it, "allreduce", "grad bucket"));
  }
  ev[1] = ev[0];
  uint64_t found = 99;
  ASSERT_TRUE(viz::collective_of_iteration(ev, viz::CollectiveFilter{}, 1, found));
  EXPECT_EQ(found, 4u);
  viz::CollectiveFilter any;
  any.what.clear();
  any.op.clear();
  ASSERT_TRUE(viz::collective_of_iteration(ev, any, 1, found));
  EXPECT_EQ(found, 3u) << "every collective: the broadcast comes first";
  EXPECT_FALSE(viz::collective_of_iteration(ev, viz::CollectiveFilter{}, 3, found));
  EXPECT_FALSE(viz::collective_of_iteration({}, viz::CollectiveFilter{}, 0, found));
}
