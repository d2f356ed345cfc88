// Run: sections
//   1. construction: the world, the data and the schedule, the replicas, the run directory, the
//      control (validation first; every input is checked before anything trains)
//   2. start / poll / run: the rank threads (rank_loop.cpp) and the parameter server's, draining
//      finished steps into the run directory in (step, rank) order, the snapshot for display
//   3. finish: joining, the last records, the trace, errors (diagnosis.cpp), the figures and the
//      outputs (run_summary.cpp)
// Checkpoints and resume: run_checkpoint.cpp; ranks in other processes: run_remote.cpp; the device:
// run_device.cpp. The mode (lab/modes/mode.h) does what differs between DDP, DataParallel, ...
#include "run.h"
#include "run_internal.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <deque>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "errors.h"
#include "gemm.h"
#include "link_model.h"
#include "mode.h"
#include "parallel.h"
#include "run_dir.h"
#include "safetensors.h"
#include "sampler.h"

namespace lab {

const char* run_state_name(RunState s) {
  switch (s) {
    case RunState::Created: return "created";
    case RunState::Running: return "running";
    case RunState::Paused: return "paused";
    case RunState::Finished: return "finished";
    case RunState::Failed: return "failed";
  }
  return "?";
}

ModelOptions model_options(const RunConfig& c) {
  ModelOptions m;
  m.name = c.model;
  m.bn.eps = c.bn_eps;
  m.bn.momentum = c.bn_momentum;
  m.bn.track_running_stats = c.track_running_stats;
  if (!c.batchnorm) m.make_batchnorm = [](int, int) -> std::unique_ptr<Module> { return nullptr; };
  return m;
}

// ---- 1. construction ----

Run::Run(const RunConfig& cfg, const WorldFactory& make_world) : m_cfg(cfg) {
  validate(m_cfg);
  mode_of(m_cfg).resolve(m_cfg);  // what the mode derives (the pipeline's stage map) is in config.toml
  make_ranks(make_world);
  // A run is never written over another unasked (run_dir.h); a resumed run continues its own
  // directory, or a copy in a new one (--out elsewhere).
  if (!m_cfg.out_dir.empty() && is_local(0)) {
    std::error_code ec;
    const bool continues_in_place = !m_cfg.resume.empty() && std::filesystem::equivalent(m_cfg.resume, m_cfg.out_dir, ec);
    if (!continues_in_place) prepare_out_dir(m_cfg.out_dir, m_cfg.overwrite);
  }
  load_data();
  build_replicas();
  open_run_dir();
  set_up_control();
  auto s = std::make_shared<Snapshot>();
  s->steps_total = m_steps_total;
  s->steps_per_epoch = m_steps_per_epoch;
  s->latest.resize(static_cast<size_t>(m_cfg.world_size));
  m_snapshot = s;
}

// The world first: which ranks this process drives decides what it builds and writes. A mode
// with a parameter server has one more transport: the server's.
void Run::make_ranks(const WorldFactory& make_world) {
  {
    RunConfig wc = m_cfg;
    if (mode_of(m_cfg).caps().parameter_server) wc.world_size += 1;
    m_world = make_world(wc);
  }
  if (m_cfg.link_model())  // --link-latency-us / --link-gbps (nodes, leaves): a simulated network (link_model.h)
    m_world = std::make_unique<LinkModelWorld>(std::move(m_world), link_model_options(m_cfg));
  m_local = m_world->local_ranks();
  m_local.erase(std::remove_if(m_local.begin(), m_local.end(), [&](int r) { return r >= m_cfg.world_size; }),
                m_local.end());  // the server is not a training rank
  std::sort(m_local.begin(), m_local.end());
  m_is_local.assign(static_cast<size_t>(m_cfg.world_size), 0);
  for (int r : m_local) m_is_local[static_cast<size_t>(r)] = 1;
}

// The data, and the run's length in iterations.
void Run::load_data() {
  const std::string dir = m_cfg.data_dir.empty() ? kDefaultDataDir : m_cfg.data_dir;
  m_cfg.data_dir = dir;
  m_train = load_fashion_mnist(dir, true, m_cfg.limit_train);
  m_test = load_fashion_mnist(dir, false, m_cfg.limit_test);
  const int world = m_cfg.world_size;
  // Batches per epoch, identical on every rank (DistributedSampler gives each the same count; a
  // mode without it has one loader over the whole training set: global batches; a mode of one
  // loader per data-parallel replica, a DistributedSampler over the --dp replicas).
  const ModeCaps caps = mode_of(m_cfg).caps();
  const int shards = caps.distributed_sampler ? world : caps.one_loader ? std::max(1, m_cfg.dp) : 1;
  DistributedSampler probe({m_train.size, shards, 0, m_cfg.shuffle, m_cfg.seed, m_cfg.sampler_drop_last});
  const int64_t per_rank = probe.num_samples();
  m_steps_per_epoch = batches_per_epoch(per_rank, m_cfg.batch_size, m_cfg.drop_last);
  if (m_steps_per_epoch == 0)
    throw ConfigError("no training step: each rank gets " + std::to_string(probe.num_samples()) +
                          " samples, fewer than --batch-size " + std::to_string(m_cfg.batch_size) + " with --drop-last",
                      "lower --batch-size or drop --drop-last");
  // --epochs and --steps: whichever limit is reached first ends the run (Lightning's max_epochs and
  // max_steps); --steps alone (epochs 0) runs as many epochs as it takes.
  m_steps_total = m_cfg.epochs > 0 ? m_steps_per_epoch * m_cfg.epochs : m_cfg.steps;
  if (m_cfg.steps > 0 && m_cfg.steps < m_steps_total) m_steps_total = m_cfg.steps;
  if (m_cfg.steps > m_steps_total)
    m_notes.push_back("--steps " + std::to_string(m_cfg.steps) + " is more than --epochs " + std::to_string(m_cfg.epochs) +
                      " holds (" + std::to_string(m_steps_per_epoch) + " iterations per epoch): the run stops after " +
                      std::to_string(m_steps_total) + " iterations, at the end of epoch " + std::to_string(m_cfg.epochs) +
                      " (the first limit reached)");
  // --uneven-data: rank r drops the last r batches of its shard every epoch; all must keep one.
  if (m_cfg.uneven_data && m_steps_per_epoch < world)
    throw ConfigError("--uneven-data: rank " + std::to_string(world - 1) + " would drop its last " +
                          std::to_string(world - 1) + " batches of " + std::to_string(m_steps_per_epoch) +
                          " and have none left",
                      "use more data (--limit-train) or a smaller --batch-size");
}

void Run::build_replicas() {
  for (int r = 0; r < m_cfg.world_size; ++r) {
    // Ranks of other processes get their replica (their final state) in gather_to_rank0.
    m_replicas.push_back(is_local(r) ? build_model(model_options(m_cfg), m_cfg.seed) : nullptr);
    m_logs.push_back(std::make_unique<EventLog>());
    m_ranks.push_back(std::make_unique<RankState>());
  }
  // --device: every local replica gets its rank's executor now, so that a missing GPU or backend
  // fails the run before anything is written (executor.h).
  for (int r : m_local) attach_device(*m_replicas[static_cast<size_t>(r)], r);
  if (!m_cfg.resume.empty()) load_resume();  // --resume: the checkpoint (run_checkpoint.cpp)
  if (!m_cfg.init.empty() && is_local(0) && !m_resume) {
    // Loaded on rank 0 only: DDP's initial broadcast gives it to everyone, as in PyTorch when
    // only rank 0 loads a checkpoint.
    load_model_tensors(*m_replicas[0], read_safetensors(m_cfg.init), m_cfg.init);
  }
  if (m_cfg.eval_every > 0) {
    m_eval_model = build_model(model_options(m_cfg), m_cfg.seed);
    attach_device(*m_eval_model, 0);
  }
  if (mode_of(m_cfg).caps().parameter_server) {
    m_server_model = build_model(model_options(m_cfg), m_cfg.seed);
    if (!m_cfg.init.empty()) load_model_tensors(*m_server_model, read_safetensors(m_cfg.init), m_cfg.init);
  }
}

void Run::open_run_dir() {
  if (m_cfg.out_dir.empty() || !is_local(0)) return;  // only rank 0's process writes
  if (m_resume) {  // continue its files from their sizes at the checkpoint
    const RunDirSizes keep{m_resume->state.metrics_bytes, m_resume->state.bn_stats_bytes};
    m_dir = std::make_unique<RunDir>(m_cfg.out_dir, &keep);
  } else {
    m_dir = std::make_unique<RunDir>(m_cfg.out_dir);
  }
  m_dir->set_bn_stats(m_cfg.world_size, m_cfg.record_bn);
  m_dir->set_record_memory(m_cfg.record_memory);
  m_dir->write_text("config.toml", to_toml(m_cfg, backends()));
}

void Run::set_up_control() {
  const int world = m_cfg.world_size;
  m_errors.assign(static_cast<size_t>(world), "");
  m_control = std::make_unique<RunControl>(world);
  std::vector<int> transports = m_local;
  if (m_server_model) transports.push_back(world);  // the parameter server's
  for (int r : transports) {
    m_world->transport(r).set_timeout(m_cfg.timeout_s);
    m_world->transport(r).set_hold_flag(m_control->hold_flag());
  }
  const FaultPlan faults = FaultPlan::from(m_cfg);
  if (faults.rank >= 0 && faults.at == "allreduce") {
    m_control->on_ring_step = [faults](int rank, const Event& e) {
      if (rank == faults.rank && e.train_step == faults.step && std::strcmp(e.what, "grad bucket") == 0 && e.ring_step == 1)
        throw InjectedFailure("injected failure in " + std::string(e.op) + " #" + std::to_string(e.op_seq) +
                              " (grad bucket " + std::to_string(e.tag) + ") before ring step 1 (--fail-at allreduce)");
    };
  }
  // Several processes with a run directory: the ranks vote every iteration on whether to stop there
  // (Ctrl-C in any process), so that every rank checkpoints at the same iteration.
  m_stop_vote = !m_cfg.out_dir.empty() && m_local.size() < static_cast<size_t>(world) && checkpointable(m_cfg);
}

Run::~Run() {
  if (!m_threads.empty() && !m_finished) {
    m_control->stop();
    for (int r : m_local) m_world->transport(r).abort("the run was destroyed");
    for (auto& t : m_threads)
      if (t.joinable()) t.join();
  }
  if (m_server.joinable()) {
    m_world->transport(m_cfg.world_size).abort("the run was destroyed");
    m_server.join();
  }
}

std::vector<std::pair<std::string, std::string>> Run::backends() const {
  // validate() accepted m_cfg.allreduce: ring, naive, tree, or mpi / nccl (the transport's own)
  std::vector<std::pair<std::string, std::string>> b{
      {"sgemm", gemm_backend_name()}, {"transport", m_cfg.comm}, {"allreduce", m_cfg.allreduce}};
  if (!m_device_name.empty()) b.insert(b.begin(), {"device", m_device_name});
  return b;
}

// ---- 2. start / poll / run ----

void Run::start() {
  const int world = m_cfg.world_size;
  const int hw = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int threads = m_cfg.threads > 0 ? m_cfg.threads : hw;
  // Ranks are threads: each computes on its own thread; one rank may use them all (parallel.h).
  // Both hold until the run is let go (~Run), then the process's earlier values come back.
  m_compute_settings = std::make_unique<ComputeSettingsScope>(world == 1 ? threads : 1, m_cfg.nondeterministic);
  m_t0 = now_seconds() - (m_resume ? m_resume->elapsed : 0.0);  // a resumed run's clock goes on
  m_running = static_cast<int>(m_local.size());
  if (m_server_model) {
    ++m_running;
    m_server = std::thread([this] { server_main(); });
  }
  for (int r : m_local) m_threads.emplace_back([this, r] { rank_main(r); });
}

void Run::publish() {
  auto s = std::make_shared<Snapshot>();
  s->steps_total = m_steps_total;
  s->steps_per_epoch = m_steps_per_epoch;
  for (auto& rs : m_ranks) {
    std::lock_guard<std::mutex> lock(rs->mu);
    s->latest.push_back(rs->latest ? *rs->latest : StepRecord{});
  }
  {
    std::lock_guard<std::mutex> lock(m_epoch_mu);
    s->epochs = m_epochs;
    s->evals = m_evals;
  }
  // Progress figure for display: full global batches per second since start.
  double elapsed = now_seconds() - m_t0;
  int64_t done = 0;
  for (const StepRecord& r : s->latest) done = std::max(done, r.step + (r.batch_size ? 1 : 0));
  s->samples_per_s = elapsed > 0 ? static_cast<double>(done) * static_cast<double>(global_batch(m_cfg)) / elapsed : 0;
  {
    std::lock_guard<std::mutex> lock(m_err_mu);
    if (m_root_code) s->error = m_root_what;
  }
  const bool running = m_running.load() > 0;
  s->state = !s->error.empty() ? RunState::Failed
             : running         ? (m_control->paused() ? RunState::Paused : RunState::Running)
             : m_threads.empty() ? RunState::Created
                                 : RunState::Finished;
  std::atomic_store(&m_snapshot, std::shared_ptr<const Snapshot>(std::move(s)));
}

bool Run::poll() {
  // Write every step that all ranks have finished, in (step, rank) order, so metrics.jsonl is
  // identical from run to run whatever the thread scheduling.
  std::vector<std::deque<StepRecord>> taken(m_ranks.size());
  {
    std::lock_guard<std::mutex> drain(m_drain_mu);  // not while a checkpoint takes the pending records
    int64_t complete = INT64_MAX;
    for (auto& rs : m_ranks) {
      std::lock_guard<std::mutex> lock(rs->mu);
      complete = std::min<int64_t>(complete, rs->pending.empty() ? -1 : rs->pending.back().step);
    }
    std::vector<StepRecord> out;
    for (size_t r = 0; r < m_ranks.size(); ++r) {
      std::lock_guard<std::mutex> lock(m_ranks[r]->mu);
      auto& p = m_ranks[r]->pending;
      while (!p.empty() && p.front().step <= complete) {
        taken[r].push_back(std::move(p.front()));
        p.pop_front();
      }
    }
    for (int64_t s = taken.empty() || taken[0].empty() ? 0 : taken[0].front().step; s <= complete; ++s)
      for (size_t r = 0; r < taken.size(); ++r)
        if (!taken[r].empty() && taken[r].front().step == s) {
          out.push_back(std::move(taken[r].front()));
          taken[r].pop_front();
        }
    if (!out.empty() && m_dir) m_dir->append_steps(out);
    if (!out.empty() && m_step_sink) m_step_sink(out);
  }
  publish();
  return m_running.load() == 0;
}

const RunSummary& Run::run(const std::function<void(const Snapshot&)>& tick) {
  start();
  while (!poll()) {
    if (tick) tick(*snapshot());
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  if (tick) tick(*snapshot());
  return finish();
}

// ---- 3. finish ----

const RunSummary& Run::finish() {
  join_threads();
  std::vector<std::vector<Event>> events(m_logs.size());
  const double t_end = write_records(events);
  publish();
  throw_if_failed();  // diagnosis.cpp
  summarize(events, t_end);
  if (!is_local(0)) return m_summary;  // rank 0's process evaluates and writes the outputs
  const std::vector<int> differing = final_evaluation();
  const ComputeStats cs = communication(events);
  write_outputs(events, differing, cs);  // summary.json's document; the files with a run directory
  return m_summary;
}

void Run::join_threads() {
  for (auto& t : m_threads)
    if (t.joinable()) t.join();
  if (m_server.joinable()) {
    // The workers are gone: a server still waiting for one of them (stopped, or failed) stops too.
    if (!m_server_done) m_world->transport(m_cfg.world_size).abort("the workers stopped");
    m_server.join();
  }
  if (m_server_model && !m_root_code)  // every worker ends with the server's final model
    for (int r : m_local) copy_state(*m_server_model, *m_replicas[static_cast<size_t>(r)]);
  m_finished = true;
}

// The records poll() has not written (a failed run leaves ranks at different steps) in (step,
// rank) order, the epochs and evaluations, and the trace. Fills every rank's events; returns the
// time the training ended.
double Run::write_records(std::vector<std::vector<Event>>& events) {
  std::vector<StepRecord> rest;
  for (auto& rs : m_ranks)
    for (auto& r : rs->pending) rest.push_back(std::move(r));
  std::stable_sort(rest.begin(), rest.end(), [](const StepRecord& a, const StepRecord& b) {
    return a.step != b.step ? a.step < b.step : a.rank < b.rank;
  });
  if (!rest.empty() && m_dir) m_dir->append_steps(rest);
  if (m_dir) m_dir->flush_bn();
  if (!rest.empty() && m_step_sink) m_step_sink(rest);
  for (auto& rs : m_ranks) rs->pending.clear();
  if (m_dir) {
    for (const EpochRecord& e : m_epochs) m_dir->append_epoch(e);
    for (const EvalPoint& p : m_evals) m_dir->append_eval(p);
  }
  const double t_end = now_seconds();
  for (size_t r = 0; r < m_logs.size(); ++r) m_logs[r]->copy_since(0, events[r]);
  if (m_dir) {
    nlohmann::json meta = {{"producer", std::string("dtlab ") + kDtlabVersion},
                           {"format_version", kRunDirFormatVersion},
                           {"world_size", m_cfg.world_size},
                           {"model", m_cfg.model},
                           {"trace_steps", m_cfg.trace_steps},
                           {"train_samples", m_train.size},
                           {"test_samples", m_test.size}};
    m_dir->write_trace(trace_events(events), m_cfg.trace_steps, meta);
  }
  return t_end;
}

}  // namespace lab
