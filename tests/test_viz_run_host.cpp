// The run host (viz/data/run_host.h): the window's training run on threads nicer than its own,
// stepped one iteration at a time, stopped without waiting, a missing dataset as a failed run.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <set>
#include <string>
#include <thread>

#include "errors.h"
#include "run_host.h"
#include "test_util.h"

namespace {

template <class F>
bool wait_for(F&& ok, double seconds) {
  const auto t0 = std::chrono::steady_clock::now();
  while (!ok()) {
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > seconds) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

}  // namespace

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
