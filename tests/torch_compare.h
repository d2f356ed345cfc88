// Comparing a dtlab run with golden values from PyTorch training runs (tools/fixtures/gen_*.py):
// state summaries (sum, sum of |x|, chosen values per tensor), per-step losses from metrics.jsonl,
// and a RunConfig built from a fixture case. The tolerances are test_ddp.cpp's (see the reasoning
// there): float32 training for a handful of SGD steps with momentum, where the summation orders of
// the kernels and of the reductions differ.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "config.h"
#include "model.h"

namespace torchcmp {

// A value with enough digits to tell float32 neighbours apart.
inline std::string num(double x) {
  std::ostringstream o;
  o.precision(9);
  o << x;
  return o.str();
}

struct Compare {
  double max_abs = 0;
  int checked = 0;
  std::vector<std::string> mismatches;
  // |a - b| <= atol + rtol * |b|
  void check(const std::string& what, double a, double b, double atol, double rtol) {
    const double d = std::fabs(a - b);
    max_abs = std::max(max_abs, d);
    ++checked;
    if (!(d <= atol + rtol * std::fabs(b)) && mismatches.size() < 10)
      mismatches.push_back(what + ": dtlab " + num(a) + " torch " + num(b) + " |diff| " + num(d));
  }
  ::testing::AssertionResult ok() const {
    if (mismatches.empty()) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << "max |diff| " << max_abs << "; first mismatches:\n"
                                         << ::testing::PrintToString(mismatches);
  }
};

// A model's parameters and buffers against common.state_summary(); `scale` widens the tolerances.
inline void compare_state(lab::Model& m, const nlohmann::json& state, Compare& cmp, const std::string& who,
                          double scale = 1.0) {
  for (const auto& e : m.state_dict()) {
    ASSERT_TRUE(state.contains(e.name)) << e.name;
    const auto& s = state[e.name];
    if (e.buffer && e.buffer->is_int64) {
      EXPECT_EQ(e.buffer->i64, s["int"].get<int64_t>()) << who << " " << e.name;
      continue;
    }
    const std::vector<float>& v = e.param ? e.param->value.data : e.buffer->value.data;
    double sum = 0, abs_sum = 0;
    for (float x : v) {
      sum += x;
      abs_sum += std::fabs(x);
    }
    const double n = std::sqrt(static_cast<double>(v.size()));
    cmp.check(who + " " + e.name + " abs_sum", abs_sum, s["abs_sum"].get<double>(), scale * 1e-4 * n, scale * 1e-4);
    cmp.check(who + " " + e.name + " sum", sum, s["sum"].get<double>(),
              scale * (2e-5 * n + 1e-4 * s["abs_sum"].get<double>() / n), scale * 1e-4);
    for (const auto& iv : s["values"]) {
      const size_t i = iv[0].get<size_t>();
      cmp.check(who + " " + e.name + "[" + std::to_string(i) + "]", v[i], iv[1].get<double>(), scale * 5e-5,
                scale * 1e-3);
    }
  }
}

// The step lines of metrics.jsonl per rank, in step order.
inline std::vector<std::vector<nlohmann::json>> read_steps(const std::string& path, int world) {
  std::vector<std::vector<nlohmann::json>> steps(static_cast<size_t>(world));
  std::ifstream f(path);
  std::string line;
  while (std::getline(f, line)) {
    auto j = nlohmann::json::parse(line);
    if (j["kind"] == "step") steps[j["rank"].get<size_t>()].push_back(std::move(j));
  }
  return steps;
}

// The training settings every fixture generator shares, and a case's data and schedule.
inline lab::RunConfig config_for(const nlohmann::json& fx, const nlohmann::json& c, const std::string& out) {
  lab::RunConfig cfg;
  cfg.model = c["model"];
  cfg.world_size = c.contains("world_size") ? c["world_size"].get<int>() : c["devices"].get<int>();
  cfg.batch_size = c["batch_size"];
  cfg.limit_train = c["limit_train"];
  cfg.limit_test = c.value("limit_test", int64_t{64});
  cfg.steps = c["steps"];
  // a case without epochs trains its steps (as --steps alone does); with both, the first limit wins
  cfg.epochs = c.value("epochs", cfg.steps > 0 ? int64_t{0} : int64_t{1});
  cfg.broadcast_buffers = c.value("broadcast_buffers", true);
  cfg.lr = fx["lr"];
  cfg.momentum = fx["momentum"];
  cfg.weight_decay = fx["weight_decay"];
  cfg.seed = fx["seed"];
  cfg.threads = 1;
  cfg.out_dir = out;
  cfg.timeout_s = 30;
  return cfg;
}

}  // namespace torchcmp
