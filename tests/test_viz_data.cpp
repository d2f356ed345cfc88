// What the lab window shows, checked without a window: the ring model rebuilt from real chunk
// events, the epoch layout, the settings checks, the layout-file check, frame percentiles, the run
// host's stepping, and a run directory read back (viz/data: no GUI headers).
#include <gtest/gtest.h>

#include <cmath>

#include <array>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <thread>

#include "batching_model.h"
#include "data_parallel.h"
#include "drawn_items.h"
#include "errors.h"
#include "frame_stats.h"
#include "paths.h"
#include "rank_threads.h"
#include "ring_allreduce.h"
#include "tree_allreduce.h"
#include "ring_model.h"
#include "run_data.h"
#include "run_host.h"
#include "settings_check.h"
#include "test_util.h"
#include "train_eval_series.h"

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

template <class F>
bool wait_for(F&& ok, double seconds) {
  const auto t0 = std::chrono::steady_clock::now();
  while (!ok()) {
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > seconds) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

// A run of `steps` iterations on 2 ranks, `per_epoch` to an epoch, with an epoch record where each
// epoch ended, as load_run_dir (opened) or a live run's snapshot (live) leaves it.
viz::RunData run_with_epochs(bool opened, int64_t steps, int64_t per_epoch) {
  viz::RunData d;
  d.cfg.world_size = 2;
  d.live = !opened;
  d.phase = opened ? viz::RunPhase::Opened : viz::RunPhase::Running;
  d.source = opened ? "/runs/r1" : "live";
  d.steps_per_epoch = per_epoch;
  d.test_size = 500;
  std::vector<lab::StepRecord> recs;
  for (int64_t s = 0; s < steps; ++s)
    for (int r = 0; r < 2; ++r) {
      lab::StepRecord rec;
      rec.rank = r;
      rec.step = s;
      rec.epoch = s / per_epoch;
      rec.batch = s % per_epoch;
      recs.push_back(rec);
    }
  d.add_steps(recs);
  for (int64_t e = 0; (e + 1) * per_epoch <= steps; ++e) {
    lab::EpochRecord r;
    r.epoch = e;
    r.steps = (e + 1) * per_epoch;
    r.test_acc = 0.7 + 0.1 * static_cast<double>(e);
    r.test_loss = 0.6 - 0.1 * static_cast<double>(e);
    d.epochs.push_back(r);
  }
  return d;
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

TEST(VizSettings, ChecksNameTheSettingAndTheReason) {
  lab::RunConfig c;
  c.world_size = 1;
  c.bn = "sync";
  auto checks = viz::check_settings(c, 60000);
  const viz::SettingCheck* note = viz::find_check(checks, "bn", viz::Severity::Note);
  ASSERT_NE(note, nullptr);
  EXPECT_NE(note->message.find("no effect"), std::string::npos);

  c = lab::RunConfig{};
  c.model = "mlp";
  c.world_size = 4;
  c.batch_size = 62;
  checks = viz::check_settings(c, 250);  // 63 per rank: 62 + 1
  const viz::SettingCheck* warn = viz::find_check(checks, "batch_size", viz::Severity::Warning);
  ASSERT_NE(warn, nullptr);
  EXPECT_NE(warn->message.find("Expected more than 1 value per channel"), std::string::npos) << warn->message;
  EXPECT_NE(viz::find_check(checks, "sampler_drop_last", viz::Severity::Note), nullptr) << "250 = 4 x 63 - 2: padding";
  c.model = "cnn";  // BatchNorm2d: 28 x 28 values per channel even for one sample
  EXPECT_EQ(viz::find_check(viz::check_settings(c, 250), "batch_size", viz::Severity::Warning), nullptr);
  c.model = "mlp";

  c.batch_size = 0;
  checks = viz::check_settings(c, 250);
  ASSERT_FALSE(checks.empty());
  EXPECT_EQ(checks[0].severity, viz::Severity::Error);
  EXPECT_NE(checks[0].message.find("batch_size should be a positive integer value, but got batch_size=0"), std::string::npos);

  c.batch_size = 100;
  c.drop_last = true;
  checks = viz::check_settings(c, 250);
  const viz::SettingCheck* err = viz::find_check(checks, "batch_size", viz::Severity::Error);
  ASSERT_NE(err, nullptr) << "63 samples per rank, batch 100 with drop_last: no step at all";
}

// The greying-out rules: a choice that lab::validate would reject after the change is greyed out
// with validate's reason, and one that is not greyed out is accepted by validate; a choice is not
// blamed for a problem the configuration already has.
TEST(VizSettings, WhatValidateRejectsIsGreyedOutWithItsReason) {
  auto valid = [](const lab::RunConfig& c) {
    try {
      lab::validate(c);
      return true;
    } catch (const lab::Error&) {
      return false;
    }
  };
  std::vector<lab::RunConfig> bases;
  for (const char* mode : {"ddp", "dp", "local-sgd"})
    for (int world : {1, 4})
      for (const char* bn : {"local", "sync"}) {
        lab::RunConfig c;
        c.model = "mlp";
        c.mode = mode;
        c.world_size = world;
        c.bn = bn;
        if (valid(c)) bases.push_back(c);
      }
  ASSERT_GE(bases.size(), 8u);
  const std::vector<std::pair<std::string, std::vector<std::string>>> choices = {
      {"mode", {"ddp", "dp", "local-sgd", "pipeline"}},
      {"allreduce", {"ring", "naive", "tree", "mpi"}},
      {"bn", {"local", "sync"}},
      {"sampler_drop_last", {"true", "false"}},
      {"drop_last", {"true", "false"}},
      {"no_sync_steps", {"0", "2", "-1"}},
      {"average_every", {"0", "1", "4"}},
      {"warmup_steps", {"-1", "0", "3"}},
      {"batch_size", {"0", "16"}},
      {"world_size", {"0", "1", "4", "65"}},
      {"overlap", {"true", "false"}}};
  int greyed = 0, rejected = 0;
  for (const lab::RunConfig& base : bases)
    for (const auto& [setting, values] : choices)
      for (const std::string& value : values) {
        lab::RunConfig changed = base;
        ASSERT_TRUE(viz::apply_choice(changed, setting, value)) << setting << " " << value;
        const std::string why = viz::unavailable_reason(base, setting, value);
        const std::string what = "mode " + base.mode + ", world " + std::to_string(base.world_size) + ", bn " + base.bn +
                                 ": " + setting + " = " + value;
        if (!valid(changed)) {
          ++rejected;
          EXPECT_NE(why, "") << what << " would be refused by lab::validate, so it must be greyed out";
        }
        if (why.empty()) {
          EXPECT_TRUE(valid(changed)) << what;
        }
        greyed += !why.empty();
      }
  EXPECT_GT(rejected, 20);
  EXPECT_GE(greyed, rejected);

  lab::RunConfig c;
  c.model = "mlp";
  c.world_size = 4;
  c.bn = "sync";
  EXPECT_NE(viz::unavailable_reason(c, "mode", "dp").find("SyncBatchNorm is only supported within"), std::string::npos);
  EXPECT_NE(viz::unavailable_reason(c, "allreduce", "mpi").find("mpirun"), std::string::npos);
  EXPECT_EQ(viz::unavailable_reason(c, "allreduce", "naive"), "");
  EXPECT_EQ(viz::unavailable_reason(c, "mode", "local-sgd"), "");
  c.bn = "local";
  c.mode = "dp";
  EXPECT_NE(viz::unavailable_reason(c, "bn", "sync").find("SyncBatchNorm"), std::string::npos);
  EXPECT_NE(viz::unavailable_reason(c, "sampler_drop_last", "true").find("DistributedSampler"), std::string::npos);
  EXPECT_NE(viz::unavailable_reason(c, "allreduce", "tree").find("no allreduce"), std::string::npos)
      << "no effect in DataParallel";
  EXPECT_NE(viz::unavailable_reason(c, "broadcast_buffers", "false").find("replicate"), std::string::npos);
  EXPECT_NE(viz::unavailable_reason(c, "no_sync_steps", "2"), "");
  // not blamed for a problem the configuration already has
  c = lab::RunConfig{};
  c.world_size = 4;
  c.batch_size = 0;
  EXPECT_EQ(viz::unavailable_reason(c, "allreduce", "tree"), "");
  EXPECT_NE(viz::unavailable_reason(c, "allreduce", "mpi"), "");
}

TEST(VizSettings, DataParallelChunksTheGlobalBatchLikeTorchChunk) {
  lab::RunConfig c;
  c.model = "mlp";
  c.mode = "dp";
  c.world_size = 4;
  c.batch_size = 10;  // 3, 3, 3, 1: device 3 normalizes one sample
  auto checks = viz::check_settings(c, 1000);
  const viz::SettingCheck* w = viz::find_check(checks, "batch_size", viz::Severity::Warning);
  ASSERT_NE(w, nullptr);
  EXPECT_NE(w->message.find("device 3's chunk holds 1 sample (3, 3, 3, 1)"), std::string::npos) << w->message;
  c.model = "cnn";
  EXPECT_EQ(viz::find_check(viz::check_settings(c, 1000), "batch_size", viz::Severity::Warning), nullptr);
  c.model = "mlp";
  c.batch_size = 6;  // 2, 2, 2: device 3 idles
  checks = viz::check_settings(c, 1002);
  EXPECT_EQ(viz::find_check(checks, "batch_size", viz::Severity::Warning), nullptr);
  bool idle = false;
  for (const auto& x : checks) idle = idle || x.message.find("device(s) 3 to 3 idle") != std::string::npos;
  EXPECT_TRUE(idle);
  c.batch_size = 8;  // 1001 = 125 x 8 + 1: the last batch is one sample, on device 0
  checks = viz::check_settings(c, 1001);
  w = viz::find_check(checks, "batch_size", viz::Severity::Warning);
  ASSERT_NE(w, nullptr);
  EXPECT_NE(w->message.find("the last batch of each epoch holds 1 samples"), std::string::npos) << w->message;
  c.drop_last = true;
  EXPECT_EQ(viz::find_check(viz::check_settings(c, 1001), "batch_size", viz::Severity::Warning), nullptr);
  c.batch_size = 2000;  // one DataLoader over 1000 samples, drop_last: nothing to train on
  EXPECT_NE(viz::find_check(viz::check_settings(c, 1000), "batch_size", viz::Severity::Error), nullptr);
}

TEST(VizSettings, LocalSgdSaysWhenItAveragesAndWhenItNeverDoes) {
  lab::RunConfig c;
  c.model = "mlp";
  c.mode = "local-sgd";
  c.world_size = 4;
  c.batch_size = 25;  // 1000 samples: 250 per rank, 10 iterations an epoch
  c.epochs = 1;
  c.warmup_steps = 2;
  c.average_every = 3;
  auto checks = viz::check_settings(c, 1000);
  const viz::SettingCheck* n = viz::find_check(checks, "average_every", viz::Severity::Note);
  ASSERT_NE(n, nullptr);
  EXPECT_NE(n->message.find("averaged after iterations 2, 5, 8, ..."), std::string::npos) << n->message;
  c.warmup_steps = 10;
  checks = viz::check_settings(c, 1000);
  n = viz::find_check(checks, "warmup_steps", viz::Severity::Note);
  ASSERT_NE(n, nullptr);
  EXPECT_NE(n->message.find("never averaged"), std::string::npos) << n->message;
  c.average_every = 0;
  checks = viz::check_settings(c, 1000);
  ASSERT_FALSE(checks.empty());
  EXPECT_EQ(checks[0].severity, viz::Severity::Error);
  EXPECT_EQ(checks[0].setting, "average_every") << checks[0].message;
}

TEST(VizPaths, ConfigDirFollowsXdgThenHome) {
  const char* old_xdg = std::getenv("XDG_CONFIG_HOME");
  const std::string saved = old_xdg ? old_xdg : "";
  setenv("XDG_CONFIG_HOME", "/tmp/xdg-test", 1);
  EXPECT_EQ(viz::config_dir(), "/tmp/xdg-test/dtlab");
  unsetenv("XDG_CONFIG_HOME");
  if (const char* home = std::getenv("HOME")) {
    EXPECT_EQ(viz::config_dir(), std::string(home) + "/.config/dtlab");
  }
  if (old_xdg) setenv("XDG_CONFIG_HOME", saved.c_str(), 1);
}

TEST(VizPaths, LayoutFileCheck) {
  EXPECT_EQ(viz::check_layout_ini(""), "");
  EXPECT_EQ(viz::check_layout_ini("[Window][Views]\nPos=360,19\nSize=1240,640\nCollapsed=0\n\n[Table][0x1,2]\n"), "");
  EXPECT_NE(viz::check_layout_ini("garbage\n"), "");
  EXPECT_NE(viz::check_layout_ini("[Window][Views]\nPos 360 19\n"), "");
  EXPECT_NE(viz::check_layout_ini("[Window][A]\nPos=1,2\n\x01\x02\x03"), "");
  EXPECT_NE(viz::check_layout_ini("[Window\nPos=1,2\n"), "");
}

TEST(VizFrameStats, NearestRankPercentiles) {
  std::vector<double> v;
  for (int i = 1; i <= 100; ++i) v.push_back(i);
  const viz::Percentiles p = viz::percentiles(v);
  EXPECT_EQ(p.p50, 50);
  EXPECT_EQ(p.p95, 95);
  EXPECT_EQ(p.p99, 99);
  EXPECT_EQ(p.max, 100);
  EXPECT_EQ(viz::percentiles({}).max, 0);
}

TEST(VizFrameStats, OnlyFramesDrawnWhileTrainingCount) {
  viz::FrameStats f;
  std::array<viz::FramePartTime, viz::kFrameParts> parts{};
  parts[static_cast<size_t>(viz::FramePart::Render)] = {8.0, 6.0};
  f.add(2.0, 0, 0, parts, false);     // while the data loads: cheap, not counted
  f.add(10.0, 0, 1.0, parts, true);   // the first training frame has no interval
  f.add(20.0, 50.0, 3.0, parts, true);
  f.add(1.0, 40.0, 0, parts, false);  // after the run
  EXPECT_EQ(f.frames(), 2u);
  EXPECT_EQ(f.all_frames(), 4u);
  EXPECT_EQ(f.frame().p50, 10.0);
  EXPECT_EQ(f.frame().max, 20.0);
  EXPECT_EQ(f.all_frame().max, 20.0);
  EXPECT_EQ(f.all_frame().p50, 2.0);
  EXPECT_EQ(f.interval().max, 50.0);
  EXPECT_EQ(f.interval().p50, 50.0) << "one interval: between the two training frames";
  EXPECT_EQ(f.late().max, 3.0);
  EXPECT_EQ(f.part_mean(viz::FramePart::Render).wall_ms, 8.0);
  EXPECT_EQ(f.part_mean(viz::FramePart::Render).cpu_ms, 6.0);
  EXPECT_EQ(f.part_mean(viz::FramePart::Swap).wall_ms, 0.0);
  const nlohmann::json j = f.to_json({{"extra", 1}});
  EXPECT_EQ(j["frames"].get<int>(), 2);
  EXPECT_EQ(j["all_frames"].get<int>(), 4);
  EXPECT_EQ(j["parts_mean_ms"]["render"]["cpu"].get<double>(), 6.0);
  EXPECT_EQ(j["extra"].get<int>(), 1);
  EXPECT_GT(viz::thread_cpu_seconds(), 0.0);
}

TEST(VizRunData, StepsByIterationAndRankWithBoundedBatchNormHistory) {
  viz::RunData d;
  d.cfg.world_size = 2;
  std::vector<lab::StepRecord> recs;
  const size_t steps = viz::RunData::kMaxBnSteps * 3;
  for (size_t s = 0; s < steps; ++s)
    for (int r = 0; r < 2; ++r) {
      lab::StepRecord rec;
      rec.rank = r;
      rec.step = static_cast<int64_t>(s);
      rec.bn.resize(1);
      rec.bn[0].batch_mean = {1.0f};
      recs.push_back(rec);
    }
  d.add_steps(recs);
  EXPECT_EQ(d.steps_done(), static_cast<int64_t>(steps));
  EXPECT_EQ(d.last_complete_step(), static_cast<int64_t>(steps) - 1);
  ASSERT_NE(d.record(5, 1), nullptr);
  EXPECT_EQ(d.record(5, 1)->rank, 1);
  size_t with_bn = 0;
  for (const auto& row : d.by_step) with_bn += !row[0].bn.empty();
  EXPECT_LE(with_bn, viz::RunData::kMaxBnSteps);
  EXPECT_FALSE(d.by_step.back()[0].bn.empty()) << "the newest steps keep their statistics";
  EXPECT_FALSE(d.by_step.front()[0].bn.empty()) << "thinning keeps every stride-th step, the first included";
}

// The lab window runs its ranks nicer than itself (run_host.h): every thread the run starts, the
// driver, the ranks and their communication threads, has the nice value asked for; the caller's
// stays as it was. (Threads that were there before, e.g. OpenBLAS's workers, are not the run's.)
TEST(VizRunHost, EveryThreadOfTheRunHasTheNiceValueAskedFor) {
  DTLAB_REQUIRE_DATASET();
  lab::RunConfig c;
  c.model = "mlp";
  c.world_size = 3;
  c.batch_size = 16;
  c.limit_train = 480;
  c.limit_test = 64;
  c.steps = 6;
  c.epochs = 0;  // --steps alone: as many epochs as it takes
  c.threads = 1;
  c.timeout_s = 20;
  auto threads = [] {
    std::set<int> tids;
    for (const auto& e : std::filesystem::directory_iterator("/proc/self/task"))
      tids.insert(std::atoi(e.path().filename().c_str()));
    return tids;
  };
  const std::set<int> before = threads();
  const int mine = viz::thread_nice();
  ASSERT_GT(mine, -100);
  viz::RunHost host(c, /*start_paused=*/true, /*nice=*/7);
  ASSERT_TRUE(wait_for([&] { return host.status().phase == viz::RunPhase::Paused; }, 30)) << host.status().error;
  host.step_iteration();  // the communication threads start with the first gradient allreduce
  ASSERT_TRUE(wait_for([&] {
    const auto it = host.iterations();
    return it.size() == 3 && it[0] == 1 && it[1] == 1 && it[2] == 1;
  }, 30));
  int started = 0;
  for (int tid : threads()) {
    if (before.count(tid)) continue;
    ++started;
    EXPECT_EQ(viz::thread_nice_of(tid), std::min(19, mine + 7)) << "thread " << tid;
  }
  EXPECT_GE(started, 1 + 3 + 3) << "the driver, the ranks and their communication threads";
  EXPECT_EQ(viz::thread_nice(), mine) << "the caller's priority is untouched";
}

TEST(VizRunHost, StepsOneIterationOneAllreduceThenFinishes) {
  DTLAB_REQUIRE_DATASET();
  lab::RunConfig c;
  c.model = "mlp";
  c.world_size = 3;
  c.batch_size = 16;
  c.limit_train = 480;  // 160 per rank: 10 iterations per epoch
  c.limit_test = 64;
  c.steps = 6;
  c.epochs = 0;  // --steps alone: as many epochs as it takes
  c.threads = 1;
  c.timeout_s = 20;
  viz::RunHost host(c, /*start_paused=*/true);
  viz::RunData d;
  d.reset_live(c);
  ASSERT_TRUE(wait_for([&] { return host.status().phase == viz::RunPhase::Paused; }, 30)) << host.status().error;
  auto allreduces = [&] {
    d.update_from(host);
    int n = 0;
    for (const auto& e : d.events[0]) n += e.kind == lab::EventKind::Collective && std::strcmp(e.op, "allreduce") == 0;
    return n;
  };
  host.step_iteration();
  ASSERT_TRUE(wait_for([&] {
    const auto it = host.iterations();
    return it.size() == 3 && it[0] == 1 && it[1] == 1 && it[2] == 1;
  }, 30));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  d.update_from(host);
  EXPECT_EQ(d.steps_done(), 1) << "exactly one iteration";
  const int before = allreduces();
  host.step_allreduce();
  ASSERT_TRUE(wait_for([&] { return allreduces() > before; }, 30));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(allreduces(), before + 1) << "exactly one allreduce";
  host.resume();
  ASSERT_TRUE(wait_for([&] { return host.done(); }, 60));
  d.update_from(host);
  EXPECT_EQ(host.status().phase, viz::RunPhase::Finished) << host.status().error;
  EXPECT_EQ(d.steps_done(), 6);
  EXPECT_TRUE(d.summary.valid);
}

TEST(VizRunHost, StoppingARunningRunDoesNotWaitForIt) {
  DTLAB_REQUIRE_DATASET();
  lab::RunConfig c;
  c.model = "mlp";
  c.world_size = 2;
  c.limit_train = 2000;
  c.limit_test = 64;
  c.epochs = 50;
  c.threads = 1;
  auto host = std::make_unique<viz::RunHost>(c, false);
  ASSERT_TRUE(wait_for([&] { return host->status().phase == viz::RunPhase::Running; }, 30));
  const auto t0 = std::chrono::steady_clock::now();
  host->request_stop();
  const double asked = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(asked, 0.5);
  ASSERT_TRUE(wait_for([&] { return host->done(); }, 30));
  EXPECT_EQ(host->status().phase, viz::RunPhase::Stopped);
}

TEST(VizRunHost, MissingDatasetIsAFailedRunWithAHint) {
  testutil::TempDir dir;
  lab::RunConfig c;
  c.data_dir = dir.file("nowhere");
  viz::RunHost host(c, false);
  ASSERT_TRUE(wait_for([&] { return host.done(); }, 30));
  const viz::HostStatus s = host.status();
  EXPECT_EQ(s.phase, viz::RunPhase::Failed);
  EXPECT_EQ(s.error_code, lab::kExitData);
  EXPECT_NE(s.error.find("nowhere"), std::string::npos) << s.error;
}

TEST(VizRunDir, ARunDirectoryReadsBackIntoTheSameData) {
  DTLAB_REQUIRE_DATASET();
  testutil::TempDir dir;
  const auto r = testutil::run_cli("run --model mlp --world-size 4 --batch-size 16 --limit-train 640 --limit-test 100 "
                                   "--epochs 2 --eval-every 4 --eval-samples 50 --threads 1 --out " + dir.file("run"));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const viz::RunData d = viz::load_run_dir(dir.file("run"));
  EXPECT_EQ(d.world(), 4);
  EXPECT_EQ(d.steps_done(), 20);  // 640 / 4 / 16 = 10 per epoch
  EXPECT_EQ(d.steps_per_epoch, 10);
  EXPECT_EQ(d.train_size, 640);
  EXPECT_EQ(d.epochs.size(), 2u);
  ASSERT_GE(d.evals.size(), 5u);  // after 1, 2, 4, 8, 12, 16, 20
  EXPECT_EQ(d.evals[0].steps, 1);
  EXPECT_EQ(d.evals.back().steps, 20);
  EXPECT_EQ(d.evals.back().probe_eval.size(), 10u);
  EXPECT_TRUE(d.summary.valid);
  ASSERT_NE(d.record(19, 3), nullptr);
  // BatchNorm statistics from bn_stats.bin: every step of epoch 0, then every 10th (--record-bn auto)
  EXPECT_FALSE(d.record(9, 3)->bn.empty());
  EXPECT_FALSE(d.record(10, 3)->bn.empty());
  EXPECT_TRUE(d.record(19, 3)->bn.empty());
  // the BatchNorm view shows the newest recorded step, not an empty last one
  EXPECT_EQ(d.bn_step_at_or_before(d.last_complete_step()), 10);
  EXPECT_EQ(d.bn_step_at_or_before(9), 9);
  EXPECT_EQ(d.bn_step_at_or_before(-1), -1);
  // the trace's chunk events rebuild the last gradient allreduce
  uint64_t seq = 0;
  ASSERT_TRUE(viz::latest_collective(d.events, viz::CollectiveFilter{}, true, seq));
  const viz::CollectiveTrace t = viz::collect_trace(d.events, seq);
  EXPECT_EQ(t.steps, 6);
  EXPECT_EQ(t.what, "grad bucket");
  for (int rank = 0; rank < 4; ++rank) EXPECT_EQ(viz::owned_chunk(t, rank), (rank + 1) % 4);
}

// DataParallel's devices other than 0 have no loss of their own (null in metrics.jsonl): the run
// directory still opens, with those losses NaN as the live run holds them.
TEST(VizRunDir, DataParallelRunDirectoryOpens) {
  DTLAB_REQUIRE_DATASET();
  testutil::TempDir dir;
  const auto r = testutil::run_cli("run --mode dp --model mlp --world-size 3 --batch-size 30 --limit-train 300 "
                                   "--limit-test 60 --steps 4 --threads 1 --out " + dir.file("run"));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const viz::RunData d = viz::load_run_dir(dir.file("run"));
  EXPECT_EQ(d.steps_done(), 4);
  ASSERT_NE(d.record(3, 0), nullptr);
  ASSERT_NE(d.record(3, 1), nullptr);
  EXPECT_TRUE(std::isfinite(d.record(3, 0)->loss));
  EXPECT_TRUE(std::isnan(d.record(3, 1)->loss));
}

TEST(VizRunDir, MissingConfigIsAnErrorNamingTheFile) {
  testutil::TempDir dir;
  try {
    viz::load_run_dir(dir.path());
    FAIL() << "expected an error";
  } catch (const lab::IoError& e) {
    EXPECT_NE(std::string(e.what()).find("config.toml"), std::string::npos) << e.what();
  }
}

// Found by fuzzing (fuzz/fuzz_run_dir.cpp) and by hand: damaged files of a run directory are an
// IoError naming the file (and the line of metrics.jsonl), not an exception of the JSON library, a
// float converted to an integer it does not fit (undefined behaviour), or room made for 10^11 steps.
TEST(VizRunDir, DamagedFilesAreErrorsNamingTheFile) {
  testutil::TempDir dir;
  lab::RunConfig c;
  c.model = "mlp";
  c.world_size = 2;
  c.data_dir = dir.file("no-dataset");
  const std::string step0 = R"({"kind":"step","rank":0,"step":0,"loss":1.5})"
                            "\n";
  struct Case {
    const char* file;
    std::string text;
    const char* says;
  };
  const Case cases[] = {
      {"summary.json", "5", "summary.json: bad summary"},  // the fuzzer's find: value() on a number
      {"metrics.jsonl", step0 + "5\n", "metrics.jsonl:2: bad record"},
      {"metrics.jsonl", R"({"kind":"step","rank":1e300,"step":0})", "metrics.jsonl:1: bad record: 'rank' is 1e+300"},
      {"metrics.jsonl", R"({"kind":"step","rank":0,"step":0,"bytes_sent":-1.5})", "'bytes_sent' is -1.5"},
      {"metrics.jsonl", step0 + R"({"kind":"step","rank":0,"step":100000000000})", "metrics.jsonl:2: step 100000000000"},
      {"metrics.jsonl", R"({"kind":"step","rank":0,"step":0,"bn":[5]})", "metrics.jsonl:1: bad record"},
      {"metrics.jsonl", R"({"kind":"epoch","train_loss":"x"})", "metrics.jsonl:1: bad record"},
      {"trace.json", R"({"traceEvents":[{"ph":"X","pid":1e20}]})", "trace.json: bad trace event: 'pid' is"},
      {"trace.json", R"({"traceEvents":[{"ph":"X","pid":0,"cat":"collective","name":"allreduce b 99999999999"}]})",
       "trace.json: bad trace event"},
      {"trace.json", R"({"traceEvents":[{"ph":"X","pid":0,"cat":"compute","args":5}]})", "trace.json: bad trace event"},
  };
  for (const Case& k : cases) {
    std::filesystem::remove_all(dir.file("run"));
    std::filesystem::create_directories(dir.file("run"));
    std::ofstream(dir.file("run/config.toml")) << lab::to_toml(c, {});
    std::ofstream(dir.file("run/metrics.jsonl")) << step0;
    std::ofstream(dir.file(std::string("run/") + k.file)) << k.text;
    try {
      viz::load_run_dir(dir.file("run"));
      ADD_FAILURE() << "accepted " << k.file << ": " << k.text;
    } catch (const lab::IoError& e) {
      EXPECT_NE(std::string(e.what()).find(k.says), std::string::npos) << e.what();
    }
  }
}

// What the controls say instead of the run buttons for a run opened from its directory, and what
// the views say when they have nothing: a live run has nothing yet; a directory never will.
TEST(VizRunData, AnOpenedRunSaysWhatItIs) {
  viz::RunData d = run_with_epochs(true, 64, 32);
  EXPECT_TRUE(d.opened());
  EXPECT_EQ(d.opened_description(), "unfinished run (no summary.json: it failed or was stopped), opened from "
                                    "/runs/r1: 64 iterations, 2 epochs of 32 iterations");
  d.summary.valid = true;
  EXPECT_EQ(d.opened_description(), "finished run, opened from /runs/r1: 64 iterations, 2 epochs of 32 iterations");
  EXPECT_EQ(d.state_text(), "finished run, from its run directory");
  EXPECT_EQ(viz::nothing_recorded(d, "collectives", "Press Play."),
            "This run directory holds no collectives: the run stopped before any, or its trace.json is missing.");
  d.events.assign(2, {});
  d.events[1].push_back(lab::Event{});
  EXPECT_EQ(viz::nothing_recorded(d, "collectives", "Press Play."),
            "This run directory's trace holds none of the collectives chosen here.");

  const viz::RunData live = run_with_epochs(false, 10, 32);
  EXPECT_FALSE(live.opened());
  EXPECT_EQ(live.opened_description(), "");
  EXPECT_EQ(live.state_text(), "running");
  EXPECT_EQ(viz::nothing_recorded(live, "collectives", "Press Play."), "No collectives recorded yet. Press Play.");
}

// A run without --eval-every has its epoch ends (eval mode) and its end (both modes): the view
// draws them where they were taken, and says what --eval-every would add.
TEST(VizTrainEval, WithoutEvalEveryTheEpochEndsAtTheirIterations) {
  viz::RunData d = run_with_epochs(true, 64, 32);
  d.summary.valid = true;
  d.summary.steps = 64;
  d.summary.eval_acc = 0.8;
  d.summary.train_acc = 0.79;
  d.summary.train_loss = 0.55;
  viz::TrainEvalSeries t = viz::train_eval_series(d);
  EXPECT_TRUE(t.x.empty());
  EXPECT_EQ(t.epoch_x, (std::vector<float>{32, 64}));
  EXPECT_FLOAT_EQ(t.epoch_acc[1], 0.8f);
  EXPECT_FLOAT_EQ(t.epoch_loss[0], 0.6f);
  EXPECT_TRUE(t.final_eval_x.empty()) << "the last epoch's evaluation is the end of the run's";
  EXPECT_EQ(t.final_train_x, (std::vector<float>{64}));
  EXPECT_FLOAT_EQ(t.final_train_acc[0], 0.79f);
  EXPECT_NE(t.note.find("was tested only where each epoch ended (white dots: eval mode, on all 500 test samples), "
                        "and at its end in train mode too"),
            std::string::npos)
      << t.note;
  EXPECT_NE(t.note.find("--eval-every N"), std::string::npos) << t.note;

  // --steps ending mid-epoch: no epoch ended at the last iteration, so its eval mode point is drawn too
  d.summary.steps = 70;
  t = viz::train_eval_series(d);
  EXPECT_EQ(t.final_eval_x, (std::vector<float>{70}));
  EXPECT_FLOAT_EQ(t.final_eval_acc[0], 0.8f);
  // no epoch ended at all: only the end of the run
  d.epochs.clear();
  t = viz::train_eval_series(d);
  EXPECT_NE(t.note.find("was tested only at its end, on all 500 test samples"), std::string::npos) << t.note;

  // periodic evaluations: the curves, nothing to add
  lab::EvalPoint p;
  p.steps = 1;
  d.evals.push_back(p);
  t = viz::train_eval_series(d);
  EXPECT_EQ(t.x, (std::vector<float>{1}));
  EXPECT_EQ(t.note, "");
}

// Before any evaluation: when the first point will come (live), or that there is none (opened).
TEST(VizTrainEval, NothingYetSaysWhenTheFirstPointComes) {
  viz::RunData live = run_with_epochs(false, 10, 32);
  viz::TrainEvalSeries t = viz::train_eval_series(live);
  EXPECT_TRUE(t.empty());
  EXPECT_NE(t.note.find("Periodic evaluation is off (--eval-every 0): the first point comes where epoch 1 ends, after "
                        "iteration 32"),
            std::string::npos)
      << t.note;
  live.cfg.eval_every = 50;
  EXPECT_EQ(viz::train_eval_series(live).note,
            "The first evaluation comes after iteration 1 (then 2, 4, 8, ... and every 50), in eval and train mode.");
  const viz::RunData opened = run_with_epochs(true, 10, 32);
  EXPECT_NE(viz::train_eval_series(opened).note.find("This run directory holds no evaluation"), std::string::npos);
}

// A run directory of a run without --eval-every: its epoch ends read back at the iterations they
// ended at; an epoch record without "steps" (0) is placed after its epoch's last iteration.
TEST(VizRunDir, EpochEndsOfARunWithoutEvalEvery) {
  DTLAB_REQUIRE_DATASET();
  testutil::TempDir dir;
  const auto r = testutil::run_cli("run --model mlp --world-size 2 --batch-size 16 --limit-train 320 --limit-test 64 "
                                   "--epochs 2 --threads 1 --out " + dir.file("run"));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  viz::RunData d = viz::load_run_dir(dir.file("run"));
  EXPECT_TRUE(d.evals.empty());
  const viz::TrainEvalSeries t = viz::train_eval_series(d);
  EXPECT_EQ(t.epoch_x, (std::vector<float>{10, 20}));  // 320 / 2 / 16 = 10 per epoch
  EXPECT_EQ(t.final_train_x, (std::vector<float>{20}));
  EXPECT_EQ(d.opened_description(), "finished run, opened from " + dir.file("run") + ": 20 iterations, 2 epochs of 10 "
                                    "iterations");

  std::string metrics = testutil::read_file(dir.file("run/metrics.jsonl"));
  size_t at = 0, removed = 0;
  while ((at = metrics.find("\"steps\":", at)) != std::string::npos) {
    const size_t end = metrics.find(',', at);
    metrics.erase(at, end - at + 1);
    ++removed;
  }
  ASSERT_EQ(removed, 2u);
  testutil::write_file(dir.file("run/metrics.jsonl"), metrics);
  d = viz::load_run_dir(dir.file("run"));
  ASSERT_EQ(d.epochs.size(), 2u);
  EXPECT_EQ(d.epochs[0].steps, 10);
  EXPECT_EQ(d.epochs[1].steps, 20);
}

// --screenshot-items: the file the GUI tests read (drawn_items.h).
TEST(VizDrawnItems, WhatAFrameDrewAsJson) {
  viz::DrawnItems items;
  items.window = "Controls";
  items.add("button", "Apply##settings", false);
  items.add("value", "iteration", true, "64 / 64");
  items.window = "Views";
  const float x[] = {32, 64}, y[] = {0.75f, NAN};
  items.add_chart("te_acc", false);
  items.add_series("te_acc", "end of epoch", x, y, 2);
  std::vector<float> many(viz::DrawnItems::kMaxPoints + 1, 1.0f);
  items.add_series("ranks_loss", "rank 0", many.data(), many.data(), static_cast<int>(many.size()));
  const nlohmann::json j = items.to_json("/tmp/x.png", "traineval");
  EXPECT_EQ(j["format"], "dtlab drawn items");
  EXPECT_EQ(j["version"], 1);
  EXPECT_EQ(j["view"], "traineval");
  const nlohmann::json& it = j["items"];
  ASSERT_EQ(it.size(), 5u);
  EXPECT_EQ(it[0], (nlohmann::json{{"window", "Controls"}, {"kind", "button"}, {"label", "Apply"}, {"enabled", false}}));
  EXPECT_EQ(it[1]["value"], "64 / 64");
  EXPECT_EQ(it[2]["empty"], false);
  EXPECT_EQ(it[3]["window"], "Views");
  EXPECT_EQ(it[3]["x"], (nlohmann::json{32.0, 64.0}));
  EXPECT_TRUE(it[3]["y"][1].is_null()) << "NaN has no JSON number";
  EXPECT_EQ(it[4]["n"], viz::DrawnItems::kMaxPoints + 1);
  EXPECT_FALSE(it[4].contains("x")) << "long series: only their length";
  EXPECT_EQ(viz::drawn_items_path("/tmp/shot-traineval.png"), "/tmp/shot-traineval.items.json");
  EXPECT_EQ(viz::drawn_items_path("shot"), "shot.items.json");
}
