#include "settings_check.h"

#include "batching_model.h"
#include "errors.h"
#include "sampler.h"

namespace viz {

namespace {

// The setting a validate() message is about, from the flag it names.
std::string setting_of(const std::string& msg) {
  static const char* const kFlags[][2] = {
      {"batch_size", "batch_size"}, {"--world-size", "world_size"}, {"--model", "model"}, {"--bn", "bn"},
      {"learning rate", "lr"},      {"momentum", "momentum"},       {"--epochs", "epochs"}, {"Nesterov", "nesterov"}};
  for (const auto& f : kFlags)
    if (msg.find(f[0]) != std::string::npos) return f[1];
  return "";
}

}  // namespace

int64_t train_samples(const lab::RunConfig& c, int64_t full_size) {
  return c.limit_train > 0 && c.limit_train < full_size ? c.limit_train : full_size;
}

std::vector<SettingCheck> check_settings(const lab::RunConfig& c, int64_t dataset_size) {
  std::vector<SettingCheck> out;
  try {
    lab::validate(c);
  } catch (const lab::Error& e) {
    out.push_back({Severity::Error, setting_of(e.what()), e.what()});
    return out;
  }
  if (c.world_size == 1 && c.bn == "sync")
    out.push_back({Severity::Note, "bn",
                   "sync BN with world size 1 has no effect: the global batch is the only rank's batch"});
  if (c.world_size == 1 && !c.broadcast_buffers)
    out.push_back({Severity::Note, "broadcast_buffers", "broadcast_buffers has no effect with one rank"});
  EpochLayout l;
  try {
    l = layout_epoch(c, dataset_size, 0);
  } catch (const lab::Error& e) {
    out.push_back({Severity::Error, "batch_size", e.what()});
    return out;
  }
  if (l.steps == 0) {
    out.push_back({Severity::Error, "batch_size",
                   "no training step: each rank gets " + std::to_string(l.num_samples) +
                       " samples, fewer than batch_size " + std::to_string(c.batch_size) + " with drop_last"});
    return out;
  }
  const std::string one = batch_of_one_problem(l, c);
  if (!one.empty()) out.push_back({Severity::Warning, "batch_size", one});
  if (one.empty() && l.last_batch == 1 && c.bn == "sync" && c.world_size > 1)
    out.push_back({Severity::Note, "batch_size",
                   "each rank's last batch holds 1 sample; sync BN still works: its statistics count " +
                       std::to_string(c.world_size) + " samples across the ranks"});
  if (l.padding > 0)
    out.push_back({Severity::Note, "sampler_drop_last",
                   "the sampler pads " + std::to_string(l.padding) + " position(s) with samples from the head of the "
                   "list: they are seen twice per epoch (" + std::to_string(dataset_size) + " is not a multiple of " +
                   std::to_string(c.world_size) + ")"});
  if (!l.cut_tail.empty())
    out.push_back({Severity::Note, "sampler_drop_last",
                   "the sampler's drop_last cuts " + std::to_string(l.cut_tail.size()) + " sample(s) every epoch"});
  if (l.loader_dropped > 0)
    out.push_back({Severity::Note, "drop_last",
                   "the loader drops each rank's last " + std::to_string(l.loader_dropped) + " sample(s) every epoch"});
  if (c.nesterov && c.momentum <= 0)
    out.push_back({Severity::Error, "nesterov", "Nesterov momentum requires a momentum"});
  return out;
}

const SettingCheck* find_check(const std::vector<SettingCheck>& checks, const std::string& setting, Severity min) {
  for (const SettingCheck& c : checks)
    if (c.setting == setting && static_cast<int>(c.severity) >= static_cast<int>(min)) return &c;
  return nullptr;
}

}  // namespace viz
