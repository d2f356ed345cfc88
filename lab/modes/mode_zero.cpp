// --mode zero: DistributedDataParallel with torch.distributed.optim.ZeroRedundancyOptimizer
// (ZeRO stage 1; zero.h for the partition and the parameter sync). One rank's iteration is DDP's
// (mode_ddp.h) with the optimizer step changed:
//   - the rank's optimizer is the local optimizer of its partition: it steps, and keeps state
//     for, only the parameters it owns (Optimizer::set_owned); the optimizer's state is sharded,
//     the gradients are not (every bucket is still allreduced);
//   - after a step, every rank in turn broadcasts its parameters (per parameter, or one bucket per
//     rank with --parameters-as-bucket-view). A step that is not taken (no_sync, skip-step) syncs
//     nothing, as ZeroRedundancyOptimizer.step() is then not called.
// The parameters are bitwise DDP's with the same optimizer (PyTorch 1.13 gives the same).
#include "zero.h"

#include "mode_ddp.h"
#include "model.h"
#include "mutation.h"
#include "optim.h"
#include "run.h"

namespace lab {

namespace {

class ZeroRank : public DdpRank {
 public:
  explicit ZeroRank(RankEnv& env) : DdpRank(env), m_partition(zero_partition(param_numels(env.model), env.world)) {
    std::vector<bool> owned(env.model.params().size(), false);
    for (int i : m_partition[static_cast<size_t>(env.rank)]) owned[static_cast<size_t>(i)] = true;
    env.opt.set_owned(std::move(owned));
  }
  void restore(const ModeCheckpoint& mc, int64_t epochs_done) override {
    DdpRank::restore(mc, epochs_done);
    m_steps_synced = m_env.opt.steps();
  }

 protected:
  double after_optimizer_step() override {
    if (m_env.opt.steps() == m_steps_synced) return -1.0;  // no step taken: nothing to sync
    m_steps_synced = m_env.opt.steps();
    if (mutated("zero-skips-sync")) return -1.0;  // a lesson's mutation test (mutation.h)
    zero_sync_params(m_env.model, m_env.comm, m_partition, m_env.cfg.parameters_as_bucket_view);  // its own events
    return -1.0;
  }

 private:
  const std::vector<std::vector<int>> m_partition;
  int64_t m_steps_synced = 0;
};

class ZeroMode : public ParallelMode {
 public:
  const char* name() const override { return "zero"; }
  const char* title() const override { return "DDP + ZeroRedundancyOptimizer (ZeRO-1)"; }
  const char* help() const override { return "DDP with ZeroRedundancyOptimizer, ZeRO-1"; }
  const char* about() const override {
    return "DistributedDataParallel with ZeroRedundancyOptimizer (ZeRO stage 1): gradients are allreduced as in "
           "DDP, but each rank keeps the optimizer state of, and steps, only its share of the parameters (whole "
           "parameters, largest first, each to the rank with the fewest elements so far); then every rank "
           "broadcasts the parameters it stepped. Same numbers as DDP, less optimizer memory per rank.";
  }
  int zero_stage(const RunConfig&) const override { return 1; }
  ModeCaps caps() const override {
    ModeCaps k;
    k.gradient_allreduce = k.sync_bn = k.buffer_broadcast = k.no_sync = k.skip_step = true;
    k.checkpoints = k.fail_at_allreduce = true;
    return k;
  }
  std::vector<ModeSetting> settings() const override {
    ModeSetting bucket;
    bucket.field = "parameters_as_bucket_view";
    bucket.flag = "--parameters-as-bucket-view";
    bucket.label = "parameters_as_bucket_view";
    bucket.kind = ModeSetting::Kind::Bool;
    bucket.pytorch = "ZeroRedundancyOptimizer";
    bucket.help = "ZeroRedundancyOptimizer(parameters_as_bucket_view=True): each rank's parameters live in one "
                  "flat bucket, and the sync after a step broadcasts one bucket per rank instead of one tensor per "
                  "parameter. The same bytes and the same numbers, fewer messages.";
    return {bucket};
  }
  std::string no_effect_reason(const RunConfig& c, const std::string& setting) const override {
    if (setting == "parameters_as_bucket_view" && c.world_size == 1)
      return "with one rank its optimizer owns every parameter and nothing is broadcast";
    return "";
  }
  std::string describe(const RunConfig& c) const override {
    return "ZeRO-1 (ZeroRedundancyOptimizer), " + std::to_string(c.world_size) +
           (c.world_size == 1 ? " rank" : " ranks") + (c.world_size > 1 ? ", " + c.allreduce + " allreduce" : "");
  }
  std::string header(const RunConfig& c) const override {
    return c.parameters_as_bucket_view ? " parameters_as_bucket_view" : "";
  }
  std::unique_ptr<RankMode> make_rank(RankEnv& env) const override { return std::make_unique<ZeroRank>(env); }
  SyncCollectives sync_collectives() const override { return {"", {"grad bucket", "zero params", "zero bucket"}}; }
  void summary(const SummaryEnv& env, nlohmann::json& j) const override {
    ddp_summary(env, j);
    const ModelOptions mo = model_options(env.cfg);
    const std::unique_ptr<Model> m = build_model(mo, env.cfg.seed);
    const std::vector<std::string> names = param_names(*m);
    const std::vector<int64_t> numels = param_numels(*m);
    nlohmann::json ranks = nlohmann::json::array();
    for (const std::vector<int>& mine : zero_partition(numels, env.cfg.world_size)) {
      nlohmann::json ps = nlohmann::json::array();
      int64_t total = 0;
      for (int i : mine) {
        ps.push_back(names[static_cast<size_t>(i)]);
        total += numels[static_cast<size_t>(i)];
      }
      ranks.push_back({{"parameters", ps}, {"elements", total}});
    }
    j["zero"] = {{"partition", ranks}, {"parameters_as_bucket_view", env.cfg.parameters_as_bucket_view},
                 {"what", "ZeroRedundancyOptimizer's partition: per rank, the parameters whose optimizer state it "
                          "keeps and steps (in the order they were assigned: largest first, each to the rank with "
                          "the fewest elements so far), and their elements"}};
  }
  std::vector<std::string> summary_lines(const RunConfig& c, const RunSummary& s) const override {
    (void)s;
    const std::unique_ptr<Model> m = build_model(model_options(c), c.seed);
    std::string line = "ZeroRedundancyOptimizer's partition (elements per rank):";
    for (const std::vector<int>& mine : zero_partition(param_numels(*m), c.world_size)) {
      int64_t total = 0;
      for (int i : mine) total += m->params()[static_cast<size_t>(i)]->value.numel();
      line += " " + std::to_string(total);
    }
    return {line};
  }
};

}  // namespace

std::unique_ptr<ParallelMode> make_zero_mode() { return std::make_unique<ZeroMode>(); }

}  // namespace lab
