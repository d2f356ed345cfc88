// The training loop of one rank, the same for every mode (lab/modes/mode.h does what differs):
//   for each epoch: the mode's batches; for each batch:
//     gate (pause, single steps, stop) -> stop vote (several processes) -> checkpoint when due ->
//     the batch -> the mode's before_step -> failures on purpose (forward, hang) -> the mode's
//     step -> the step record -> periodic evaluation
//   then the mode's after_batches (join, uneven data), and, where the ranks evaluate epochs, the
//   end of the epoch: the mode's before_evaluation, the evaluation on every rank's shard of the
//   test set, the epoch's figures on rank 0, the learning-rate schedule.
// And the parameter server's thread, for modes that have one.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <thread>

#include "comm_worker.h"
#include "dataset.h"
#include "errors.h"
#include "faults.h"
#include "lr_schedule.h"
#include "mode.h"
#include "mutation.h"
#include "optim.h"
#include "parallel.h"
#include "run.h"
#include "run_dir.h"
#include "run_internal.h"

namespace lab {

namespace {

// SyncBatchNorm's collectives for one BatchNorm layer, recorded under its module index. With
// overlapping DDP, bucket allreduces may be running on the rank's CommWorker: wait for them
// first, so this collective comes after them on every rank (comm_worker.h).
class CommBnSync : public BnSync {
 public:
  CommBnSync(Communicator& comm, int module_index, CommWorker* worker = nullptr)
      : m_comm(comm), m_index(module_index), m_worker(worker) {}
  int world_size() const override { return m_comm.world_size(); }
  void allgather(const float* mine, int n, std::vector<float>& all) override {
    if (m_worker) m_worker->wait_idle();
    all.resize(static_cast<size_t>(n) * static_cast<size_t>(m_comm.world_size()));
    m_comm.allgather(mine, static_cast<size_t>(n), all.data(), CollectiveInfo{"bn stats", m_index});
  }
  void allreduce_sum(float* data, int n) override {
    if (m_worker) m_worker->wait_idle();
    m_comm.allreduce_sum(data, static_cast<size_t>(n), CollectiveInfo{"bn grad sums", m_index});
  }
  void allgather_on(DeviceMemory& mem, const float* mine, int n, float* all) override {
    if (m_worker) m_worker->wait_idle();
    m_comm.allgather(mine, static_cast<size_t>(n), all, CollectiveInfo{"bn stats", m_index}, &mem);
  }
  void allreduce_sum_on(DeviceMemory& mem, float* data, int n) override {
    if (m_worker) m_worker->wait_idle();
    m_comm.allreduce_sum(data, static_cast<size_t>(n), CollectiveInfo{"bn grad sums", m_index}, &mem);
  }

 private:
  Communicator& m_comm;
  int m_index;
  CommWorker* m_worker;
};

}  // namespace

OptimizerOptions optimizer_options(const RunConfig& c) {
  OptimizerOptions o;
  o.kind = c.optimizer;
  o.sgd.lr = c.lr;
  o.sgd.momentum = c.momentum;
  o.sgd.weight_decay = c.weight_decay;
  o.sgd.nesterov = c.nesterov;
  o.adam.lr = c.lr;
  o.adam.beta1 = c.adam_beta1;
  o.adam.beta2 = c.adam_beta2;
  o.adam.eps = c.adam_eps;
  o.adam.weight_decay = c.weight_decay;
  o.adam.decoupled = c.optimizer == "adamw";
  return o;
}

// What BatchNorm's batch-of-one error adds: which batch it was, why it had one sample, and what
// avoids it. Only two things give a rank a batch of one: --batch-size 1 (every batch), or an
// epoch whose samples per rank leave 1 after the full batches (its last batch; --drop-last drops it).
std::string batch_of_one_hint(const RunConfig& c, int rank, size_t batch, int64_t epoch, int64_t samples_per_rank) {
  std::string s = "rank " + std::to_string(rank) + " got a batch of one sample (batch " + std::to_string(batch) +
                  " of epoch " + std::to_string(epoch) + ")";
  std::string fixes;
  if (c.batch_size == 1) {
    s += ": --batch-size 1 gives every batch a single sample, and BatchNorm in training needs more than one value "
         "per channel";
    fixes = "use --batch-size 2 or more";
  } else {
    s += ": it is the epoch's last, incomplete batch (" + std::to_string(samples_per_rank) +
         " samples per rank mod batch size " + std::to_string(c.batch_size) + " = 1)";
    fixes = "use --drop-last (DataLoader drop_last=True drops that batch), or a batch size that does not leave one sample";
  }
  if (c.bn == "local" && c.world_size > 1 && mode_of(c).caps().sync_bn)
    fixes += ", or --bn sync (SyncBatchNorm: the statistics of every rank's samples of the step, " +
             std::to_string(c.world_size) + " values per channel or more)";
  return s + ". To avoid it, " + fixes;
}

// What each BatchNorm layer saw in the last training forward, for metrics and the GUI.
std::vector<BnLayerRecord> bn_layer_records(const std::vector<BatchNorm*>& bns, const std::vector<int>& bn_index,
                                            bool track_running_stats) {
  std::vector<BnLayerRecord> out;
  for (size_t i = 0; i < bns.size(); ++i) {
    const BnBatchStats& st = bns[i]->last_stats();
    BnLayerRecord b;
    b.layer = std::to_string(bn_index[i]);
    b.count = st.count;
    b.batch_mean = st.mean;
    b.batch_var = st.var;
    b.local_mean = st.local_mean;
    b.local_var = st.local_var;
    if (track_running_stats) {
      b.running_mean = bns[i]->running_mean().value.data;
      b.running_var = bns[i]->running_var().value.data;
      b.num_batches_tracked = bns[i]->num_batches_tracked().i64;
    }
    out.push_back(std::move(b));
  }
  return out;
}

// ---- one rank ----


struct Run::RankLoop {
  Run& run;
  const RunConfig& c;
  const int rank;
  Model& model;
  RankState& rs;
  Transport& transport;
  Communicator comm;
  // DDP's communication thread (--overlap). Before the mode (which uses it) and outliving the
  // error handling, which aborts the world and so ends a bucket allreduce blocked on a peer.
  CommWorker worker;
  const FaultPlan faults;
  std::vector<BatchNorm*> bns;
  std::vector<int> bn_index;
  std::vector<std::unique_ptr<CommBnSync>> syncs;
  Optimizer opt;
  LrSchedule schedule;
  MemoryLedger memory;  // the rank's bytes by category at each point of a step (memory.h)
  RankEnv env;
  std::unique_ptr<RankMode> mode;
  Tensor x;
  std::vector<int> labels;
  double t_epoch0 = 0;
  bool stopped_at_checkpoint = false;

  RankLoop(Run& r, int rk)
      : run(r),
        c(r.m_cfg),
        rank(rk),
        model(*r.m_replicas[static_cast<size_t>(rk)]),
        rs(*r.m_ranks[static_cast<size_t>(rk)]),
        transport(r.m_world->transport(rk)),
        comm(transport, r.m_logs[static_cast<size_t>(rk)].get(), r.m_control.get()),
        faults(FaultPlan::from(r.m_cfg)),
        bns(model.batchnorms()),
        bn_index(model.batchnorm_module_index()),
        opt(model.params(), optimizer_options(r.m_cfg)),
        schedule(lr_schedule_options(r.m_cfg, r.epochs_total())),
        env{r.m_cfg, rk, r.m_cfg.world_size, model, comm, transport, worker, opt, r.m_train, faults,
            r.m_steps_per_epoch, r.m_steps_total, {}, {}, &memory} {
    comm.set_allreduce_algorithm(parse_allreduce_algorithm(c.allreduce));
    if (ModelExecutor* dev = model.executor()) {
      comm.set_device_events([dev](std::vector<Event>& out) { dev->take_device_events(out); });  // its own timeline
      opt.set_device(dev);  // the parameters it keeps are stepped there (executor.h: residency)
    }
    comm.set_arrival_order(c.nondeterministic);
    env.iteration_gate = [this](int64_t step) { run.m_control->before_iteration(rank, step); };
    env.ran_out_of_data = [this](int64_t step, int64_t epoch, int64_t batches) {
      std::lock_guard<std::mutex> lock(rs.mu);
      rs.out_of_data_step = step;
      rs.out_of_data_epoch = epoch;
      rs.out_of_data_batches = batches;
    };
  }

  void setup() {
    if (c.bn == "sync")
      for (size_t i = 0; i < bns.size(); ++i) {
        syncs.push_back(std::make_unique<CommBnSync>(comm, bn_index[i], &worker));
        bns[i]->set_sync(syncs.back().get());
      }
    mode = mode_of(c).make_rank(env);
    const bool skip_optimizer = mutated("memory-skips-optimizer-state");  // a lesson's mutation test (mutation.h)
    memory.set_measure([this, skip_optimizer] {
      MemoryBytes b;
      for (const Param* p : model.params()) {
        b[kMemParameters] += p->value.numel() * 4;
        b[kMemGradients] += p->grad.numel() * 4;
      }
      b[kMemOptimizerState] = skip_optimizer ? 0 : opt.state_bytes();
      b[kMemActivations] = model.activation_bytes();
      mode->measure_memory(b);
      return b;
    });
    if (!run.m_resume) mode->start();
    if (rank == 0 && run.m_dir && !run.m_resume)
      run.m_dir->write_weights("init.safetensors", model_tensors(model),
                               {{"format", "pt"}, {"producer", std::string("dtlab ") + kDtlabVersion}, {"rank", "0"}});
  }

  void train() {
    int64_t step = 0, first_epoch = 0, first_batch = 0;
    if (run.m_resume) {  // --resume: this rank as it was at the checkpoint (run_checkpoint.cpp)
      RankCheckpointRefs refs{model, opt, *mode, comm, schedule, t_epoch0};
      run.restore_rank(rank, refs);
      step = refs.step;
      first_epoch = refs.epoch;
      first_batch = refs.batch;
    }
    const bool evaluate_epochs = mode_of(c).caps().ranks_evaluate_epochs;
    for (int64_t epoch = first_epoch; epoch < run.epochs_total() && step < run.m_steps_total; ++epoch) {
      if (!(run.m_resume && epoch == first_epoch)) t_epoch0 = now_seconds();  // restore_rank set the resumed epoch's
      const auto batches = mode->batches(epoch);
      for (size_t bi = epoch == first_epoch ? static_cast<size_t>(first_batch) : 0;
           bi < batches.size() && step < run.m_steps_total; ++bi, ++step)
        if (!iteration(step, epoch, bi, batches[bi])) break;
      if (stopped_at_checkpoint) break;
      mode->after_batches(epoch, step, static_cast<int64_t>(batches.size()));
      if (evaluate_epochs) end_epoch(epoch, step);
    }
    comm.set_train_step(-1);  // (the final gathers are not the last iteration's traffic)
    mode->finish();
    // Ranks in other processes: records, events and final state go to rank 0's process.
    if (run.m_local.size() < static_cast<size_t>(c.world_size)) run.gather_to_rank0(rank, transport, model);
  }

  // One iteration; false: the run stops here (Ctrl-C's checkpoint).
  bool iteration(int64_t step, int64_t epoch, size_t bi, const std::vector<int64_t>& idx) {
    run.m_control->before_iteration(rank, step);
    if (run.m_stop_vote) run.vote_on_stop(rank, step);  // several processes: did any get Ctrl-C / SIGTERM?
    if (run.checkpoint_due(step, bi)) {  // every rank saves its state before iteration `step` (run_checkpoint.cpp)
      RankCheckpointRefs refs{model, opt, *mode, comm, schedule, t_epoch0};
      refs.step = step;
      refs.epoch = epoch;
      refs.batch = static_cast<int64_t>(bi);
      run.write_checkpoint(rank, refs);
      if (step == run.m_control->checkpoint_stop()) {  // Ctrl-C (interrupt()): stop here, outputs as usual
        stopped_at_checkpoint = true;
        return false;
      }
    }
    comm.set_train_step(step);
    gather_batch(run.m_train, idx, x, labels);
    const int64_t n = static_cast<int64_t>(idx.size());
    if (n == 1)
      for (BatchNorm* b : bns) b->set_error_hint(batch_of_one_hint(c, rank, bi, epoch, mode->samples_per_epoch()));
    StepInput in;
    in.step = step;
    in.epoch = epoch;
    in.batch = static_cast<int64_t>(bi);
    in.indices = &idx;
    in.x = &x;
    in.labels = &labels;
    mode->before_step(in);
    faults.check(rank, step, "forward");
    if (faults.here(rank, step, "hang")) {
      // A rank that stops answering: the others' next collective times out and names it.
      while (!transport.aborted()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
      throw StopRequested{};
    }
    StepRecord rec;
    memory.begin_step(step);
    memory.sample("start");
    const StepCount count = mode->step(in, rec);
    memory.sample("end");
    rec.memory = memory.points();
    record(rec, count, step, epoch, static_cast<int64_t>(bi));
    if (run.eval_due(step + 1)) {
      comm.set_train_step(-1);  // the evaluation's collectives (FSDP's gathers ...) are not the iteration's traffic
      mode->before_periodic_evaluation();
    }
    periodic_eval(step, epoch);
    return true;
  }

  void record(StepRecord& rec, const StepCount& count, int64_t step, int64_t epoch, int64_t bi) {
    rec.rank = rank;
    rec.step = step;
    rec.epoch = epoch;
    rec.batch = bi;
    rec.bytes_sent = comm.bytes_sent();
    rec.t = now_seconds() - run.m_t0;
    // BatchNorm's statistics: every step where the host holds them; from a device that keeps them
    // (executor.h: residency), the steps bn_stats.bin records.
    if (count.record_bn && (model.host_holds(kStateBuffers) || bn_recorded(c.record_bn, step, epoch))) {
      model.to_host(kStateBuffers);
      rec.bn = bn_layer_records(bns, bn_index, c.track_running_stats);
    }
    if (c.nondeterministic) {
      model.to_host(kStateParams);  // (never on a device today: --nondeterministic is the CPU's)
      double sum = 0;
      for (const Param* p : model.params())
        for (float v : p->value.data) sum += v;
      rec.param_checksum = sum;
    }
    std::lock_guard<std::mutex> lock(rs.mu);
    if (count.counts) {
      rs.loss_sum += rec.loss;
      rs.correct += rec.correct;
      rs.samples += count.samples;
      rs.steps += 1;
    }
    rs.trained_samples += count.trained;
    if (rec.param_drift >= 0) rs.drifts.emplace_back(step, rec.param_drift);
    if (rec.skipped) rs.skipped.push_back(step);
    if (!rec.nonfinite.empty()) rs.nonfinite.emplace_back(step, rec.nonfinite);
    rs.note_memory(rec);
    rs.latest = std::make_shared<const StepRecord>(rec);
    rs.pending.push_back(std::move(rec));
  }

  // Periodic evaluation (eval_every) of a copy of rank 0's model after iteration `step`.
  void periodic_eval(int64_t step, int64_t epoch) {
    if (rank != 0 || !run.eval_due(step + 1)) return;
    EvalPoint p = comm.timed(Phase::Eval, "periodic eval", step, [&] { return run.evaluate_point(model, step + 1, epoch); });
    std::lock_guard<std::mutex> lock(run.m_epoch_mu);
    run.m_evals.push_back(std::move(p));
  }

  // End of epoch: evaluate like a DDP user does. Each rank evaluates a contiguous shard of the
  // test set in eval mode and the sums are allreduced; rank 0 records the epoch's figures.
  void end_epoch(int64_t epoch, int64_t step) {
    comm.set_train_step(-1);
    mode->before_evaluation();
    const int world = c.world_size;
    const int64_t L = run.m_test.size;
    const double t_eval = now_seconds();
    EvalResult mine = comm.timed(Phase::Eval, "eval", -1, [&] {
      return run.evaluate(model, Mode::Eval, c.eval_batch_size, L * rank / world, L * (rank + 1) / world);
    });
    float sums[4] = {static_cast<float>(mine.loss * static_cast<double>(mine.samples)),
                     static_cast<float>(mine.acc * static_cast<double>(mine.samples)),
                     static_cast<float>(mine.samples), 0.0f};
    {
      std::lock_guard<std::mutex> lock(rs.mu);
      sums[3] = static_cast<float>(rs.loss_sum);
    }
    comm.allreduce_sum(sums, 4, CollectiveInfo{"eval sums", -1});
    // Train metrics come from every rank's counters.
    const EpochCounters counters = run.epoch_counters(rank, transport);
    if (rank == 0) {
      EpochRecord e;
      e.epoch = epoch;
      e.steps = step;
      e.train_loss = counters.steps ? sums[3] / static_cast<double>(counters.steps) : 0.0;
      e.train_acc = counters.samples ? static_cast<double>(counters.correct) / static_cast<double>(counters.samples) : 0.0;
      e.test_loss = sums[2] > 0 ? sums[0] / sums[2] : 0.0;
      e.test_acc = sums[2] > 0 ? sums[1] / sums[2] : 0.0;
      e.seconds = t_eval - t_epoch0;  // training only: evaluation starts at t_eval
      e.samples_per_s = e.seconds > 0 ? static_cast<double>(counters.samples) / e.seconds : 0.0;
      e.lr = opt.lr();
      std::lock_guard<std::mutex> lock(run.m_epoch_mu);
      run.m_epochs.push_back(e);
    }
    // All ranks read their counters before anyone resets them.
    float dummy = 0;
    comm.allreduce_sum(&dummy, 1, CollectiveInfo{"epoch barrier", -1});
    std::lock_guard<std::mutex> lock(rs.mu);
    rs.loss_sum = 0;
    rs.correct = rs.samples = rs.steps = 0;
    schedule.step();  // scheduler.step() at the end of the epoch
    opt.set_lr(schedule.lr());
  }
};

void Run::rank_main(int rank) {
  RankLoop* loop = nullptr;
  std::unique_ptr<RankLoop> owned;
  try {
    owned = std::make_unique<RankLoop>(*this, rank);
    loop = owned.get();
    loop->setup();
    loop->train();
  } catch (const StopRequested&) {
  } catch (const CommError& e) {
    // A worker whose parameter server was stopped meets a closed transport: not a failure.
    if (!(mode_of(m_cfg).caps().parameter_server && m_control->stopped())) fail_rank(rank, e, true);
  } catch (const std::exception& e) {
    fail_rank(rank, e, false);
  }
  (void)loop;
  --m_running;
}

// ---- the parameter server's thread (modes with caps().parameter_server) ----

void Run::server_main() {
  Transport& transport = m_world->transport(m_cfg.world_size);
  try {
    ServerEnv env{m_cfg, *m_server_model, transport, m_test, m_steps_per_epoch, m_steps_total, epochs_total(), {}, {}};
    env.record_epoch = [this](const EpochRecord& e) {
      std::lock_guard<std::mutex> lock(m_epoch_mu);
      m_epochs.push_back(e);
    };
    env.record_update = [this](int worker, int64_t staleness) {
      std::lock_guard<std::mutex> lock(m_async_mu);
      m_async_updates.emplace_back(worker, staleness);
    };
    mode_of(m_cfg).serve(env);
  } catch (const std::exception& e) {
    // Stopped, or a worker failed (its own error is the root cause): nothing to add. Otherwise the
    // server's own failure (a worker that stopped answering times it out) ends every worker.
    const auto* le = dynamic_cast<const Error*>(&e);
    {
      std::lock_guard<std::mutex> lock(m_err_mu);
      if (!m_control->stopped() && m_root_code == 0) {
        m_root_rank = -1;
        m_root_code = le ? le->exit_code() : kExitFailure;
        m_root_what = std::string("the parameter server failed: ") + e.what();
        m_root_hint = le ? le->hint() : "";
      }
    }
    transport.abort(std::string("the parameter server failed: ") + e.what());
  }
  m_server_done = true;
  --m_running;
}

// ---- evaluation during the run ----

// Periodic evaluation points: after every eval_every iterations, after 1, 2, 4, ... iterations
// before the first of those (running statistics change fastest at the start), and after the last.
bool Run::eval_due(int64_t steps_done) const {
  const int64_t k = m_cfg.eval_every;
  if (k <= 0 || steps_done <= 0) return false;
  if (steps_done % k == 0 || steps_done == m_steps_total) return true;
  return steps_done < k && (steps_done & (steps_done - 1)) == 0;
}

EvalPoint Run::evaluate_point(Model& model, int64_t steps_done, int64_t epoch) {
  EvalPoint p;
  p.steps = steps_done;
  p.epoch = epoch;
  const int64_t n = std::min(m_cfg.eval_samples, m_test.size);
  copy_state(model, *m_eval_model);
  // Eval mode first: train mode then updates the copy's running statistics, never the model's.
  p.eval_mode = evaluate(*m_eval_model, Mode::Eval, m_cfg.eval_batch_size, 0, n, &p.probe_eval);
  p.train_mode = evaluate(*m_eval_model, Mode::Train, m_cfg.batch_size, 0, n, &p.probe_train);
  p.samples = n;
  p.probe_label = n > 0 ? m_test.labels[0] : -1;
  return p;
}

EvalResult Run::evaluate(Model& model, Mode mode, int64_t batch_size, int64_t begin, int64_t end,
                         std::vector<float>* first_probs) {
  EvalOutputs out;
  out.first_probs = first_probs;
  return lab::evaluate(model, mode, m_test, batch_size, begin, end, out);
}

}  // namespace lab
