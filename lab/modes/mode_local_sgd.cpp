// --mode local-sgd: local SGD with periodic model averaging (local_sgd.h for the mechanics), as
// PyTorch 1.13 runs post-local SGD: DDP with the post_localSGD hook and a PeriodicModelAverager.
// One rank's iteration is DDP's (mode_ddp.h) with two changes:
//   - the backward allreduces gradients only during the warm-up (--warmup-steps), and the hook
//     divides the bucket by the world size (tensor.div_) instead of DDP's multiplication;
//   - after the optimizer step, the averager averages the parameters every --average-every steps;
//     the step record carries the rank's drift from the average before it.
// This is the smallest real mode: the worked example of lab/modes/README.md.
#include "local_sgd.h"
#include "mode_ddp.h"
#include "run.h"

namespace lab {

namespace {

class LocalSgdRank : public DdpRank {
 public:
  explicit LocalSgdRank(RankEnv& env) : DdpRank(env), m_averager(env.cfg.average_every, env.cfg.warmup_steps) {
    m_reducer.set_divide_in_hook(true);  // the post-localSGD hook divides the bucket
  }
  void save(ModeCheckpoint& mc) const override {
    DdpRank::save(mc);
    mc.counters["averager_step"] = m_averager.step();
  }
  void restore(const ModeCheckpoint& mc, int64_t epochs_done) override {
    DdpRank::restore(mc, epochs_done);
    m_averager.set_step(mc.counters.at("averager_step").get<int64_t>());
  }

 protected:
  bool allreduces(int64_t step) const override { return post_local_sgd_allreduces(step, m_env.cfg.warmup_steps); }
  // PeriodicModelAverager.average_parameters after every optimizer step.
  double after_optimizer_step() override { return m_averager.average_parameters(m_env.model, m_env.comm); }

 private:
  PeriodicModelAverager m_averager;
};

class LocalSgdMode : public ParallelMode {
 public:
  const char* name() const override { return "local-sgd"; }
  const char* title() const override { return "local SGD (post-localSGD hook + PeriodicModelAverager)"; }
  const char* help() const override { return "periodic model averaging"; }
  const char* about() const override {
    return "Local SGD (post-localSGD hook + PeriodicModelAverager): gradients are allreduced for warmup_steps "
           "iterations, then every rank steps on its own gradients and the parameters are averaged every "
           "average_every iterations. Less communication; the replicas drift apart in between.";
  }
  ModeCaps caps() const override {
    ModeCaps k;
    k.gradient_allreduce = k.sync_bn = k.buffer_broadcast = k.skip_step = k.checkpoints = true;
    k.fail_at_allreduce = k.averages_parameters = k.own_parameters = true;
    return k;
  }
  std::vector<ModeSetting> settings() const override {
    ModeSetting every;
    every.field = "average_every";
    every.flag = "--average-every";
    every.label = "average_every";
    every.pytorch = "PeriodicModelAverager";
    every.min = 1;
    every.help = "PeriodicModelAverager(period): average the parameters after every this many optimizer steps.";
    ModeSetting warmup;
    warmup.field = "warmup_steps";
    warmup.flag = "--warmup-steps";
    warmup.label = "warmup_steps";
    warmup.pytorch = "PeriodicModelAverager";
    warmup.min = 0;
    warmup.help = "Iterations that allreduce gradients as plain DDP does before local SGD starts (the hook's "
                  "start_localSGD_iter and the averager's warmup_steps).";
    return {every, warmup};
  }
  // PyTorch's own wording (PeriodicModelAverager); checked whatever the mode, as a value.
  void validate_settings(const RunConfig& c) const override {
    if (c.average_every < 1) throw ConfigError("Arg ``period`` must be a positive value.", "--average-every must be >= 1");
    if (c.warmup_steps < 0)
      throw ConfigError("Arg ``warmup_steps`` must be a non-negative number.", "--warmup-steps must be >= 0");
  }
  void validate(const RunConfig& c) const override {
    if (c.uneven_data || c.join)
      throw ConfigError("--uneven-data and --join apply to --mode ddp",
                        "PeriodicModelAverager is not Joinable in PyTorch 1.13: a finished rank cannot shadow the "
                        "parameter averaging");
  }
  std::string no_effect_reason(const RunConfig& c, const std::string& setting) const override {
    if ((setting == "overlap" || setting == "bucket_cap_mb") && c.world_size > 1 && c.warmup_steps == 0)
      return "--mode local-sgd with --warmup-steps 0 never allreduces gradients (it averages parameters instead)";
    if ((setting == "average_every" || setting == "warmup_steps") && c.world_size == 1)
      return "with one rank there is nothing to average and no gradient to allreduce";
    const int64_t at = c.fail_step < 0 ? 0 : c.fail_step;
    if (setting == "fail_at" && c.fail_at == "allreduce" && at >= c.warmup_steps)
      return "--mode local-sgd allreduces gradients only in its first --warmup-steps " + std::to_string(c.warmup_steps) +
             " iterations, not in iteration " + std::to_string(at);
    return "";
  }
  std::string describe(const RunConfig& c) const override {
    return "local SGD every " + std::to_string(c.average_every) + " (warm-up " + std::to_string(c.warmup_steps) + "), " +
           std::to_string(c.world_size) + (c.world_size == 1 ? " rank" : " ranks") +
           (c.world_size > 1 ? ", " + c.allreduce + " allreduce" : "");
  }
  std::string header(const RunConfig& c) const override {
    return " average_every=" + std::to_string(c.average_every) + " warmup_steps=" + std::to_string(c.warmup_steps);
  }
  std::unique_ptr<RankMode> make_rank(RankEnv& env) const override { return std::make_unique<LocalSgdRank>(env); }
  std::vector<std::pair<std::string, std::string>> notes(const RunConfig& c, int64_t steps_total) const override {
    if (c.world_size < 2) return {};
    if (c.warmup_steps >= steps_total)
      return {{"warmup_steps", "warmup_steps " + std::to_string(c.warmup_steps) + " covers all " +
                                   std::to_string(steps_total) +
                                   " iterations: every step allreduces gradients and the parameters are never averaged "
                                   "(plain DDP)"}};
    return {{"average_every", "gradients are allreduced in iterations 0 to " + std::to_string(c.warmup_steps - 1) +
                                  (c.warmup_steps == 0 ? " (none)" : "") + "; after that each rank steps on its own and "
                                  "the parameters are averaged after iterations " + std::to_string(c.warmup_steps) + ", " +
                                  std::to_string(c.warmup_steps + c.average_every) + ", " +
                                  std::to_string(c.warmup_steps + 2 * c.average_every) + ", ..."}};
  }
  SyncCollectives sync_collectives() const override { return {"allreduce", {"grad bucket", "param average"}}; }
  void summary(const SummaryEnv& env, nlohmann::json& j) const override {
    ddp_summary(env, j);
    nlohmann::json av = nlohmann::json::array();
    for (const auto& [st, d] : env.summary.drift) av.push_back({{"step", st}, {"drift", d}});
    j["local_sgd"] = {{"average_every", env.cfg.average_every}, {"warmup_steps", env.cfg.warmup_steps},
                      {"averagings", env.summary.drift.size()}, {"drift_max", env.summary.drift_max},
                      {"drift_mean", env.summary.drift_mean}, {"per_averaging", av},
                      {"ranks_with_different_parameters", env.ranks_with_own_parameters},
                      {"what", "drift: before an averaging, the largest L2 distance between a rank's "
                               "parameters and their average"}};
  }
  std::vector<std::string> summary_lines(const RunConfig& c, const RunSummary& s) const override {
    (void)c;
    char buf[200];
    std::snprintf(buf, sizeof buf, "local SGD: %zu averagings; replica drift before averaging (L2 to the average): max %.4g, mean %.4g",
                  s.drift.size(), s.drift_max, s.drift_mean);
    return {buf};
  }
};

}  // namespace

std::unique_ptr<ParallelMode> make_local_sgd_mode() { return std::make_unique<LocalSgdMode>(); }

}  // namespace lab
