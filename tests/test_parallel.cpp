// parallel_for (lab/tensor/parallel.h) and the promise it makes to the layers: the same bits with any
// number of compute threads.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <stdexcept>
#include <thread>
#include <utility>
#include <vector>

#include "backends.h"
#include "parallel.h"
#include "run.h"
#include "test_util.h"

namespace {

// Restores one compute thread when a test ends.
struct Threads {
  explicit Threads(int n) { lab::set_compute_threads(n); }
  ~Threads() { lab::set_compute_threads(1); }
};

TEST(ParallelFor, SlicesCoverTheRangeOnceInOrder) {
  for (int threads : {1, 2, 3}) {
    Threads t(threads);
    EXPECT_EQ(lab::compute_threads(), threads);
    for (int64_t count : {0, 1, 2, 5, 64, 1001}) {
      std::vector<std::atomic<int>> hits(static_cast<size_t>(count));
      std::atomic<int> slices{0};
      lab::parallel_for(count, [&](int64_t begin, int64_t end, int slot) {
        EXPECT_GE(slot, 0);
        EXPECT_LT(slot, threads);
        EXPECT_LT(begin, end);
        ++slices;
        for (int64_t i = begin; i < end; ++i) ++hits[static_cast<size_t>(i)];
      });
      for (auto& h : hits) EXPECT_EQ(h.load(), 1) << "threads " << threads << " count " << count;
      EXPECT_LE(slices.load(), threads);
    }
  }
}

TEST(ParallelFor, NestedCallsRunInlineAndErrorsReachTheCaller) {
  Threads t(2);
  std::atomic<int64_t> total{0};
  lab::parallel_for(4, [&](int64_t b, int64_t e, int) {
    for (int64_t i = b; i < e; ++i)
      lab::parallel_for(10, [&](int64_t b2, int64_t e2, int slot) {
        EXPECT_EQ(slot, 0);  // inline: one slice
        total += e2 - b2;
      });
  });
  EXPECT_EQ(total.load(), 40);
  EXPECT_THROW(lab::parallel_for(8, [](int64_t b, int64_t, int) {
                 if (b > 0) throw std::runtime_error("slice failed");
               }),
               std::runtime_error);
  // The pool still works afterwards.
  std::atomic<int64_t> n{0};
  lab::parallel_for(100, [&](int64_t b, int64_t e, int) { n += e - b; });
  EXPECT_EQ(n.load(), 100);
}

// One rank with 1 and with 2 compute threads: identical weights and metrics, for both models
// (conv: per-sample products, weight gradients per fixed block of samples; Linear: products cut
// in halves by their shape, along the rows from 128 of them, else along the columns; BatchNorm and
// the fused block: one thread per channel's sums).
TEST(ParallelFor, ARunGivesTheSameBitsWithOneOrTwoThreads) {
  DTLAB_REQUIRE_DATASET();
  const std::pair<const char*, int> cases[] = {{"mlp", 100}, {"mlp", 160}, {"cnn", 100}};
  for (const auto& [model, batch] : cases) {
    testutil::TempDir a, b;
    lab::RunConfig ca = testutil::small_run(model, 1, a.path(), 5);
    ca.batch_size = batch;  // 100: Linear's products cut along their columns; 160: along their rows
    lab::RunConfig cb = ca;
    cb.out_dir = b.path();
    cb.threads = 2;
    lab::Run(ca, lab::make_world).run();
    lab::Run(cb, lab::make_world).run();
    EXPECT_EQ(testutil::read_file(a.file("final.safetensors")), testutil::read_file(b.file("final.safetensors")))
        << model << " batch " << batch;
    EXPECT_EQ(testutil::without_wall_clock(testutil::read_file(a.file("metrics.jsonl"))),
              testutil::without_wall_clock(testutil::read_file(b.file("metrics.jsonl"))))
        << model << " batch " << batch;
  }
  lab::set_compute_threads(1);
}

// A scope gives back what it found, unless a newer scope lives: the app lets go of a finished run
// after it has started the next one, whose settings must stand until that one ends.
TEST(ComputeSettingsScope, RestoresWhatItFoundUnlessANewerScopeStands) {
  lab::set_compute_threads(1);
  lab::set_nondeterministic(false);
  {
    lab::ComputeSettingsScope a(2, true);
    EXPECT_EQ(lab::compute_threads(), 2);
    EXPECT_TRUE(lab::nondeterministic());
    {
      lab::ComputeSettingsScope b(3, false);
      EXPECT_EQ(lab::compute_threads(), 3);
      EXPECT_FALSE(lab::nondeterministic());
    }
    EXPECT_EQ(lab::compute_threads(), 2) << "b was the newest: it gave back a's settings";
    EXPECT_TRUE(lab::nondeterministic());
  }
  EXPECT_EQ(lab::compute_threads(), 1);
  EXPECT_FALSE(lab::nondeterministic());
  {
    auto first = std::make_unique<lab::ComputeSettingsScope>(2, true);
    lab::ComputeSettingsScope second(3, true);  // the next run, started before the first is let go
    first.reset();
    EXPECT_EQ(lab::compute_threads(), 3) << "a newer scope's settings stand";
    EXPECT_TRUE(lab::nondeterministic());
  }
  EXPECT_EQ(lab::compute_threads(), 1) << "the last one gives back what the first one found: the process's";
  EXPECT_FALSE(lab::nondeterministic());
}

// A run with --nondeterministic and --threads 2 leaves the process as it found it: the next run,
// evaluation or test (Autocast.NoneIsBitIdenticalToNeverSet after Nondeterministic.* in one
// binary) computes with the default settings, not with reductions in arrival order.
TEST(ComputeSettingsScope, ARunLeavesTheProcessAsItFoundIt) {
  DTLAB_REQUIRE_DATASET();
  lab::set_compute_threads(1);
  lab::set_nondeterministic(false);
  testutil::TempDir dir;
  lab::RunConfig c = testutil::small_run("mlp", 1, dir.path(), 2);
  c.threads = 2;
  c.nondeterministic = true;
  {
    lab::Run run(c, lab::make_world);
    run.start();
    EXPECT_TRUE(lab::nondeterministic());
    EXPECT_EQ(lab::compute_threads(), 2);
    while (!run.poll()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    run.finish();
  }
  EXPECT_FALSE(lab::nondeterministic());
  EXPECT_EQ(lab::compute_threads(), 1);
}

}  // namespace
