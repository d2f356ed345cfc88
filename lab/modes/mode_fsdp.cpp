// --mode fsdp: FullyShardedDataParallel (fsdp.h for the units, shards and scaling). One rank's
// iteration, per --sharding-strategy:
//   full_shard     (ZeRO-3) each unit's flat parameter all-gathered before its forward and freed
//                  after it, gathered again before its backward (reverse order) and freed after:
//                  the same values, gathered twice; its flat gradient pre-divided, reduce-scattered
//                  and post-divided into the rank's shard; the optimizer steps the shards
//   shard_grad_op  (ZeRO-2) the same with one all-gather, before forward (kept for backward)
//   no_shard       (DDP) every rank keeps and steps the whole parameters; each unit's flat
//                  gradient is pre-divided, allreduced and post-divided
// Per unit, from module hooks (ModuleHooks, model.h) as PyTorch's FSDP does it: all-gathered just
// before the unit's first module's forward, freed after its last (full_shard) or after its
// backward (shard_grad_op); its gradient reduced as soon as the unit's backward is done, the
// unsharded gradient freed then. The model's own parameters and gradients are those unsharded
// ones, allocated only while held (memory.h counts them): between iterations a sharded rank holds
// its shards and their optimizer state only, and an evaluation gathers every unit. FSDP broadcasts no
// buffer: each rank keeps its own BatchNorm running statistics (SyncBatchNorm aside). no_sync
// (--no-sync-steps) accumulates the full, unsharded gradients without reduce-scatter, as FSDP's
// no_sync() does, while full_shard still gathers the parameters for every forward and backward.
// The numbers: the reduce-scatter's ring adds in NCCL's order (sharded_collectives.h), DDP's ring
// in gloo's, so FSDP equals DDP bitwise for two ranks and to rounding for more.
#include "fsdp.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "communicator.h"
#include "compute_segments.h"
#include "dataset.h"
#include "device.h"
#include "errors.h"
#include "mode.h"
#include "mode_ddp.h"
#include "model.h"
#include "mutation.h"
#include "optim.h"
#include "run.h"
#include "sampler.h"

namespace lab {

namespace {

// The units of the configuration's model (summary and console: a model built for its names).
std::vector<FsdpUnit> units_of(const RunConfig& c, std::vector<std::string>* names = nullptr) {
  const std::unique_ptr<Model> m = build_model(model_options(c), c.seed);
  if (names) *names = param_names(*m);
  return fsdp_units(param_names(*m), param_numels(*m), c.fsdp_wrap, c.world_size);
}

class FsdpRank : public RankMode {
 public:
  explicit FsdpRank(RankEnv& env)
      : m_env(env),
        m_sampler({env.train.size, env.world, env.rank, env.cfg.shuffle, env.cfg.seed, env.cfg.sampler_drop_last}),
        m_strategy(env.cfg.sharding_strategy),
        m_units(fsdp_units(param_names(env.model), param_numels(env.model), env.cfg.fsdp_wrap, env.world)),
        m_names(param_names(env.model)),
        m_pre(static_cast<float>(fsdp_predivide_factor(env.world))),
        m_post(static_cast<float>(env.world) / m_pre) {
    // Where each unit's modules start and end (its hooks' places), from the model's layout
    const Model::ParamLayout layout = env.model.param_layout();
    const size_t modules = layout.first.size();
    m_first_at.resize(modules);
    m_last_at.resize(modules);
    for (size_t u = 0; u < m_units.size(); ++u) {
      size_t first = modules, last = 0;
      for (int p : m_units[u].params)
        for (size_t m = 0; m < modules; ++m)
          if (p >= layout.first[m] && p < layout.first[m] + layout.count[m]) first = std::min(first, m), last = std::max(last, m);
      m_first_at[first].push_back(u);
      m_last_at[last].push_back(u);
    }
    m_hooks.before_forward = [this](size_t m) {
      if (sharded())
        for (size_t u : m_first_at[m]) gather(u, "forward");
    };
    m_hooks.after_forward = [this](size_t m) {
      if (m_strategy == "full_shard")
        for (size_t u : m_last_at[m]) free_params(u);  // resharded after forward
    };
    m_hooks.before_backward = [this](size_t m) {
      for (size_t u : m_last_at[m]) {
        if (m_strategy == "full_shard") gather(u, "backward");  // gathered again for backward
        allocate_grads(u);
      }
    };
    m_hooks.after_backward = [this](size_t m) {
      for (size_t u : m_first_at[m]) unit_backward_done(u);
    };
    if (!sharded()) return;  // no_shard: the optimizer steps the model's own parameters, as DDP's does
    // The rank's shards, which its optimizer steps
    m_shards.resize(m_units.size());
    std::vector<Param*> opt_params;
    for (size_t u = 0; u < m_units.size(); ++u) {
      const FsdpUnit& unit = m_units[u];
      Param& s = m_shards[u];
      s.name = "fsdp." + unit_name(u);
      s.value = Tensor({unit.shard}, 0.0f);
      s.grad = Tensor({unit.shard}, 0.0f);
      flatten(u, &Param::value);
      std::memcpy(s.value.ptr(), m_flat.data() + unit.shard * env.rank, static_cast<size_t>(unit.shard) * sizeof(float));
      opt_params.push_back(&s);
    }
    release(m_flat);
    env.opt.set_params(std::move(opt_params));
  }

  std::vector<std::vector<int64_t>> batches(int64_t epoch) override {
    m_sampler.set_epoch(epoch);
    return make_batches(m_sampler.indices(), m_env.cfg.batch_size, m_env.cfg.drop_last);
  }
  int64_t samples_per_epoch() const override { return m_sampler.num_samples(); }

  // A sharded rank holds only its shards between iterations: the model's whole parameters (from
  // its construction, an evaluation or the last all-gather) and gradients are freed.
  void before_step(const StepInput&) override {
    if (!sharded()) return;
    for (size_t u = 0; u < m_units.size(); ++u) {
      free_params(u);
      if (m_accumulated == 0) free_grads(u);
    }
  }

  StepCount step(const StepInput& in, StepRecord& rec) override {
    const RunConfig& c = m_env.cfg;
    Model& model = m_env.model;
    Communicator& comm = m_env.comm;
    const int64_t step = in.step;
    m_step = step;
    m_epoch = in.epoch;
    m_batch = in.batch;
    m_synced = c.no_sync_steps == 0 || step % (c.no_sync_steps + 1) == c.no_sync_steps;
    // The unit hooks (ModuleHooks): all-gathers before a unit's forward (and backward, full_shard),
    // frees after, the gradient reduction when a unit's backward is done
    model.set_hooks(&m_hooks);
    struct Unhook {
      Model& m;
      ~Unhook() { m.set_hooks(nullptr); }
    } unhook{model};
    int correct = 0;
    m_compute.begin(Phase::Forward, "forward", m_step);
    const float loss = model.forward_loss(*in.x, *in.labels, &correct);
    m_compute.end();
    m_env.memory_at("forward");
    if (m_env.faults.here(m_env.rank, step, "nan")) model.poison_loss_grad();
    m_compute.begin(Phase::Backward, "backward", m_step);
    if (c.no_sync_steps == 0 || step % (c.no_sync_steps + 1) == 0) model.zero_grad();  // no_sync accumulates
    bool first_grad = true;
    model.backward_from_loss([&](int) {
      if (first_grad) m_env.faults.check(m_env.rank, step, "backward");
      first_grad = false;
    });
    m_compute.end();
    m_env.memory_at("backward");
    m_accumulated = m_synced ? 0 : m_accumulated + 1;
    if (m_synced) comm.timed(Phase::OptimizerStep, "optimizer-step", step, [&] { m_env.opt.step(); });
    return record_step(in, rec, loss, correct, -1.0, m_synced, false, "");
  }

  // The evaluation's forward gathers the parameters, as FSDP's does (--eval-every: rank 0
  // evaluates its own model after this iteration).
  void before_evaluation() override {
    if (sharded()) gather_all();
  }
  void before_periodic_evaluation() override { before_evaluation(); }
  // The run's final weights are the gathered ones.
  void finish() override {
    if (sharded()) gather_all();
  }

  // Checkpoints: the rank's shards (its optimizer's state is the optimizer's part, by the shards'
  // names) and how many no_sync iterations have accumulated gradients (the unsharded gradients
  // themselves are the checkpoint's grad.<name>). The model's parameters are not the state of a
  // sharded rank: freed between iterations, they are gathered from the shards. No collective runs.
  void save(ModeCheckpoint& mc) const override {
    mc.counters["fsdp_accumulated"] = m_accumulated;
    if (!sharded()) return;
    mc.model_parameters = false;
    for (const Param& s : m_shards) mc.tensors.push_back(f32_tensor(s.name, s.value));
  }
  void restore(const ModeCheckpoint& mc, int64_t epochs_done) override {
    (void)epochs_done;
    m_accumulated = mc.counters.value("fsdp_accumulated", int64_t{0});
    if (!sharded()) return;
    for (Param& s : m_shards) {
      const auto it = std::find_if(mc.tensors.begin(), mc.tensors.end(), [&](const SafeTensor& t) { return t.name == s.name; });
      if (it == mc.tensors.end())
        throw IoError("the checkpoint has no '" + s.name + "' (rank " + std::to_string(m_env.rank) +
                      "'s shard of FSDP's flat parameter)");
      if (it->dtype != "F32" || it->shape != s.value.shape)
        throw IoError("the checkpoint's '" + s.name + "' is " + it->dtype + " " + shape_str(it->shape) + ", rank " +
                      std::to_string(m_env.rank) + "'s shard is F32 " + shape_str(s.value.shape) +
                      " (another --fsdp-wrap or world size?)");
      std::memcpy(s.value.ptr(), it->bytes.data(), it->bytes.size());
    }
  }

  // The shards are the parameters the rank keeps; the model's own, while a unit is gathered, are
  // gathered_parameters; its unsharded gradients (between a unit's backward and its reduce-scatter,
  // or accumulated under no_sync) and the sharded ones are gradients.
  void measure_memory(MemoryBytes& b) const override {
    b[kMemCommBuffers] += static_cast<int64_t>(m_flat.size()) * 4;
    if (!sharded()) return;
    b[kMemGatheredParameters] += b[kMemParameters];
    b[kMemParameters] = 0;
    for (const Param& s : m_shards) {
      b[kMemParameters] += s.value.numel() * 4;
      b[kMemGradients] += s.grad.numel() * 4;
    }
  }

 private:
  bool sharded() const { return m_strategy != "no_shard"; }

  std::string unit_name(size_t u) const { return m_units[u].name.empty() ? "model" : m_units[u].name; }
  static void release(std::vector<float>& v) { std::vector<float>().swap(v); }

  // The unit's flat parameter (which = &Param::value) or gradient (&Param::grad) into m_flat,
  // padded with zeros to W S (no_shard: N) elements.
  void flatten(size_t u, Tensor Param::*which) {
    const FsdpUnit& unit = m_units[u];
    const std::vector<Param*> params = m_env.model.params();
    m_flat.assign(static_cast<size_t>(sharded() ? unit.shard * m_env.world : unit.numel), 0.0f);
    size_t off = 0;
    for (int i : unit.params) {
      const Tensor& t = params[static_cast<size_t>(i)]->*which;
      std::memcpy(m_flat.data() + off, t.ptr(), t.data.size() * sizeof(float));
      off += t.data.size();
    }
  }

  // Writes a flat buffer's first N elements into the unit's parameters (which = &Param::value) or
  // gradients (&Param::grad), allocating those that were freed.
  void unflatten(size_t u, const float* flat, Tensor Param::*which) {
    const std::vector<Param*> params = m_env.model.params();
    size_t off = 0;
    for (int i : m_units[u].params) {
      Tensor& v = params[static_cast<size_t>(i)]->*which;
      v.data.resize(static_cast<size_t>(Tensor::numel_of(v.shape)));
      std::memcpy(v.ptr(), flat + off, v.data.size() * sizeof(float));
      off += v.data.size();
    }
  }

  // The unit's whole parameters from the ranks' shards, into the model's (allocated again); pass:
  // "forward" or "backward", the memory point's name (nullptr: an evaluation's, between iterations).
  void gather(size_t u, const char* pass) {
    const FsdpUnit& unit = m_units[u];
    m_flat.assign(static_cast<size_t>(unit.shard * m_env.world), 0.0f);
    std::memcpy(m_flat.data() + unit.shard * m_env.rank, m_shards[u].value.ptr(),
                static_cast<size_t>(unit.shard) * sizeof(float));
    m_compute.pause();
    m_env.comm.allgather_in_place(m_flat.data(), static_cast<size_t>(unit.shard),
                                  CollectiveInfo{"fsdp params", static_cast<int>(u)});
    m_compute.resume();
    unflatten(u, m_flat.data(), &Param::value);
    release(m_flat);  // (PyTorch gathers into the unsharded flat parameter itself: no second copy)
    m_env.model.host_changed(kStateParams);
    if (pass) m_env.memory_at(std::string(pass) + ": all-gather " + unit_name(u));
  }

  void gather_all() {
    for (size_t u = 0; u < m_units.size(); ++u) gather(u, nullptr);  // (between iterations: no point of one)
  }

  void free_params(size_t u) {
    if (m_keeps_gathered) return;
    const std::vector<Param*> params = m_env.model.params();
    for (int i : m_units[u].params) release(params[static_cast<size_t>(i)]->value.data);
  }
  void free_grads(size_t u) {
    const std::vector<Param*> params = m_env.model.params();
    for (int i : m_units[u].params) release(params[static_cast<size_t>(i)]->grad.data);
  }
  // Before a unit's backward: its unsharded gradients (zeros where they were freed; kept and
  // accumulated into under no_sync).
  void allocate_grads(size_t u) {
    const std::vector<Param*> params = m_env.model.params();
    for (int i : m_units[u].params) {
      Tensor& g = params[static_cast<size_t>(i)]->grad;
      if (g.data.empty()) g.data.assign(static_cast<size_t>(Tensor::numel_of(g.shape)), 0.0f);
    }
  }

  // A unit's backward is done: its gradients are checked, then (a synchronized iteration) padded,
  // pre-divided, reduce-scattered (no_shard: allreduced), post-divided into the rank's shard, and
  // the unsharded gradients freed; the unit's gathered parameters are freed (resharded).
  void unit_backward_done(size_t u) {
    const std::vector<Param*> params = m_env.model.params();
    // A NaN or infinite local gradient is caught before the reduction spreads it (as under DDP).
    for (int i : m_units[u].params)
      if (!all_finite(params[static_cast<size_t>(i)]->grad))
        throw TrainingError("iteration " + std::to_string(m_step) + " (epoch " + std::to_string(m_epoch) + ", batch " +
                                std::to_string(m_batch) + "): the gradient of " + m_names[static_cast<size_t>(i)] +
                                " is NaN or infinite before the " + (sharded() ? "reduce-scatter" : "allreduce"),
                            "the reduction would have spread it to every rank; lower --lr");
    if (m_synced || m_no_sync_reduces) {
      const FsdpUnit& unit = m_units[u];
      flatten(u, &Param::grad);
      if (m_pre > 1)
        for (float& x : m_flat) x /= m_pre;
      if (sharded()) {
        m_compute.pause();
        m_env.comm.reduce_scatter_sum(m_flat.data(), static_cast<size_t>(unit.shard),
                                      CollectiveInfo{"fsdp grads", static_cast<int>(u)});
        m_compute.resume();
        float* mine = m_flat.data() + unit.shard * m_env.rank;
        if (m_post > 1)
          for (int64_t i = 0; i < unit.shard; ++i) mine[i] /= m_post;
        std::memcpy(m_shards[u].grad.ptr(), mine, static_cast<size_t>(unit.shard) * sizeof(float));
        m_env.memory_at("backward: reduce-scatter " + unit_name(u));
        free_grads(u);
      } else {
        m_compute.pause();
        m_env.comm.allreduce_sum(m_flat.data(), m_flat.size(), CollectiveInfo{"fsdp grads", static_cast<int>(u)});
        m_compute.resume();
        if (m_post > 1)
          for (float& x : m_flat) x /= m_post;
        unflatten(u, m_flat.data(), &Param::grad);
        m_env.memory_at("backward: allreduce " + unit_name(u));
      }
      release(m_flat);
    }
    if (sharded()) free_params(u);  // resharded after backward
  }

  RankEnv& m_env;
  DistributedSampler m_sampler;
  const std::string m_strategy;
  const std::vector<FsdpUnit> m_units;
  const std::vector<std::string> m_names;
  const float m_pre, m_post;          // FSDP's gradient pre- and post-divide factors
  std::vector<std::vector<size_t>> m_first_at, m_last_at;  // per module: the units that start / end there
  ModuleHooks m_hooks;
  std::vector<Param> m_shards;        // sharded: per unit, the rank's shard of the flat parameter
  std::vector<float> m_flat;          // a unit's padded flat parameter or gradient, while a collective uses it
  int64_t m_step = 0, m_epoch = 0, m_batch = 0;
  bool m_synced = true;               // this iteration reduces gradients and steps
  ComputeSegments m_compute{m_env.comm, m_env.rank};  // forward and backward, cut around the collectives
  int64_t m_accumulated = 0;          // no_sync iterations whose unsharded gradients are kept
  // lessons' mutation tests (mutation.h)
  const bool m_keeps_gathered = mutated("fsdp-keeps-gathered"), m_no_sync_reduces = mutated("fsdp-no-sync-reduces");
};

class FsdpMode : public ParallelMode {
 public:
  const char* name() const override { return "fsdp"; }
  const char* title() const override { return "FullyShardedDataParallel"; }
  const char* help() const override { return "FullyShardedDataParallel, ZeRO-2/3"; }
  const char* about() const override {
    return "FullyShardedDataParallel: each wrapped unit's parameters are flattened and cut into one equal shard "
           "per rank. full_shard (ZeRO-3) all-gathers a unit's parameters before its forward and again before its "
           "backward; shard_grad_op (ZeRO-2) keeps them from forward to backward; gradients are reduce-scattered so "
           "each rank steps only its shard. no_shard is DDP. Less memory per rank, more communication.";
  }
  int zero_stage(const RunConfig& c) const override {
    return c.sharding_strategy == "full_shard" ? 3 : c.sharding_strategy == "shard_grad_op" ? 2 : 0;
  }
  ModeCaps caps() const override {
    ModeCaps k;
    k.sync_bn = k.no_sync = k.sharded_collectives = k.checkpoints = true;
    return k;
  }
  std::vector<ModeSetting> settings() const override {
    ModeSetting strategy;
    strategy.field = "sharding_strategy";
    strategy.flag = "--sharding-strategy";
    strategy.label = "sharding_strategy";
    strategy.kind = ModeSetting::Kind::Choice;
    strategy.pytorch = "ShardingStrategy";
    strategy.choices = {{"full_shard", "ZeRO-3: parameters, gradients and optimizer state sharded; parameters "
                                       "gathered before forward and again before backward"},
                        {"shard_grad_op", "ZeRO-2: gradients and optimizer state sharded; parameters gathered once "
                                          "per iteration, kept from forward to backward"},
                        {"no_shard", "DDP: nothing sharded; gradients allreduced"}};
    strategy.help = "FSDP's ShardingStrategy: what is sharded, and so how much memory each rank keeps and how many "
                    "bytes it moves.";
    ModeSetting wrap;
    wrap.field = "fsdp_wrap";
    wrap.flag = "--fsdp-wrap";
    wrap.label = "fsdp_wrap";
    wrap.kind = ModeSetting::Kind::Choice;
    wrap.pytorch = "auto_wrap_policy";
    wrap.choices = {{"model", "one unit: the whole model's parameters in one flat parameter"},
                    {"layer", "one unit per module that has parameters (each Linear, Conv2d, BatchNorm)"}};
    wrap.help = "What FSDP wraps: the whole model as one unit, or every layer as its own (what is gathered at once).";
    return {strategy, wrap};
  }
  void validate_settings(const RunConfig& c) const override {
    if (c.sharding_strategy != "full_shard" && c.sharding_strategy != "shard_grad_op" && c.sharding_strategy != "no_shard")
      throw ConfigError("--sharding-strategy: unknown strategy '" + c.sharding_strategy + "'",
                        "choose full_shard (ZeRO-3), shard_grad_op (ZeRO-2) or no_shard (DDP)");
    if (c.fsdp_wrap != "model" && c.fsdp_wrap != "layer")
      throw ConfigError("--fsdp-wrap: unknown policy '" + c.fsdp_wrap + "'",
                        "choose model (one unit) or layer (one unit per module with parameters)");
  }
  void validate(const RunConfig& c) const override {
    if (!parse_device(c.compute.device).is_cpu())
      throw ConfigError("--mode fsdp runs on the CPU reference only, not --device " + c.compute.device,
                        "its flat shards live in host memory; use --device cpu");
    if (c.nondeterministic)
      throw ConfigError("--nondeterministic with --mode fsdp",
                        "its reduce-scatter and all-gather add and copy in a fixed order: there is no arrival order "
                        "to change");
    if (c.sharding_strategy != "no_shard") {
      if (c.allreduce == "mpi" || c.allreduce == "nccl")
        throw ConfigError("--mode fsdp --sharding-strategy " + c.sharding_strategy + " with --allreduce " + c.allreduce,
                          "its reduce-scatter and all-gather run dtlab's own algorithms: --allreduce ring, naive or "
                          "tree");
      if (c.allreduce == "tree" && (c.world_size & (c.world_size - 1)) != 0)
        throw ConfigError("--mode fsdp --allreduce tree needs a power-of-two world size, not " +
                              std::to_string(c.world_size),
                          "recursive halving gives a shard to each rank of a power-of-two world only: use ring or naive");
    }
  }
  std::string no_effect_reason(const RunConfig& c, const std::string& setting) const override {
    if (setting == "broadcast_buffers")
      return "FSDP has no broadcast_buffers: each rank keeps its own BatchNorm running statistics";
    if ((setting == "sharding_strategy" || setting == "fsdp_wrap") && c.world_size == 1)
      return "with one rank there is nothing to shard";
    return "";
  }
  std::string describe(const RunConfig& c) const override {
    return "FSDP " + c.sharding_strategy + " (wrap " + c.fsdp_wrap + "), " + std::to_string(c.world_size) +
           (c.world_size == 1 ? " rank" : " ranks") + (c.world_size > 1 ? ", " + c.allreduce : "");
  }
  std::string header(const RunConfig& c) const override {
    return " sharding_strategy=" + c.sharding_strategy + " fsdp_wrap=" + c.fsdp_wrap;
  }
  std::unique_ptr<RankMode> make_rank(RankEnv& env) const override { return std::make_unique<FsdpRank>(env); }
  // the gradient reduction, as DDP's buckets (the all-gathers: the view's "every collective")
  SyncCollectives sync_collectives() const override { return {"", {"fsdp grads"}}; }
  void summary(const SummaryEnv& env, nlohmann::json& j) const override {
    const RunConfig& c = env.cfg;
    std::vector<std::string> names;
    nlohmann::json units = nlohmann::json::array();
    for (const FsdpUnit& u : units_of(c, &names)) {
      nlohmann::json ps = nlohmann::json::array();
      for (int i : u.params) ps.push_back(names[static_cast<size_t>(i)]);
      units.push_back({{"parameters", ps}, {"elements", u.numel}, {"shard", u.shard},
                       {"padding", u.padding(c.world_size)}});
    }
    const int pre = fsdp_predivide_factor(c.world_size);
    j["fsdp"] = {{"sharding_strategy", c.sharding_strategy}, {"wrap", c.fsdp_wrap}, {"units", units},
                 {"gradient_predivide_factor", pre},
                 {"gradient_postdivide_factor", static_cast<double>(c.world_size) / pre},
                 {"what", "the flat parameters (units): per unit its parameters in module order, its elements N, "
                          "every rank's shard ceil(N/W) and the zeros padding the last shard; gradients are divided by "
                          "the pre-divide factor before the reduction and by the post-divide factor after"}};
  }
  std::vector<std::string> summary_lines(const RunConfig& c, const RunSummary& s) const override {
    (void)s;
    const std::vector<FsdpUnit> units = units_of(c);
    int64_t shard = 0, pad = 0;
    for (const FsdpUnit& u : units) shard += c.sharding_strategy == "no_shard" ? u.numel : u.shard, pad += u.padding(c.world_size);
    return {"FSDP " + c.sharding_strategy + ": " + std::to_string(units.size()) + " unit" + (units.size() == 1 ? "" : "s") +
            ", each rank steps " + std::to_string(shard) + " elements" +
            (c.sharding_strategy == "no_shard" ? "" : " (" + std::to_string(pad) + " of padding over the units)")};
  }
};

}  // namespace

std::unique_ptr<ParallelMode> make_fsdp_mode() { return std::make_unique<FsdpMode>(); }

}  // namespace lab
