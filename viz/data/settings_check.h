// What the controls panel says about a combination of settings before it is run: errors (the run
// would be refused: greyed-out Apply, with the reason), warnings (it runs into a known failure,
// e.g. a BatchNorm batch of one) and notes (a setting has no effect, e.g. sync BN with one rank).
// Plain logic over RunConfig, no GUI, so it is unit-tested.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "config.h"

namespace viz {

enum class Severity { Note, Warning, Error };

struct SettingCheck {
  Severity severity = Severity::Note;
  std::string setting;  // which control it is about: "batch_size", "bn", "broadcast_buffers", ...
  std::string message;
};

// dataset_size: training samples the run will use (after --limit-train).
std::vector<SettingCheck> check_settings(const lab::RunConfig& c, int64_t dataset_size);

// The first check about `setting` at or above `min` severity, or nullptr.
const SettingCheck* find_check(const std::vector<SettingCheck>& checks, const std::string& setting, Severity min);

// Training samples a configuration uses: limit_train when set (capped at the full size).
int64_t train_samples(const lab::RunConfig& c, int64_t full_size);

// Fashion-MNIST's sizes, for configurations whose data is not loaded (yet).
constexpr int64_t kFashionTrainSize = 60000;
constexpr int64_t kFashionTestSize = 10000;

}  // namespace viz
