// --mode ddp: DistributedDataParallel (ddp.h for its mechanics). One rank's iteration:
//   before the forward   join's collectives (join.h), or rank 0's buffers everywhere when the
//                        previous forward was synchronized (broadcast_buffers)
//   forward, loss        on the rank's batch
//   backward             gradients into DDP's buckets as they become ready; a bucket's allreduce
//                        starts on the communication thread (overlap) or after backward; a
//                        NaN or infinite gradient is caught before the allreduce spreads it
//   optimizer step       unless no_sync accumulates, or skip-step finds the averaged gradient
//                        not finite
#include "mode_ddp.h"

#include <cmath>
#include <thread>

#include "batchnorm.h"
#include "communicator.h"
#include "dataset.h"
#include "errors.h"
#include "model.h"
#include "mutation.h"
#include "optim.h"
#include "run.h"

namespace lab {

namespace {

// When a bucket's allreduce starts: on the communication thread as its gradients are ready
// (overlap), or after backward; the overlap lesson's mutation tests swap them (mutation.h).
BucketLaunch bucket_launch(const RunConfig& c) {
  if (c.overlap) return mutated("ddp-launch-after-backward") ? BucketLaunch::AfterBackward : BucketLaunch::CommThread;
  return mutated("ddp-no-overlap-in-hook") ? BucketLaunch::InHook : BucketLaunch::AfterBackward;
}

std::string nonfinite_kind(const Tensor& t) {
  for (float v : t.data)
    if (std::isnan(v)) return "NaN";
  return "infinite";
}

// --on-nonfinite stop: the parameter `name` has a NaN or infinite gradient (grad, on the host).
TrainingError nonfinite_error(const StepInput& in, const std::string& name, const Tensor& grad, float loss) {
  return TrainingError(
      "iteration " + std::to_string(in.step) + " (epoch " + std::to_string(in.epoch) + ", batch " +
          std::to_string(in.batch) + "): the gradient of " + name + " is " + nonfinite_kind(grad) +
          " before the allreduce (loss " +
          (std::isfinite(loss) ? std::to_string(loss) : std::string(std::isnan(loss) ? "NaN" : "inf")) + ")",
      "the allreduce would have spread it to every rank. Lower --lr, or pass --on-nonfinite skip-step to "
      "skip such steps as AMP's GradScaler does");
}

}  // namespace

StepCount record_step(const StepInput& in, StepRecord& rec, float loss, int correct, double drift, bool synced, bool skipped,
                       const std::string& nonfinite) {
  const int64_t n = static_cast<int64_t>(in.indices->size());
  rec.batch_size = n;
  rec.loss = loss;
  rec.correct = correct;
  rec.param_drift = drift;
  rec.grad_sync = synced;
  rec.skipped = skipped;
  rec.nonfinite = nonfinite;
  StepCount count;
  count.samples = n;
  count.trained = n;
  return count;
}

DdpRank::DdpRank(RankEnv& env)
    : m_env(env),
      m_reducer(env.model, env.comm, env.cfg.bucket_cap_mb, bucket_launch(env.cfg), &env.worker),
      m_join(env.model, env.comm, m_reducer, env.cfg.broadcast_buffers),
      m_sampler({env.train.size, env.world, env.rank, env.cfg.shuffle, env.cfg.seed, env.cfg.sampler_drop_last}),
      m_broadcast_once(mutated("ddp-broadcast-once")),
      m_broadcast(env.cfg.broadcast_buffers || mutated("ddp-broadcast-ignores-flag")),
      m_eval_no_broadcast(mutated("ddp-eval-no-broadcast")),
      m_no_sync_allreduces(mutated("ddp-no-sync-allreduces")),
      m_no_sync_broadcasts(mutated("ddp-no-sync-broadcasts")),
      m_grad_overwrites(mutated("grad-accumulation-overwrites")),
      m_bn_update_on_sync_only(mutated("bn-updates-on-sync-only")),
      m_pnames(param_names(env.model)),
      m_graphs(env.cfg.compute.cuda_graphs) {}

void DdpRank::start() { broadcast_state(m_env.model, m_env.comm); }  // DDP construction: rank 0's state everywhere

std::vector<std::vector<int64_t>> DdpRank::batches(int64_t epoch) {
  m_sampler.set_epoch(epoch);
  auto b = make_batches(m_sampler.indices(), m_env.cfg.batch_size, m_env.cfg.drop_last);
  if (m_env.cfg.uneven_data) b.resize(b.size() - static_cast<size_t>(m_env.rank));  // rank r drops r batches
  return b;
}

void DdpRank::before_step(const StepInput& in) {
  const RunConfig& c = m_env.cfg;
  const bool synced = c.no_sync_steps == 0 || in.step % (c.no_sync_steps + 1) == c.no_sync_steps;
  if (c.join) m_join.before_forward(m_require_forward_param_sync, synced);  // buffers from the common rank
  else if (m_broadcast && m_require_forward_param_sync && !m_broadcast_once)
    broadcast_buffers(m_env.model, m_env.comm);
}

// --cuda-graphs (one rank, synchronized, SGD: config.cpp refuses the rest): the forward, the loss,
// backward, the finiteness check and the optimizer step in one call, which a GPU replays as one
// CUDA Graph. The same record as step()'s; a non-finite gradient is found after the step (no
// parameter moved: the device skips the update), with the same message and the same skip.
StepCount DdpRank::graph_step(const StepInput& in, StepRecord& rec) {
  const RunConfig& c = m_env.cfg;
  Model& model = m_env.model;
  const GraphStepOutcome r = m_env.comm.timed(Phase::Forward, "training step (graph)", in.step,
                                              [&] { return model.graph_step(*in.x, *in.labels, m_env.opt); });
  std::string nonfinite;
  bool skipped = false;
  if (r.nonfinite >= 0) {
    const size_t i = static_cast<size_t>(r.nonfinite);
    nonfinite = m_pnames[i];
    model.to_host(kStateGrads);
    if (c.on_nonfinite == "stop") throw nonfinite_error(in, nonfinite, model.params()[i]->grad, r.loss);
    skipped = true;
    model.zero_grad();
  }
  const double drift = after_optimizer_step();
  m_require_forward_param_sync = true;
  return record_step(in, rec, r.loss, r.correct, drift, true, skipped, nonfinite);
}

StepCount DdpRank::step(const StepInput& in, StepRecord& rec) {
  // --cuda-graphs: every step but one a failure is injected into (--fail-at: those stay step by step)
  if (m_graphs && !(m_env.faults.rank == m_env.rank && m_env.faults.step == in.step)) return graph_step(in, rec);
  const RunConfig& c = m_env.cfg;
  Model& model = m_env.model;
  Communicator& comm = m_env.comm;
  const int64_t step = in.step;
  const int rank = m_env.rank;
  // no_sync cycles (--no-sync-steps K): K local backward passes, then a synchronized one that
  // averages the accumulated sums and steps.
  const bool synced = c.no_sync_steps == 0 || step % (c.no_sync_steps + 1) == c.no_sync_steps;
  const bool grad_allreduce = m_env.world > 1 && (synced || m_no_sync_allreduces) && allreduces(step);

  std::vector<Buffer> kept;  // (mutation bn-updates-on-sync-only: a no_sync forward's running statistics undone)
  if (m_bn_update_on_sync_only && !synced) {
    model.to_host(kStateBuffers);
    for (BatchNorm* b : model.batchnorms())
      for (Buffer* buf : b->buffers()) kept.push_back(*buf);
  }
  int correct = 0;  // the forward and the loss (on a device that can, both there: Model::forward_loss)
  const float loss =
      comm.timed(Phase::Forward, "forward", step, [&] { return model.forward_loss(*in.x, *in.labels, &correct); });
  m_env.memory_at("forward");
  if (!kept.empty()) {
    size_t k = 0;
    for (BatchNorm* b : model.batchnorms())
      for (Buffer* buf : b->buffers()) *buf = kept[k++];
    model.host_changed(kStateBuffers);
  }
  if (m_env.faults.here(rank, step, "nan")) model.poison_loss_grad();  // --fail-at nan: a NaN enters this rank's backward
  std::string nonfinite;  // the first parameter whose local gradient is NaN or infinite
  const std::vector<Param*> params = model.params();

  // The backward event is the computation; waiting for the last buckets' allreduces (or, with
  // --no-overlap, running them all) follows it on the communication track.
  comm.timed(Phase::Backward, "backward", step, [&] {
    if (c.no_sync_steps == 0 || step % (c.no_sync_steps + 1) == 0 || m_grad_overwrites)
      model.zero_grad();  // no_sync accumulates
    if (grad_allreduce)
      m_reducer.prepare_for_backward();
    else
      m_reducer.place();
    bool first_grad = true;
    std::vector<int> order;  // without an allreduce, the gradients are checked after backward, in one piece
    const auto found = [&](int i) {
      nonfinite = m_pnames[static_cast<size_t>(i)];
      model.to_host(kStateGrads);  // for the message: a device's gradients (executor.h)
      if (c.on_nonfinite == "stop") throw nonfinite_error(in, nonfinite, params[static_cast<size_t>(i)]->grad, loss);
    };
    model.backward_from_loss([&](int i) {
      if (first_grad) m_env.faults.check(rank, step, "backward");
      first_grad = false;
      if (!grad_allreduce) return order.push_back(i);
      // Before DDP copies it into a bucket: a non-finite gradient is caught on the rank it comes from.
      if (nonfinite.empty() && !model.grad_finite(static_cast<size_t>(i))) found(i);
      m_reducer.mark_param_ready(i);
    });
    if (!grad_allreduce) {
      const int bad = model.first_nonfinite_grad(order);
      if (bad >= 0) found(bad);
    }
  });
  if (grad_allreduce) m_reducer.finalize_backward();
  m_env.memory_at("backward");
  // --on-nonfinite skip-step: the averaged gradient is the same on every rank, so every rank skips
  // the same steps (as GradScaler.step does when it finds infs); BatchNorm's running statistics
  // keep this step's update, as they do under GradScaler.
  bool skipped = false;
  if (synced && c.on_nonfinite == "skip-step" && (!nonfinite.empty() || grad_allreduce)) {
    for (size_t i = 0; i < params.size(); ++i)
      if (!model.grad_finite(i)) skipped = true;
    if (skipped) model.zero_grad();
  }
  if (synced && !skipped) comm.timed(Phase::OptimizerStep, "optimizer-step", step, [&] { m_env.opt.step(); });
  const double drift = after_optimizer_step();
  m_require_forward_param_sync = synced || m_no_sync_broadcasts;  // DDP: a no_sync forward leaves the next one unsynced
  return record_step(in, rec, loss, correct, drift, synced, skipped, nonfinite);
}

void DdpRank::after_batches(int64_t epoch, int64_t& step, int64_t batches_done) {
  const RunConfig& c = m_env.cfg;
  if (c.join) {
    // DDP join (join.h): out of data (or at the end of the epoch), shadow the collectives of the
    // ranks still training until every rank has joined; then take the last joiner's model.
    bool last_joiner = true;
    for (;; ++step) {
      m_env.iteration_gate(step);
      m_env.comm.set_train_step(step);
      if (!m_join.shadow_iteration(m_require_forward_param_sync)) break;
      last_joiner = false;
    }
    m_join.sync_final_model(last_joiner);
  } else if (c.uneven_data && batches_done < m_env.steps_per_epoch && step < m_env.steps_total) {
    // Out of data while the others still train, and no join: in PyTorch the others now hang in
    // their next collective. Record it and wait for their timeout to end the run; the run then
    // says who waited where and who had finished.
    m_env.ran_out_of_data(step, epoch, batches_done);
    while (!m_env.transport.aborted()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    throw StopRequested{};
  }
}

void DdpRank::before_evaluation() {
  // The first no-grad forward after training broadcasts rank 0's buffers (broadcast_buffers).
  if (m_broadcast && m_require_forward_param_sync && !m_eval_no_broadcast) broadcast_buffers(m_env.model, m_env.comm);
  m_require_forward_param_sync = false;
}

void DdpRank::save(ModeCheckpoint& mc) const {
  mc.counters["buckets"] = m_reducer.buckets();
  mc.counters["buckets_rebuilt"] = m_reducer.rebuilt();
  mc.require_forward_param_sync = m_require_forward_param_sync;
}

void DdpRank::restore(const ModeCheckpoint& mc, int64_t epochs_done) {
  (void)epochs_done;
  m_reducer.restore_buckets(mc.counters.at("buckets").get<std::vector<std::vector<int>>>(),
                            mc.counters.at("buckets_rebuilt").get<bool>());
  m_require_forward_param_sync = mc.require_forward_param_sync;
}

// ---- the mode ----

namespace {

class DdpMode : public ParallelMode {
 public:
  const char* name() const override { return "ddp"; }
  const char* title() const override { return "DistributedDataParallel"; }
  const char* help() const override { return "DistributedDataParallel"; }
  const char* about() const override {
    return "DistributedDataParallel: every rank trains its replica on its own shard; gradients are averaged by "
           "allreduce in buckets during backward, so every rank takes the same optimizer step.";
  }
  ModeCaps caps() const override {
    ModeCaps k;
    k.gradient_allreduce = k.sync_bn = k.buffer_broadcast = k.no_sync = k.uneven_data = k.skip_step = true;
    k.checkpoints = k.fail_at_allreduce = true;
    return k;
  }
  std::vector<ModeSetting> settings() const override {
    ModeSetting overlap;
    overlap.field = "overlap";
    overlap.flag = "--no-overlap";
    overlap.label = "overlap";
    overlap.exclusive = false;  // local SGD's warm-up allreduces in buckets too
    overlap.kind = ModeSetting::Kind::Bool;
    overlap.help = "Each bucket's allreduce starts on the rank's communication thread as soon as its gradients are "
                   "ready, during the rest of backward (DDP's overlap). Off: every allreduce after backward. The "
                   "results are bit-identical; the timeline shows the difference.";
    ModeSetting no_sync;
    no_sync.field = "no_sync_steps";
    no_sync.flag = "--no-sync-steps";
    no_sync.label = "no_sync steps";
    no_sync.pytorch = "DistributedDataParallel.no_sync";
    no_sync.min = 0;
    no_sync.help = "K backward passes under DDP's no_sync() (gradients accumulate, no allreduce, no optimizer step) "
                   "before each synchronized one. 0: every step synchronizes.";
    return {overlap, no_sync};
  }
  void validate(const RunConfig& c) const override {
    if (c.join && c.bn == "sync")
      throw ConfigError("--join with --bn sync: SyncBatchNorm is not Joinable in PyTorch 1.13",
                        "finished ranks cannot shadow its collectives; use --bn local");
  }
  std::string describe(const RunConfig& c) const override {
    return "DDP, " + std::to_string(c.world_size) + (c.world_size == 1 ? " rank" : " ranks") +
           (c.world_size > 1 ? ", " + c.allreduce + " allreduce" : "");
  }
  std::unique_ptr<RankMode> make_rank(RankEnv& env) const override { return std::make_unique<DdpRank>(env); }
  void summary(const SummaryEnv& env, nlohmann::json& j) const override { ddp_summary(env, j); }
};

}  // namespace

void ddp_summary(const SummaryEnv& env, nlohmann::json& j) {
  if (env.cfg.world_size < 2) return;
  nlohmann::json bj = nlohmann::json::array();
  for (const BucketInfo& b : grad_buckets(env.events)) bj.push_back({{"index", b.index}, {"bytes", b.bytes}});
  j["ddp"] = {{"buckets", bj}, {"bucket_cap_mb", env.cfg.bucket_cap_mb},
              {"what", "the gradient buckets of the last training step: bucket 0 holds the last layers' gradients "
                       "(ready first in backward; after the first iteration's rebuild it closes once it holds 1 MiB or more)"}};
}

std::unique_ptr<ParallelMode> make_ddp_mode() { return std::make_unique<DdpMode>(); }

}  // namespace lab
