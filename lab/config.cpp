#include "config.h"

#include <cmath>
#include <fstream>
#include <sstream>

#define TOML_EXCEPTIONS 1
#include <toml++/toml.h>

#include "errors.h"

namespace lab {

std::string bn_momentum_str(const std::optional<double>& m) {
  if (!m) return "none";
  std::ostringstream s;
  s << *m;
  return s.str();
}

void validate(const RunConfig& c) {
  if (c.model != "mlp" && c.model != "cnn")
    throw ConfigError("--model: unknown model '" + c.model + "'", "choose mlp or cnn");
  if (c.world_size < 1)
    throw ConfigError("--world-size: the world size must be at least 1, got " + std::to_string(c.world_size));
  if (c.world_size > kMaxWorldSize)
    throw ConfigError("--world-size: at most " + std::to_string(kMaxWorldSize) + " ranks are supported, got " +
                      std::to_string(c.world_size));
  if (c.batch_size <= 0)
    throw ConfigError("batch_size should be a positive integer value, but got batch_size=" +
                          std::to_string(c.batch_size),
                      "--batch-size is the per-rank batch size; the global batch is world_size x batch_size");
  if (c.eval_batch_size <= 0)
    throw ConfigError("--eval-batch-size must be positive, got " + std::to_string(c.eval_batch_size));
  if (c.eval_every < 0) throw ConfigError("--eval-every must be >= 0 (0: off), got " + std::to_string(c.eval_every));
  if (c.eval_samples < 1) throw ConfigError("--eval-samples must be at least 1, got " + std::to_string(c.eval_samples));
  if (c.bn != "local" && c.bn != "sync")
    throw ConfigError("--bn: unknown mode '" + c.bn + "'", "local: per-rank statistics (DDP with BatchNorm); "
                                                           "sync: SyncBatchNorm (global statistics)");
  if (c.comm != "threads")
    throw ConfigError("--comm: unknown transport '" + c.comm + "'", "this build supports: threads");
  if (c.epochs < 1 && c.steps <= 0)
    throw ConfigError("--epochs must be at least 1, got " + std::to_string(c.epochs));
  if (c.steps < 0) throw ConfigError("--steps must be >= 0, got " + std::to_string(c.steps));
  if (!(c.lr >= 0) || !std::isfinite(c.lr)) throw ConfigError("Invalid learning rate: " + std::to_string(c.lr));
  if (!(c.momentum >= 0)) throw ConfigError("Invalid momentum value: " + std::to_string(c.momentum));
  if (!(c.weight_decay >= 0)) throw ConfigError("Invalid weight_decay value: " + std::to_string(c.weight_decay));
  if (c.nesterov && c.momentum <= 0)
    throw ConfigError("Nesterov momentum requires a momentum and zero dampening", "pass --momentum > 0");
  if (c.bn_momentum && (*c.bn_momentum < 0 || *c.bn_momentum > 1))
    throw ConfigError("--bn-momentum must be in [0, 1] or 'none', got " + bn_momentum_str(c.bn_momentum));
  if (!(c.bn_eps > 0)) throw ConfigError("--bn-eps must be positive");
  if (!(c.bucket_cap_mb > 0)) throw ConfigError("--bucket-cap-mb must be positive");
  if (!(c.timeout_s > 0)) throw ConfigError("--timeout must be positive (seconds)");
  if (c.threads < 0) throw ConfigError("--threads must be >= 0 (0: one per core)");
  if (c.limit_train < 0 || c.limit_test < 0) throw ConfigError("--limit-train/--limit-test must be >= 0");
  if (c.fail_rank >= c.world_size)
    throw ConfigError("Invalid rank " + std::to_string(c.fail_rank) + ", rank should be in the interval [0, " +
                      std::to_string(c.world_size - 1) + "]",
                      "--fail-rank names the rank that fails");
  if (c.fail_at != "forward" && c.fail_at != "backward" && c.fail_at != "allreduce" && c.fail_at != "hang")
    throw ConfigError("--fail-at: unknown point '" + c.fail_at + "'", "choose forward, backward, allreduce or hang");
}

namespace {

std::string q(const std::string& s) {
  std::string out = "\"";
  for (char ch : s) {
    if (ch == '"' || ch == '\\') out += '\\';
    out += ch;
  }
  return out + "\"";
}
std::string b(bool v) { return v ? "true" : "false"; }
std::string d(double v) {
  std::ostringstream s;
  s.precision(17);
  s << v;
  std::string t = s.str();
  if (t.find_first_of(".eE") == std::string::npos && t.find("inf") == std::string::npos) t += ".0";
  return t;
}

}  // namespace

std::string to_toml(const RunConfig& c, const std::vector<std::pair<std::string, std::string>>& backends) {
  std::ostringstream o;
  o << "# dtlab run configuration (resolved). Read back by `dtlab gui --open` and lessons.\n";
  o << "format_version = " << kConfigFormatVersion << "\n";
  o << "dtlab_version = " << q(kDtlabVersion) << "\n\n";
  o << "[backends]\n";
  for (const auto& kv : backends) o << kv.first << " = " << q(kv.second) << "\n";
  o << "\n[model]\n";
  o << "model = " << q(c.model) << "\n";
  o << "bn = " << q(c.bn) << "\n";
  o << "bn_momentum = " << (c.bn_momentum ? d(*c.bn_momentum) : q("none")) << "\n";
  o << "bn_eps = " << d(c.bn_eps) << "\n";
  o << "track_running_stats = " << b(c.track_running_stats) << "\n";
  o << "\n[data]\n";
  o << "data_dir = " << q(c.data_dir) << "\n";
  o << "limit_train = " << c.limit_train << "\n";
  o << "limit_test = " << c.limit_test << "\n";
  o << "batch_size = " << c.batch_size << "\n";
  o << "shuffle = " << b(c.shuffle) << "\n";
  o << "drop_last = " << b(c.drop_last) << "\n";
  o << "sampler_drop_last = " << b(c.sampler_drop_last) << "\n";
  o << "eval_batch_size = " << c.eval_batch_size << "\n";
  o << "\n[distributed]\n";
  o << "world_size = " << c.world_size << "\n";
  o << "comm = " << q(c.comm) << "\n";
  o << "broadcast_buffers = " << b(c.broadcast_buffers) << "\n";
  o << "bucket_cap_mb = " << d(c.bucket_cap_mb) << "\n";
  o << "timeout_s = " << d(c.timeout_s) << "\n";
  o << "\n[optim]\n";
  o << "lr = " << d(c.lr) << "\n";
  o << "momentum = " << d(c.momentum) << "\n";
  o << "weight_decay = " << d(c.weight_decay) << "\n";
  o << "nesterov = " << b(c.nesterov) << "\n";
  o << "\n[schedule]\n";
  o << "epochs = " << c.epochs << "\n";
  o << "steps = " << c.steps << "\n";
  o << "seed = " << c.seed << "\n";
  o << "threads = " << c.threads << "\n";
  o << "\n[output]\n";
  o << "out_dir = " << q(c.out_dir) << "\n";
  o << "init = " << q(c.init) << "\n";
  o << "trace_steps = " << c.trace_steps << "\n";
  o << "eval_every = " << c.eval_every << "\n";
  o << "eval_samples = " << c.eval_samples << "\n";
  o << "\n[failure_injection]\n";
  o << "fail_rank = " << c.fail_rank << "\n";
  o << "fail_step = " << c.fail_step << "\n";
  o << "fail_at = " << q(c.fail_at) << "\n";
  return o.str();
}

RunConfig config_from_toml_file(const std::string& path) {
  toml::table t;
  try {
    t = toml::parse_file(path);
  } catch (const toml::parse_error& e) {
    std::ostringstream s;
    s << path << ":" << e.source().begin.line << ": " << e.description();
    throw ConfigError(s.str());
  }
  RunConfig c;
  auto fail = [&](const std::string& key, const char* want) {
    throw ConfigError(path + ": key '" + key + "' must be " + want);
  };
  for (const auto& [section_key, section_node] : t) {
    const std::string section(section_key.str());
    if (section == "format_version" || section == "dtlab_version") continue;
    const toml::table* tab = section_node.as_table();
    if (!tab) throw ConfigError(path + ": unexpected top-level key '" + section + "'");
    if (section == "backends") continue;
    for (const auto& [k, node] : *tab) {
      const std::string key = section + "." + std::string(k.str());
      auto str = [&](std::string& dst) {
        if (auto v = node.value<std::string>()) dst = *v; else fail(key, "a string");
      };
      auto i64 = [&](int64_t& dst) {
        if (auto v = node.value<int64_t>()) dst = *v; else fail(key, "an integer");
      };
      auto i32 = [&](int& dst) {
        if (auto v = node.value<int64_t>()) dst = static_cast<int>(*v); else fail(key, "an integer");
      };
      auto dbl = [&](double& dst) {
        if (auto v = node.value<double>()) dst = *v; else fail(key, "a number");
      };
      auto bln = [&](bool& dst) {
        if (auto v = node.value<bool>()) dst = *v; else fail(key, "true or false");
      };
      if (key == "model.model") str(c.model);
      else if (key == "model.bn") str(c.bn);
      else if (key == "model.bn_momentum") {
        if (auto v = node.value<double>()) c.bn_momentum = *v;
        else if (auto s = node.value<std::string>(); s && *s == "none") c.bn_momentum.reset();
        else fail(key, "a number or \"none\"");
      } else if (key == "model.bn_eps") dbl(c.bn_eps);
      else if (key == "model.track_running_stats") bln(c.track_running_stats);
      else if (key == "data.data_dir") str(c.data_dir);
      else if (key == "data.limit_train") i64(c.limit_train);
      else if (key == "data.limit_test") i64(c.limit_test);
      else if (key == "data.batch_size") i64(c.batch_size);
      else if (key == "data.shuffle") bln(c.shuffle);
      else if (key == "data.drop_last") bln(c.drop_last);
      else if (key == "data.sampler_drop_last") bln(c.sampler_drop_last);
      else if (key == "data.eval_batch_size") i64(c.eval_batch_size);
      else if (key == "distributed.world_size") i32(c.world_size);
      else if (key == "distributed.comm") str(c.comm);
      else if (key == "distributed.broadcast_buffers") bln(c.broadcast_buffers);
      else if (key == "distributed.bucket_cap_mb") dbl(c.bucket_cap_mb);
      else if (key == "distributed.timeout_s") dbl(c.timeout_s);
      else if (key == "optim.lr") dbl(c.lr);
      else if (key == "optim.momentum") dbl(c.momentum);
      else if (key == "optim.weight_decay") dbl(c.weight_decay);
      else if (key == "optim.nesterov") bln(c.nesterov);
      else if (key == "schedule.epochs") i64(c.epochs);
      else if (key == "schedule.steps") i64(c.steps);
      else if (key == "schedule.seed") {
        int64_t s = 0;
        i64(s);
        c.seed = static_cast<uint64_t>(s);
      } else if (key == "schedule.threads") i32(c.threads);
      else if (key == "output.out_dir") str(c.out_dir);
      else if (key == "output.init") str(c.init);
      else if (key == "output.trace_steps") i64(c.trace_steps);
      else if (key == "output.eval_every") i64(c.eval_every);
      else if (key == "output.eval_samples") i64(c.eval_samples);
      else if (key == "failure_injection.fail_rank") i32(c.fail_rank);
      else if (key == "failure_injection.fail_step") i64(c.fail_step);
      else if (key == "failure_injection.fail_at") str(c.fail_at);
      else throw ConfigError(path + ": unknown key '" + key + "'");
    }
  }
  validate(c);
  return c;
}

}  // namespace lab
