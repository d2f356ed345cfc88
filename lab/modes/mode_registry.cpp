// The registry of modes (mode.h): the built-in ones, one line each, and any registered later.
#include <algorithm>
#include <mutex>

#include "errors.h"
#include "mode.h"

namespace lab {

// Each mode_<name>.cpp defines its maker.
std::unique_ptr<ParallelMode> make_ddp_mode();
std::unique_ptr<ParallelMode> make_dp_mode();
std::unique_ptr<ParallelMode> make_local_sgd_mode();
std::unique_ptr<ParallelMode> make_async_mode();
std::unique_ptr<ParallelMode> make_zero_mode();
std::unique_ptr<ParallelMode> make_fsdp_mode();
std::unique_ptr<ParallelMode> make_pipeline_mode();
std::unique_ptr<ParallelMode> make_tensor_mode();

namespace {

struct Registry {
  std::vector<std::unique_ptr<ParallelMode>> owned;
  std::vector<const ParallelMode*> list;
};

Registry& registry() {
  static Registry r = [] {
    Registry reg;
    for (auto make : {make_ddp_mode, make_dp_mode, make_local_sgd_mode, make_async_mode, make_zero_mode, make_fsdp_mode, make_pipeline_mode, make_tensor_mode}) {  // builtin_modes
      reg.owned.push_back(make());
      reg.list.push_back(reg.owned.back().get());
    }
    return reg;
  }();
  return r;
}

std::mutex g_mu;  // register_mode against readers of a registry being extended (tests)

}  // namespace

const std::vector<const ParallelMode*>& modes() { return registry().list; }

const ParallelMode* find_mode(const std::string& name) {
  for (const ParallelMode* m : modes())
    if (name == m->name()) return m;
  return nullptr;
}

std::string mode_names(const char* last_joiner) {
  std::string s;
  const auto& all = modes();
  for (size_t i = 0; i < all.size(); ++i) {
    if (i) s += i + 1 == all.size() ? std::string(" ") + last_joiner + " " : ", ";
    s += all[i]->name();
  }
  return s;
}

std::string modes_with(bool ModeCaps::*cap) {
  std::vector<std::string> names;
  for (const ParallelMode* m : modes())
    if (m->caps().*cap) names.push_back(m->name());
  std::string s;
  for (size_t i = 0; i < names.size(); ++i) s += (i ? (i + 1 == names.size() ? " and " : ", ") : "") + names[i];
  return s;
}

int64_t global_batch(const RunConfig& c) {
  const ModeCaps k = mode_of(c).caps();
  return k.global_batch ? c.batch_size : k.one_loader ? c.batch_size * std::max(1, c.dp) : c.batch_size * c.world_size;
}

bool checkpointable(const RunConfig& c) { return mode_of(c).caps().checkpoints && !c.uneven_data && !c.join; }

const ParallelMode& mode_of(const RunConfig& c) {
  if (const ParallelMode* m = find_mode(c.mode)) return *m;
  std::string hint;
  for (const ParallelMode* m : modes()) hint += (hint.empty() ? "" : "; ") + std::string(m->name()) + ": " + m->help();
  throw ConfigError("--mode: unknown mode '" + c.mode + "'", hint);
}

void register_mode(std::unique_ptr<ParallelMode> mode) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (find_mode(mode->name())) throw ConfigError(std::string("--mode ") + mode->name() + " is registered already");
  Registry& r = registry();
  r.owned.push_back(std::move(mode));
  r.list.push_back(r.owned.back().get());
}

}  // namespace lab
