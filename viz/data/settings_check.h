// What the controls panel says about a combination of settings before it is run: errors (the run
// would be refused: greyed-out Apply, with the reason), warnings (it runs into a known failure,
// e.g. a BatchNorm batch of one) and notes (a setting has no effect, e.g. sync BN with one rank:
// lab::ineffective_settings, the rules the CLI warns with).
// And, per choice (a radio button, a checkbox), whether the controls grey it out and why: the
// rules are here as data, the panel only asks. Plain logic over RunConfig, no GUI, so it is
// unit-tested.
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

// Choices: a setting by its RunConfig name and the value it would get, as the flag's text
// ("mode" "dp", "allreduce" "mpi", "bn" "sync", "sampler_drop_last" "true", "average_every" "4").
// Sets it in c; false for a setting the controls do not offer or a value that does not parse.
bool apply_choice(lab::RunConfig& c, const std::string& setting, const std::string& value);
// A setting's value as the flag's text ("ddp", "true", "4"); "" for a setting the controls do not offer.
std::string setting_value(const lab::RunConfig& c, const std::string& setting);

// Why the controls grey out a choice for the configuration being edited ("" when it can be
// chosen): what lab::validate would reject after the change (in its words, with its hint), what
// the lab window cannot run (allreduce mpi: ranks as processes), and settings that have no
// effect in this configuration (lab::no_effect_reason, lab/core/config_effects.h: the rules the
// CLI and `dtlab lesson check` apply too). A choice is not blamed for a problem the configuration
// already has.
std::string unavailable_reason(const lab::RunConfig& c, const std::string& setting, const std::string& value);

// Short words for headers and the log: "DDP, 4 ranks, ring allreduce", "DataParallel, 4 devices",
// "local SGD every 4 (warm-up 0), 4 ranks, tree allreduce"; "batch 32/rank", "batch 64 (global)".
std::string describe_parallelism(const lab::RunConfig& c);
std::string describe_batch(const lab::RunConfig& c);

// The first check about `setting` at or above `min` severity, or nullptr.
const SettingCheck* find_check(const std::vector<SettingCheck>& checks, const std::string& setting, Severity min);

// Training samples a configuration uses: limit_train when set (capped at the full size).
int64_t train_samples(const lab::RunConfig& c, int64_t full_size);

// Fashion-MNIST's sizes, for configurations whose data is not loaded (yet).
constexpr int64_t kFashionTrainSize = 60000;
constexpr int64_t kFashionTestSize = 10000;

}  // namespace viz
