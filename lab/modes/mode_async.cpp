// --mode async: asynchronous training with a parameter server (async_ps.h for the protocol). The
// workers are the run's ranks 0..N-1 (what the views show); the server has transport N and a thread
// of its own (Mode::serve).
//   worker   for each batch of its DistributedSampler shard: pull (events "pull", with the bytes
//            received), forward, backward, push (event "push", its tag the gradient's staleness);
//            the step record carries staleness and the version pulled
//   server   applies every push at once (one SGD step on its model); after every N x
//            steps_per_epoch updates, one epoch: it evaluates its model on the test set and steps
//            the learning-rate schedule; at the end every worker's model is the server's
#include <algorithm>
#include <cstdio>

#include "async_ps.h"
#include "communicator.h"
#include "dataset.h"
#include "errors.h"
#include "evaluate.h"
#include "lr_schedule.h"
#include "mode.h"
#include "optim.h"
#include "run.h"
#include "sampler.h"

namespace lab {

namespace {

class AsyncWorker : public RankMode {
 public:
  explicit AsyncWorker(RankEnv& env)
      : m_env(env),
        m_client(env.model, env.transport, env.world),  // the server's transport is number `world`
        m_state(m_client.bytes()),
        m_sampler({env.train.size, env.world, env.rank, env.cfg.shuffle, env.cfg.seed, env.cfg.sampler_drop_last}) {}

  // The workers start from the server's weights at their first pull: no broadcast.
  std::vector<std::vector<int64_t>> batches(int64_t epoch) override {
    m_sampler.set_epoch(epoch);
    return make_batches(m_sampler.indices(), m_env.cfg.batch_size, m_env.cfg.drop_last);
  }
  int64_t samples_per_epoch() const override { return m_sampler.num_samples(); }

  StepCount step(const StepInput& in, StepRecord& rec) override {
    Model& model = m_env.model;
    Communicator& comm = m_env.comm;
    const int rank = m_env.rank;
    const int64_t n = static_cast<int64_t>(in.indices->size());
    double t0 = now_seconds();
    const int64_t version = m_client.pull(rank, in.step);
    transfer("pull", "parameters", -1, m_env.world, rank, t0);

    int correct = 0;
    const float loss = comm.timed(Phase::Forward, "forward", in.step,
                                  [&] { return model.forward_loss(*in.x, *in.labels, &correct); });
    comm.timed(Phase::Backward, "backward", in.step, [&] {
      model.zero_grad();
      model.backward_from_loss();
      m_env.faults.check(rank, in.step, "backward");
    });
    t0 = now_seconds();
    const AsyncHeader answer = m_client.push(rank, in.step, version, loss, correct, static_cast<int>(n));
    transfer("push", "gradient", static_cast<int32_t>(answer.staleness), rank, m_env.world, t0);

    rec.batch_size = n;
    rec.loss = loss;
    rec.correct = correct;
    rec.staleness = answer.staleness;
    rec.version = version;
    StepCount count;
    count.counts = false;  // the epochs' figures are the server's
    count.trained = n;
    return count;
  }
  void finish() override { m_client.done(m_env.rank); }

 private:
  // A transfer of the protocol, as the timeline and the traffic figures see it.
  void transfer(const char* op, const char* what, int32_t tag, int src, int dst, double t0) {
    Communicator& comm = m_env.comm;
    Event coll = comm.collective_event(op, comm.next_seq(), CollectiveInfo{what, tag}, m_state);
    coll.t_start = t0;
    coll.t_end = now_seconds();
    Event chunk = coll;
    chunk.kind = EventKind::Chunk;
    chunk.src = src;
    chunk.dst = dst;
    chunk.chunk = 0;
    chunk.ring_step = 0;
    comm.record(chunk);
    comm.record(coll);
    if (src == m_env.rank) comm.add_bytes_sent(m_state);
  }

  RankEnv& m_env;
  AsyncClient m_client;
  const uint64_t m_state;
  DistributedSampler m_sampler;
};

class AsyncMode : public ParallelMode {
 public:
  const char* name() const override { return "async"; }
  const char* title() const override { return "asynchronous training with a parameter server"; }
  const char* help() const override { return "a parameter server and asynchronous workers"; }
  const char* about() const override {
    return "Asynchronous training (Hogwild!, A3C): world_size workers and a parameter server. Each worker pulls "
           "the weights, computes a gradient on its batch and pushes it; the server applies every push at once, "
           "without waiting for the others. A gradient's staleness: the updates applied between its pull and its "
           "push (the Allreduce view shows it).";
  }
  ModeCaps caps() const override {
    ModeCaps k;
    k.threads_only = k.parameter_server = k.counts_trained_samples = true;
    k.ranks_evaluate_epochs = false;
    return k;
  }
  std::vector<ModeSetting> settings() const override {
    ModeSetting schedule;
    schedule.field = "async_schedule";
    schedule.flag = "--async-schedule";
    schedule.label = "schedule";
    schedule.pytorch = "the parameter server's order";
    schedule.kind = ModeSetting::Kind::Choice;
    schedule.choices = {{"free", "The server serves whichever worker's message arrives first: staleness depends on "
                                 "timing, and two runs differ."},
                        {"seeded", "The server serves the workers in an order drawn from a seed: the same seed gives "
                                   "the same staleness and the same bits."}};
    ModeSetting seed;
    seed.field = "async_seed";
    seed.flag = "--async-seed";
    seed.label = "schedule seed";
    seed.pytorch = "the parameter server's order";
    seed.min = 0;
    seed.shown = [](const RunConfig& c) { return c.async_schedule == "seeded"; };
    seed.help = "The seed of the seeded schedule.";
    return {schedule, seed};
  }
  void validate_settings(const RunConfig& c) const override {
    if (c.async_schedule != "free" && c.async_schedule != "seeded")
      throw ConfigError("--async-schedule: unknown schedule '" + c.async_schedule + "'",
                        "free: the server serves whoever sends first; seeded: in an order drawn from --async-seed");
  }
  void validate(const RunConfig& c) const override {
    if (c.comm == "nccl")
      throw ConfigError("--mode async needs a transport that receives from whichever worker sends first: not --comm nccl",
                        "use --comm threads");
    if (c.comm != "threads")
      throw ConfigError("--mode async runs its parameter server as a thread beside emulated ranks",
                        "use --comm threads (the default)");
    if (c.bn == "sync")
      throw ConfigError("--mode async with --bn sync: SyncBatchNorm needs every rank in the same forward",
                        "asynchronous workers never are; use --bn local");
    if (c.no_sync_steps > 0 || c.uneven_data || c.join)
      throw ConfigError("--no-sync-steps, --uneven-data and --join are DDP's; --mode async has no DDP");
    if (c.fail_rank >= 0 && c.fail_at == "allreduce")
      throw ConfigError("--fail-at allreduce: --mode async has no allreduce", "choose --fail-at forward, backward or hang");
    if (c.checkpoint_every > 0 || c.checkpoint_every_epoch || !c.resume.empty())
      throw ConfigError("checkpoints and --resume cover --mode " + modes_with(&ModeCaps::checkpoints),
                        "the parameter server's order of updates is not a step boundary every worker shares");
  }
  std::string no_effect_reason(const RunConfig& c, const std::string& setting) const override {
    if (setting == "overlap" || setting == "bucket_cap_mb" || setting == "allreduce" || setting == "broadcast_buffers")
      return "--mode async has no DDP and no allreduce: workers pull the weights from the parameter server and push "
             "their gradients to it";
    if ((setting == "async_schedule" || setting == "async_seed") && c.world_size == 1)
      return "with one worker the parameter server has a single worker to serve";
    if (setting == "async_seed" && c.async_schedule != "seeded")
      return "--async-schedule is " + c.async_schedule + " (it applies to seeded)";
    return "";
  }
  std::string describe(const RunConfig& c) const override {
    return "async, " + std::to_string(c.world_size) + (c.world_size == 1 ? " worker" : " workers") +
           " and a parameter server (" + c.async_schedule + " schedule)";
  }
  const char* member() const override { return "worker"; }
  std::string header(const RunConfig& c) const override {
    return " (" + std::to_string(c.world_size) + " workers and a parameter server; schedule " + c.async_schedule +
           (c.async_schedule == "seeded" ? " seed " + std::to_string(c.async_seed) : std::string()) + ")";
  }
  std::unique_ptr<RankMode> make_rank(RankEnv& env) const override { return std::make_unique<AsyncWorker>(env); }
  void serve(ServerEnv& env) const override;
  void summary(const SummaryEnv& env, nlohmann::json& j) const override;
  std::vector<std::string> summary_lines(const RunConfig& c, const RunSummary& s) const override;
};

void AsyncMode::serve(ServerEnv& env) const {
  const RunConfig& c = env.cfg;
  const int workers = c.world_size;
  Model& model = env.model;
  Optimizer opt(model.params(), optimizer_options(c));  // the server's optimizer: --optimizer's
  LrSchedule schedule(lr_schedule_options(c, env.epochs_total));
  // one epoch of the server: every worker's batches of one epoch (the last one may be cut by --steps)
  const int64_t per_epoch = env.steps_per_epoch * workers;
  const int64_t total = env.steps_total * workers;
  int64_t epoch = 0, ep_updates = 0, ep_samples = 0, ep_correct = 0;
  double ep_loss = 0, t_epoch0 = now_seconds();
  ParameterServer server(model, opt, env.transport, workers, c.async_schedule, c.async_seed);
  server.serve([&](const ParameterServer::Update& u, int64_t updates) {
    env.record_update(u.worker, u.staleness);
    ++ep_updates;
    ep_loss += u.loss;
    ep_samples += u.samples;
    ep_correct += u.correct;
    if (updates % per_epoch != 0 && updates != total) return;
    // the end of an epoch: evaluate the server's model, as a user of a parameter server does
    const double t_eval = now_seconds();
    const EvalResult r = lab::evaluate(model, Mode::Eval, env.test, c.eval_batch_size, 0, env.test.size);
    EpochRecord e;
    e.epoch = epoch;
    e.steps = std::min(env.steps_total, (epoch + 1) * env.steps_per_epoch);
    e.train_loss = ep_updates ? ep_loss / static_cast<double>(ep_updates) : 0.0;
    e.train_acc = ep_samples ? static_cast<double>(ep_correct) / static_cast<double>(ep_samples) : 0.0;
    e.test_loss = r.loss;
    e.test_acc = r.acc;
    e.seconds = t_eval - t_epoch0;
    e.samples_per_s = e.seconds > 0 ? static_cast<double>(ep_samples) / e.seconds : 0.0;
    e.lr = opt.lr();
    env.record_epoch(e);
    ++epoch;
    ep_updates = ep_samples = ep_correct = 0;
    ep_loss = 0;
    schedule.step();
    opt.set_lr(schedule.lr());
    t_epoch0 = now_seconds();
  });
}

void AsyncMode::summary(const SummaryEnv& env, nlohmann::json& j) const {
  const auto& updates = env.summary.async_updates;
  int64_t max_st = 0;
  double mean_st = 0;
  for (const auto& [w, st] : updates) {
    max_st = std::max(max_st, st);
    mean_st += static_cast<double>(st) / static_cast<double>(updates.size());
  }
  std::vector<int64_t> hist(static_cast<size_t>(max_st + 1), 0);
  std::vector<int64_t> per_update, workers;
  for (const auto& [w, st] : updates) {
    ++hist[static_cast<size_t>(st)];
    per_update.push_back(st);
    workers.push_back(w);
  }
  j["async"] = {{"schedule", env.cfg.async_schedule}, {"seed", env.cfg.async_seed}, {"workers", env.cfg.world_size},
                {"updates", updates.size()},
                {"staleness", {{"mean", mean_st}, {"max", max_st}, {"histogram", hist}}},
                {"per_update", {{"staleness", per_update}, {"worker", workers}}},
                {"what", "staleness: updates the server applied between a worker's pull and its push; histogram[k]: "
                         "pushes that were k updates stale; per_update: in the order the server applied them"}};
}

std::vector<std::string> AsyncMode::summary_lines(const RunConfig& c, const RunSummary& s) const {
  if (s.async_updates.empty()) return {};
  int64_t max_st = 0;
  double mean = 0;
  for (const auto& [w, st] : s.async_updates) {
    max_st = std::max(max_st, st);
    mean += static_cast<double>(st) / static_cast<double>(s.async_updates.size());
  }
  char buf[200];
  std::snprintf(buf, sizeof buf, "async: the parameter server applied %zu pushes (%s schedule); staleness mean %.2f, max %lld updates",
                s.async_updates.size(), c.async_schedule.c_str(), mean, static_cast<long long>(max_st));
  return {buf};
}

}  // namespace

std::unique_ptr<ParallelMode> make_async_mode() { return std::make_unique<AsyncMode>(); }

}  // namespace lab
