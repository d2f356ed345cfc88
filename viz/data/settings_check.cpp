#include "settings_check.h"

#include <algorithm>
#include <cstdlib>
#include <type_traits>

#include "batching_model.h"
#include "config_effects.h"
#include "data_parallel.h"
#include "errors.h"
#include "mode.h"
#include "sampler.h"

namespace viz {

namespace {

// The setting a validate() message is about, from the words it uses (the most specific first).
std::string setting_of(const std::string& msg) {
  static const char* const kWords[][2] = {
      {"SyncBatchNorm", "bn"},          {"--sampler-drop-last", "sampler_drop_last"},
      {"``period``", "average_every"},  {"``warmup_steps``", "warmup_steps"},
      {"--no-sync-steps", "no_sync_steps"}, {"--allreduce", "allreduce"},
      {"--mode", "mode"},               {"Nesterov", "nesterov"},
      {"batch_size", "batch_size"},     {"--world-size", "world_size"},
      {"--model", "model"},             {"--bn", "bn"},
      {"learning rate", "lr"},          {"momentum", "momentum"},
      {"--epochs", "epochs"}};
  for (const auto& w : kWords)
    if (msg.find(w[0]) != std::string::npos) return w[1];
  return "";
}

std::string list(const std::vector<int64_t>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s;
}

// BatchNorm fails on one value per channel: the mlp's BatchNorm1d sees one per sample, the cnn's
// BatchNorm2d 28 x 28 or 14 x 14 per sample, so a batch of one fails only in the mlp.
bool batch_of_one_fails(const lab::RunConfig& c) { return c.model == "mlp"; }

// --mode dp: one DataLoader of global batches, each split over the devices as torch.chunk
// (lab/modes/data_parallel.h). Appends its checks; false when the run would be refused.
bool check_data_parallel(const lab::RunConfig& c, int64_t dataset_size, std::vector<SettingCheck>& out) {
  const int64_t L = dataset_size, B = c.batch_size;
  const int W = c.world_size;
  const int64_t steps = lab::batches_per_epoch(L, B, c.drop_last);
  if (steps == 0) {
    out.push_back({Severity::Error, "batch_size",
                   "no training step: DataParallel's one DataLoader has " + std::to_string(L) +
                       " samples, fewer than batch_size " + std::to_string(B) + " with drop_last"});
    return false;
  }
  const std::vector<int64_t> full = lab::torch_chunk_sizes(B, W);
  out.push_back({Severity::Note, "batch_size",
                 "with DataParallel batch_size is the global batch: torch.chunk splits " + std::to_string(B) +
                     " over " + std::to_string(W) + " device(s) as " + list(full)});
  if (static_cast<int>(full.size()) < W)
    out.push_back({Severity::Note, "batch_size",
                   "torch.chunk makes " + std::to_string(full.size()) + " chunk(s) of " + std::to_string(B) +
                       ": device(s) " + std::to_string(full.size()) + " to " + std::to_string(W - 1) +
                       " idle every iteration"});
  const int64_t last = c.drop_last ? 0 : L % B;
  const std::vector<int64_t> tail = last > 0 ? lab::torch_chunk_sizes(last, W) : std::vector<int64_t>{};
  if (batch_of_one_fails(c)) {
    auto one = [](const std::vector<int64_t>& v) { return std::find(v.begin(), v.end(), 1) - v.begin(); };
    const auto in_full = one(full), in_tail = one(tail);
    const std::string bn_error = ": BatchNorm in training mode needs more than one value per channel and fails with "
                                 "\"Expected more than 1 value per channel when training\". Fix: another batch size";
    if (in_full < static_cast<std::ptrdiff_t>(full.size()))
      out.push_back({Severity::Warning, "batch_size",
                     "every iteration device " + std::to_string(in_full) + "'s chunk holds 1 sample (" + list(full) +
                         ")" + bn_error});
    else if (in_tail < static_cast<std::ptrdiff_t>(tail.size()))
      out.push_back({Severity::Warning, "batch_size",
                     "the last batch of each epoch holds " + std::to_string(last) + " samples (" + std::to_string(L) +
                         " mod " + std::to_string(B) + "), chunked " + list(tail) + ": device " +
                         std::to_string(in_tail) + " gets 1 sample" + bn_error + ", or drop_last"});
  }
  if (c.drop_last && L % B > 0)
    out.push_back({Severity::Note, "drop_last",
                   "the loader drops the last " + std::to_string(L % B) + " sample(s) every epoch"});
  return true;
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
  // a setting changed from its default that will not apply (lab/core/config_effects.h: the CLI
  // warns about the same ones, in the same words); validate() has refused the others
  for (const lab::IneffectiveSetting& e : lab::ineffective_settings(c))
    out.push_back({Severity::Note, e.setting, e.message()});
  if (lab::mode_of(c).caps().global_batch) {  // DataParallel's one loader and torch.chunk
    check_data_parallel(c, dataset_size, out);
    return out;
  }
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
  if (one.empty() && l.last_batch == 1 && c.bn == "sync" && c.world_size > 1 && batch_of_one_fails(c))
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
  const int64_t by_epochs = c.epochs > 0 ? l.steps * c.epochs : c.steps;  // the first limit reached (run.h)
  const int64_t total = c.steps > 0 ? std::min(c.steps, by_epochs) : by_epochs;
  for (const auto& [setting, note] : lab::mode_of(c).notes(c, total)) out.push_back({Severity::Note, setting, note});
  return out;
}

std::string describe_parallelism(const lab::RunConfig& c) { return lab::mode_of(c).describe(c); }

std::string describe_batch(const lab::RunConfig& c) {
  const lab::ModeCaps k = lab::mode_of(c).caps();
  if (k.micro_batches) return "batch " + std::to_string(c.batch_size) + " in " + std::to_string(c.microbatches) + " micro-batches";
  if (k.one_loader) return "batch " + std::to_string(c.batch_size) + " on every rank";
  return "batch " + std::to_string(c.batch_size) + (k.global_batch ? " (global)" : "/rank");
}

const SettingCheck* find_check(const std::vector<SettingCheck>& checks, const std::string& setting, Severity min) {
  for (const SettingCheck& c : checks)
    if (c.setting == setting && static_cast<int>(c.severity) >= static_cast<int>(min)) return &c;
  return nullptr;
}

bool apply_choice(lab::RunConfig& c, const std::string& setting, const std::string& value) {
  auto boolean = [&](bool& dst) {
    if (value != "true" && value != "false") return false;
    dst = value == "true";
    return true;
  };
  auto integer = [&](auto& dst) {
    char* end = nullptr;
    const long long v = std::strtoll(value.c_str(), &end, 10);
    if (value.empty() || *end) return false;
    dst = static_cast<std::remove_reference_t<decltype(dst)>>(v);
    return true;
  };
  if (setting == "model") c.model = value;
  else if (setting == "bn") c.bn = value;
  else if (setting == "mode") c.mode = value;
  else if (setting == "allreduce") c.allreduce = value;
  else if (setting == "optimizer") c.optimizer = value;
  else if (setting == "broadcast_buffers") return boolean(c.broadcast_buffers);
  else if (setting == "drop_last") return boolean(c.drop_last);
  else if (setting == "sampler_drop_last") return boolean(c.sampler_drop_last);
  else if (setting == "shuffle") return boolean(c.shuffle);
  else if (setting == "overlap") return boolean(c.overlap);
  else if (setting == "parameters_as_bucket_view") return boolean(c.parameters_as_bucket_view);
  else if (setting == "sharding_strategy") c.sharding_strategy = value;
  else if (setting == "fsdp_wrap") c.fsdp_wrap = value;
  else if (setting == "schedule") c.schedule = value;
  else if (setting == "balance") c.balance = value;
  else if (setting == "stages") return integer(c.stages);
  else if (setting == "microbatches") return integer(c.microbatches);
  else if (setting == "dp") return integer(c.dp);
  else if (setting == "deferred_batch_norm") return boolean(c.deferred_batch_norm);
  else if (setting == "tp") return integer(c.tp);
  else if (setting == "batchnorm") return boolean(c.batchnorm);
  else if (setting == "world_size") return integer(c.world_size);
  else if (setting == "batch_size") return integer(c.batch_size);
  else if (setting == "average_every") return integer(c.average_every);
  else if (setting == "warmup_steps") return integer(c.warmup_steps);
  else if (setting == "no_sync_steps") return integer(c.no_sync_steps);
  else if (setting == "async_schedule") c.async_schedule = value;
  else if (setting == "async_seed") return integer(c.async_seed);
  else return false;
  return true;
}

std::string setting_value(const lab::RunConfig& c, const std::string& setting) {
  auto b = [](bool v) { return std::string(v ? "true" : "false"); };
  if (setting == "model") return c.model;
  if (setting == "bn") return c.bn;
  if (setting == "mode") return c.mode;
  if (setting == "allreduce") return c.allreduce;
  if (setting == "optimizer") return c.optimizer;
  if (setting == "broadcast_buffers") return b(c.broadcast_buffers);
  if (setting == "drop_last") return b(c.drop_last);
  if (setting == "sampler_drop_last") return b(c.sampler_drop_last);
  if (setting == "shuffle") return b(c.shuffle);
  if (setting == "overlap") return b(c.overlap);
  if (setting == "parameters_as_bucket_view") return b(c.parameters_as_bucket_view);
  if (setting == "sharding_strategy") return c.sharding_strategy;
  if (setting == "fsdp_wrap") return c.fsdp_wrap;
  if (setting == "schedule") return c.schedule;
  if (setting == "balance") return c.balance;
  if (setting == "stages") return std::to_string(c.stages);
  if (setting == "microbatches") return std::to_string(c.microbatches);
  if (setting == "dp") return std::to_string(c.dp);
  if (setting == "deferred_batch_norm") return b(c.deferred_batch_norm);
  if (setting == "tp") return std::to_string(c.tp);
  if (setting == "batchnorm") return b(c.batchnorm);
  if (setting == "world_size") return std::to_string(c.world_size);
  if (setting == "batch_size") return std::to_string(c.batch_size);
  if (setting == "average_every") return std::to_string(c.average_every);
  if (setting == "warmup_steps") return std::to_string(c.warmup_steps);
  if (setting == "no_sync_steps") return std::to_string(c.no_sync_steps);
  if (setting == "async_schedule") return c.async_schedule;
  if (setting == "async_seed") return std::to_string(c.async_seed);
  return "";
}

std::string unavailable_reason(const lab::RunConfig& c, const std::string& setting, const std::string& value) {
  const std::string none = lab::no_effect_reason(c, setting);
  if (!none.empty()) return none;
  lab::RunConfig changed = c;
  if (!apply_choice(changed, setting, value)) return "not a setting the lab window offers: " + setting + " " + value;
  if (setting == "allreduce" && value == "mpi" && c.comm != "mpi")
    return "mpi is the MPI library's own allreduce: it needs ranks as processes under mpirun (dtlab run --comm mpi); "
           "the lab window runs emulated ranks, threads in one process";
  auto problem = [](const lab::RunConfig& x) -> std::string {
    try {
      lab::validate(x);
    } catch (const lab::Error& e) {
      return e.hint().empty() ? e.what() : std::string(e.what()) + " (" + e.hint() + ")";
    }
    return "";
  };
  const std::string after = problem(changed);
  if (after.empty() || after == problem(c)) return "";
  return after;
}

}  // namespace viz
