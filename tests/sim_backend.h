// SimBackend: the simulated GPU (backends/sim: lab::SimExecutor, the GPU executor's protocol with
// the CPU's ops) registered as the program's device backend for the length of a test, in either of
// its protocols (host-staged, or resident as the GPU's executor is), keeping the executors it made
// (g_sim, in order; nullptr once destroyed: a run's evaluation copies go early) so that a test can
// read their counters. `dtlab run --device sim` reaches the same executor through
// backends/devices.h.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <vector>

#include "executor.h"
#include "model.h"
#include "sim/sim_executor.h"

namespace testutil {

class TrackedSim;
inline std::vector<TrackedSim*> g_sim;

class TrackedSim : public lab::SimExecutor {
 public:
  TrackedSim(lab::Model& m, bool resident) : lab::SimExecutor(m, resident) { g_sim.push_back(this); }
  ~TrackedSim() override { std::replace(g_sim.begin(), g_sim.end(), this, static_cast<TrackedSim*>(nullptr)); }
};

struct SimBackend {
  explicit SimBackend(bool resident = false) {
    g_sim.clear();
    lab::set_executor_factory([resident](lab::Model& m, const lab::ComputeOptions& opt, int) {
      EXPECT_EQ(opt.device, "sim");
      return std::make_unique<TrackedSim>(m, resident);
    });
  }
  ~SimBackend() { lab::set_executor_factory({}); }
};

}  // namespace testutil
