// Run: sections
//   1. RunControl (pause / single-step gates)
//   2. per-rank state, SyncBN adapter
//   3. Run construction (validation, data, replicas, simulated link)
//   4. rank_main: the training loop of one rank: DDP (with overlap, no_sync, join), local SGD,
//      and DataParallel's devices (data_parallel.h)
//   5. poll / finish: metrics draining, final evaluation, outputs, error reporting (uneven inputs)
//   6. ranks in other processes: epoch counters and the end-of-run gather to rank 0
#include "run.h"
#include "run_internal.h"

#include <algorithm>
#include <cassert>
#include <chrono>
#include <cmath>
#include <cstring>
#include <deque>
#include <filesystem>
#include <numeric>
#include <sstream>

#include "comm_worker.h"
#include "data_parallel.h"
#include "ddp.h"
#include "errors.h"
#include "gemm.h"
#include "join.h"
#include "link_model.h"
#include "local_sgd.h"
#include "mutation.h"
#include "lr_schedule.h"
#include "parallel.h"
#include "optim.h"
#include "run_dir.h"
#include "run_wire.h"
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

// ---- 1. RunControl ----

RunControl::RunControl(int world_size) : m_ring_tokens(static_cast<size_t>(world_size), 0),
                                         m_iter_tokens(static_cast<size_t>(world_size), 0),
                                         m_iteration(static_cast<size_t>(world_size), -1) {}

void RunControl::pause() {
  std::lock_guard<std::mutex> lock(m_mu);
  m_paused = true;
  std::fill(m_ring_tokens.begin(), m_ring_tokens.end(), 0);
  std::fill(m_iter_tokens.begin(), m_iter_tokens.end(), 0);
  m_until = nullptr;
}

void RunControl::run_until(StopFn stop) {
  {
    std::lock_guard<std::mutex> lock(m_mu);
    m_until = std::move(stop);
  }
  m_cv.notify_all();
}

void RunControl::set_delay(double seconds) {
  {
    std::lock_guard<std::mutex> lock(m_mu);
    m_delay = seconds > 0 ? seconds : 0;
  }
  m_cv.notify_all();
}

double RunControl::delay() const {
  std::lock_guard<std::mutex> lock(m_mu);
  return m_delay;
}

std::vector<int64_t> RunControl::iterations() const {
  std::lock_guard<std::mutex> lock(m_mu);
  return m_iteration;
}

void RunControl::resume() {
  {
    std::lock_guard<std::mutex> lock(m_mu);
    m_paused = false;
  }
  m_cv.notify_all();
}

void RunControl::step_ring(int n) {
  {
    std::lock_guard<std::mutex> lock(m_mu);
    for (int& t : m_ring_tokens) t += n;
  }
  m_cv.notify_all();
}

void RunControl::step_iteration(int n) {
  {
    std::lock_guard<std::mutex> lock(m_mu);
    for (int& t : m_iter_tokens) t += n;
  }
  m_cv.notify_all();
}

void RunControl::stop() {
  {
    std::lock_guard<std::mutex> lock(m_mu);
    m_stop = true;
  }
  m_cv.notify_all();
}

bool RunControl::stopped() const {
  std::lock_guard<std::mutex> lock(m_mu);
  return m_stop;
}

// A paused rank blocks at every gate. A ring token lets it pass one ring gate (and any iteration
// gates on the way to it); an iteration token lets it pass one iteration gate (and the ring gates
// inside that iteration); a run_until predicate lets it pass every gate it does not stop at.
// A rank that passes waits the slow-motion delay first (interrupted only by stop()).
void RunControl::wait_gate(int rank, const Event* next) {
  std::unique_lock<std::mutex> lock(m_mu);
  const size_t r = static_cast<size_t>(rank);
  const bool ring = next != nullptr;
  for (;;) {
    if (m_stop) throw StopRequested{};
    if (!m_paused) break;
    if (m_until && !m_until(rank, m_iteration[r], next)) break;
    if (ring) {
      if (m_ring_tokens[r] > 0) {
        --m_ring_tokens[r];
        break;
      }
      if (m_iter_tokens[r] > 0) break;
    } else {
      if (m_iter_tokens[r] > 0) {
        --m_iter_tokens[r];
        break;
      }
      if (m_ring_tokens[r] > 0) break;
    }
    m_cv.wait(lock);
  }
  if (m_delay > 0) {
    m_cv.wait_for(lock, std::chrono::duration<double>(m_delay), [&] { return m_stop; });
    if (m_stop) throw StopRequested{};
  }
}

void RunControl::before_step(int rank, const Event& next) {
  if (on_ring_step) on_ring_step(rank, next);
  wait_gate(rank, &next);
}

int64_t RunControl::request_checkpoint_stop() {
  std::lock_guard<std::mutex> lock(m_mu);
  if (m_checkpoint_stop == INT64_MAX) {
    // Under the lock the gates update m_iteration with: no rank can be past the stop.
    int64_t at = -1;
    for (int64_t i : m_iteration) at = std::max(at, i);
    m_checkpoint_stop = at + 1;
  }
  return m_checkpoint_stop;
}

void RunControl::set_checkpoint_stop(int64_t step) {
  std::lock_guard<std::mutex> lock(m_mu);
  m_checkpoint_stop = std::min(m_checkpoint_stop, step);
}

int64_t RunControl::checkpoint_stop() const {
  std::lock_guard<std::mutex> lock(m_mu);
  return m_checkpoint_stop;
}

void RunControl::before_iteration(int rank, int64_t step) {
  {
    std::lock_guard<std::mutex> lock(m_mu);
    m_iteration[static_cast<size_t>(rank)] = step;
  }
  wait_gate(rank, nullptr);
}

// ---- 2. per-rank state ----


namespace {

// SyncBatchNorm's collectives for one BatchNorm layer, recorded under its module index.
// With overlapping DDP, bucket allreduces may be running on the rank's CommWorker: wait for them
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

 private:
  Communicator& m_comm;
  int m_index;
  CommWorker* m_worker;
};

}  // namespace

namespace {
bool all_finite(const Tensor& t) {
  float acc = 0;  // NaN and inf survive a sum times zero; finite values give 0
  for (float v : t.data) acc += v * 0.0f;
  return acc == 0.0f;
}
std::string nonfinite_kind(const Tensor& t) {
  for (float v : t.data)
    if (std::isnan(v)) return "NaN";
  return "infinite";
}
}  // namespace

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
  if (c.bn == "local" && c.world_size > 1 && c.mode != "async")
    fixes += ", or --bn sync (SyncBatchNorm: the statistics of every rank's samples of the step, " +
             std::to_string(c.world_size) + " values per channel or more)";
  return s + ". To avoid it, " + fixes;
}

// The configuration's schedule; cosine's T_max defaults to the epochs this run trains.
LrScheduleOptions lr_schedule_options(const RunConfig& c, int64_t epochs) {
  LrScheduleOptions o;
  o.kind = c.lr_schedule;
  o.lr = c.lr;
  o.t_max = c.lr_t_max > 0 ? c.lr_t_max : std::max<int64_t>(1, epochs);
  o.eta_min = c.lr_min;
  o.step_size = c.lr_step_size;
  o.gamma = c.lr_gamma;
  return o;
}

// ---- 3. construction ----

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

ModelOptions model_options(const RunConfig& c) {
  ModelOptions m;
  m.name = c.model;
  m.bn.eps = c.bn_eps;
  m.bn.momentum = c.bn_momentum;
  m.bn.track_running_stats = c.track_running_stats;
  return m;
}

Run::Run(const RunConfig& cfg, const WorldFactory& make_world) : m_cfg(cfg) {
  validate(m_cfg);
  // The world first: which ranks this process drives decides what it builds and writes. With
  // --mode async it has one more transport: the parameter server's (run_async.cpp).
  const bool async = m_cfg.mode == "async";
  {
    RunConfig wc = m_cfg;
    if (async) wc.world_size += 1;
    m_world = make_world(wc);
  }
  if (m_cfg.link_model())  // --link-latency-us / --link-gbps: a simulated network (link_model.h)
    m_world = std::make_unique<LinkModelWorld>(std::move(m_world),
                                               link_model_options(m_cfg.link_latency_us, m_cfg.link_gbps));
  m_local = m_world->local_ranks();
  m_local.erase(std::remove_if(m_local.begin(), m_local.end(), [&](int r) { return r >= m_cfg.world_size; }),
                m_local.end());  // the server is not a training rank
  std::sort(m_local.begin(), m_local.end());
  m_is_local.assign(static_cast<size_t>(m_cfg.world_size), 0);
  for (int r : m_local) m_is_local[static_cast<size_t>(r)] = 1;
  // A run is never written over another unasked (run_dir.h); a resumed run continues its own
  // directory, or a copy in a new one (--out elsewhere).
  if (!m_cfg.out_dir.empty() && is_local(0)) {
    std::error_code ec;
    const bool continues_in_place = !m_cfg.resume.empty() && std::filesystem::equivalent(m_cfg.resume, m_cfg.out_dir, ec);
    if (!continues_in_place) prepare_out_dir(m_cfg.out_dir, m_cfg.overwrite);
  }
  const std::string dir = m_cfg.data_dir.empty() ? kDefaultDataDir : m_cfg.data_dir;
  m_cfg.data_dir = dir;
  // Every input is checked before any training starts: data, init weights, run directory.
  m_train = load_fashion_mnist(dir, true, m_cfg.limit_train);
  m_test = load_fashion_mnist(dir, false, m_cfg.limit_test);

  const int world = m_cfg.world_size;
  // Batches per epoch, identical on every rank (DistributedSampler gives each the same count).
  DistributedSampler probe({m_train.size, world, 0, m_cfg.shuffle, m_cfg.seed, m_cfg.sampler_drop_last});
  m_steps_per_epoch = batches_per_epoch(probe.num_samples(), m_cfg.batch_size, m_cfg.drop_last);
  if (m_cfg.mode == "dp")  // one DataLoader over the whole training set, global batches
    m_steps_per_epoch = batches_per_epoch(m_train.size, m_cfg.batch_size, m_cfg.drop_last);
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

  for (int r = 0; r < world; ++r) {
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
  if (!m_cfg.out_dir.empty() && is_local(0)) {  // only rank 0's process writes
    if (m_resume) {  // continue its files from their sizes at the checkpoint
      const RunDirSizes keep{m_resume->state.metrics_bytes, m_resume->state.bn_stats_bytes};
      m_dir = std::make_unique<RunDir>(m_cfg.out_dir, &keep);
    } else {
      m_dir = std::make_unique<RunDir>(m_cfg.out_dir);
    }
    m_dir->set_bn_stats(m_cfg.world_size, m_cfg.record_bn);
    m_dir->write_text("config.toml", to_toml(m_cfg, backends()));
  }
  if (m_cfg.eval_every > 0) {
    m_eval_model = build_model(model_options(m_cfg), m_cfg.seed);
    attach_device(*m_eval_model, 0);
  }
  m_errors.assign(static_cast<size_t>(world), "");
  m_control = std::make_unique<RunControl>(world);
  for (int r : m_local) {
    m_world->transport(r).set_timeout(m_cfg.timeout_s);
    m_world->transport(r).set_hold_flag(m_control->hold_flag());
  }
  if (async) {
    m_server_model = build_model(model_options(m_cfg), m_cfg.seed);
    if (!m_cfg.init.empty()) load_model_tensors(*m_server_model, read_safetensors(m_cfg.init), m_cfg.init);
    m_world->transport(world).set_timeout(m_cfg.timeout_s);
    m_world->transport(world).set_hold_flag(m_control->hold_flag());
  }
  if (m_cfg.fail_rank >= 0 && m_cfg.fail_at == "allreduce") {
    const int fr = m_cfg.fail_rank;
    const int64_t fs = m_cfg.fail_step < 0 ? 0 : m_cfg.fail_step;
    m_control->on_ring_step = [fr, fs](int rank, const Event& e) {
      if (rank == fr && e.train_step == fs && std::strcmp(e.what, "grad bucket") == 0 && e.ring_step == 1)
        throw InjectedFailure("injected failure in " + std::string(e.op) + " #" + std::to_string(e.op_seq) +
                              " (grad bucket " + std::to_string(e.tag) + ") before ring step 1 (--fail-at allreduce)");
    };
  }
  m_stop_vote = !m_cfg.out_dir.empty() && m_local.size() < static_cast<size_t>(world) && m_cfg.mode != "async" &&
                !m_cfg.uneven_data && !m_cfg.join;
  auto s = std::make_shared<Snapshot>();
  s->steps_total = m_steps_total;
  s->steps_per_epoch = m_steps_per_epoch;
  s->latest.resize(static_cast<size_t>(world));
  m_snapshot = s;
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

void Run::start() {
  const int world = m_cfg.world_size;
  const int hw = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int threads = m_cfg.threads > 0 ? m_cfg.threads : hw;
  // Ranks are threads: each computes on its own thread; one rank may use them all (parallel.h).
  set_compute_threads(world == 1 ? threads : 1);
  set_nondeterministic(m_cfg.nondeterministic);
  m_t0 = now_seconds() - (m_resume ? m_resume->elapsed : 0.0);  // a resumed run's clock goes on
  m_running = static_cast<int>(m_local.size());
  if (m_cfg.mode == "async") {
    ++m_running;
    m_server = std::thread([this] { server_main(); });
  }
  for (int r : m_local) m_threads.emplace_back([this, r] { rank_main(r); });
}

// ---- 4. the training loop of one rank ----

void Run::rank_main(int rank) {
  if (m_cfg.mode == "async") return rank_main_async(rank);  // run_async.cpp
  const RunConfig& c = m_cfg;
  const int world = c.world_size;
  Model& model = *m_replicas[static_cast<size_t>(rank)];
  RankState& rs = *m_ranks[static_cast<size_t>(rank)];
  Transport& transport = m_world->transport(rank);
  Communicator comm(transport, m_logs[static_cast<size_t>(rank)].get(), m_control.get());
  comm.set_allreduce_algorithm(parse_allreduce_algorithm(c.allreduce));
  comm.set_arrival_order(c.nondeterministic);
  // DDP's communication thread (--overlap). Declared outside the try: it must outlive the error
  // handling below, which aborts the world and so ends a bucket allreduce blocked on a peer.
  CommWorker worker;
  try {
    std::vector<std::unique_ptr<CommBnSync>> syncs;
    std::vector<BatchNorm*> bns = model.batchnorms();
    std::vector<int> bn_index = model.batchnorm_module_index();
    if (c.bn == "sync") {
      for (size_t i = 0; i < bns.size(); ++i) {
        syncs.push_back(std::make_unique<CommBnSync>(comm, bn_index[i], &worker));
        bns[i]->set_sync(syncs.back().get());
      }
    }
    // DDP construction: rank 0's parameters and buffers everywhere (a resumed run has each rank's own).
    if (c.mode != "dp" && !m_resume) broadcast_state(model, comm);  // DataParallel replicates at every forward instead
    if (rank == 0 && m_dir && !m_resume)
      m_dir->write_weights("init.safetensors", model_tensors(model),
                           {{"format", "pt"}, {"producer", std::string("dtlab ") + kDtlabVersion}, {"rank", "0"}});
    BucketLaunch launch = c.overlap ? BucketLaunch::CommThread : BucketLaunch::AfterBackward;
    if (c.overlap && mutated("ddp-launch-after-backward")) launch = BucketLaunch::AfterBackward;  // lessons' mutation
    if (!c.overlap && mutated("ddp-no-overlap-in-hook")) launch = BucketLaunch::InHook;            // tests (mutation.h)
    DdpReducer reducer(model, comm, c.bucket_cap_mb, launch, &worker);
    SgdOptions so;
    so.lr = c.lr;
    so.momentum = c.momentum;
    so.weight_decay = c.weight_decay;
    so.nesterov = c.nesterov;
    Sgd opt(model.params(), so);
    const int64_t epochs = epochs_total();
    LrSchedule schedule(lr_schedule_options(c, epochs));
    DistributedSampler sampler({m_train.size, world, rank, c.shuffle, c.seed, c.sampler_drop_last});
    // ---- parallelism modes: DataParallel (data_parallel.h), local SGD (local_sgd.h), join (join.h) ----
    const bool dp = c.mode == "dp";
    const bool local_sgd = c.mode == "local-sgd";
    if (local_sgd) reducer.set_divide_in_hook(true);  // the post-localSGD hook divides the bucket
    DataParallelDevice dp_device(model, comm, opt);
    SingleProcessLoader dp_loader(m_train.size, c.batch_size, c.shuffle, c.drop_last, c.seed);
    PeriodicModelAverager averager(c.average_every, c.warmup_steps);
    DdpJoin join(model, comm, reducer, c.broadcast_buffers);
    // DataParallel's step line: device 0 holds the loss and accuracy over the global batch (and the
    // chunk sizes); every working device its own replica's BatchNorm statistics and chunk size.
    auto record_dp_step = [&](int64_t at_step, int64_t at_epoch, int64_t at_batch, const DpStepResult& r) {
      StepRecord rec;  // batch_size 0: idle this iteration (torch.chunk gave fewer chunks than devices)
      rec.rank = rank;
      rec.step = at_step;
      rec.epoch = at_epoch;
      rec.batch = at_batch;
      const int64_t global = std::accumulate(r.chunks.begin(), r.chunks.end(), int64_t{0});
      rec.batch_size = rank == 0 ? global : r.my_chunk;
      rec.loss = r.loss;
      rec.correct = r.correct;
      rec.bytes_sent = comm.bytes_sent();
      rec.t = now_seconds() - m_t0;
      if (rank == 0) rec.chunks = r.chunks;
      if (r.my_chunk > 0) rec.bn = bn_layer_records(bns, bn_index, c.track_running_stats);
      std::lock_guard<std::mutex> lock(rs.mu);
      if (rank == 0) {  // the epoch's train loss and accuracy come from device 0 alone
        rs.loss_sum += r.loss;
        rs.correct += r.correct;
        rs.samples += global;
        rs.steps += 1;
        rs.trained_samples += global;
      }
      rs.latest = std::make_shared<const StepRecord>(rec);
      rs.pending.push_back(std::move(rec));
    };
    // Periodic evaluation (eval_every) of a copy of rank 0's model after iteration `at_step`.
    auto periodic_eval = [&](int64_t at_step, int64_t at_epoch) {
      if (rank != 0 || !eval_due(at_step + 1)) return;
      EvalPoint p = comm.timed(Phase::Eval, "periodic eval", at_step, [&] { return evaluate_point(model, at_step + 1, at_epoch); });
      std::lock_guard<std::mutex> lock(m_epoch_mu);
      m_evals.push_back(std::move(p));
    };
    bool require_forward_param_sync = true;  // DDP: sync buffers before the next forward
    const bool broadcast_once = mutated("ddp-broadcast-once");  // a lesson's mutation test (mutation.h)
    const bool eval_no_broadcast = mutated("ddp-eval-no-broadcast");  // (mutation.h)
    const bool broadcast = c.broadcast_buffers || mutated("ddp-broadcast-ignores-flag");  // (mutation.h)
    const bool no_sync_allreduces = mutated("ddp-no-sync-allreduces");  // (mutation.h)
    const bool no_sync_broadcasts = mutated("ddp-no-sync-broadcasts");  // (mutation.h)
    const bool grad_overwrites = mutated("grad-accumulation-overwrites");  // (mutation.h)
    const bool bn_update_on_sync_only = mutated("bn-updates-on-sync-only");  // (mutation.h)
    Tensor x, dlogits;
    std::vector<int> labels;
    const std::vector<Param*> params = model.params();
    const std::vector<std::string> pnames = param_names(model);
    int64_t step = 0, first_epoch = 0;
    size_t first_batch = 0;
    bool stopped_at_checkpoint = false;
    double t_epoch0 = 0;
    RankCheckpointRefs refs{model, opt, reducer, averager, comm, schedule, dp_loader, require_forward_param_sync, t_epoch0};
    if (m_resume) {  // --resume: this rank as it was at the checkpoint (run_checkpoint.cpp)
      restore_rank(rank, refs);
      step = refs.step;
      first_epoch = refs.epoch;
      first_batch = static_cast<size_t>(refs.batch);
    }
    for (int64_t epoch = first_epoch; epoch < epochs && step < m_steps_total; ++epoch) {
      sampler.set_epoch(epoch);
      if (!(m_resume && epoch == first_epoch)) t_epoch0 = now_seconds();  // restore_rank set the resumed epoch's
      auto batches = dp ? dp_loader.next_epoch() : make_batches(sampler.indices(), c.batch_size, c.drop_last);
      if (c.uneven_data) batches.resize(batches.size() - static_cast<size_t>(rank));  // rank r drops r batches
      for (size_t bi = epoch == first_epoch ? first_batch : 0; bi < batches.size() && step < m_steps_total; ++bi, ++step) {
        m_control->before_iteration(rank, step);
        if (m_stop_vote) vote_on_stop(rank, step);  // several processes: did any get Ctrl-C / SIGTERM?
        if (checkpoint_due(step, bi)) {  // every rank saves its state before iteration `step` (run_checkpoint.cpp)
          refs.step = step;
          refs.epoch = epoch;
          refs.batch = static_cast<int64_t>(bi);
          write_checkpoint(rank, refs);
          if (step == m_control->checkpoint_stop()) {  // Ctrl-C (interrupt()): stop here, outputs as usual
            stopped_at_checkpoint = true;
            break;
          }
        }
        comm.set_train_step(step);
        const auto& idx = batches[bi];
        const int64_t n = static_cast<int64_t>(idx.size());
        gather_batch(m_train, idx, x, labels);
        if (n == 1)
          for (BatchNorm* b : bns) b->set_error_hint(batch_of_one_hint(c, rank, bi, epoch, sampler.num_samples()));
        // no_sync cycles (--no-sync-steps K): K local backward passes, then a synchronized one that
        // averages the accumulated sums and steps. Local SGD allreduces only during its warm-up.
        const bool synced = c.no_sync_steps == 0 || step % (c.no_sync_steps + 1) == c.no_sync_steps;
        const bool grad_allreduce =
            world > 1 && (synced || no_sync_allreduces) && (!local_sgd || post_local_sgd_allreduces(step, c.warmup_steps));
        if (c.join) join.before_forward(require_forward_param_sync, synced);  // buffers from the common rank
        else if (broadcast && require_forward_param_sync && !dp && !broadcast_once) broadcast_buffers(model, comm);
        const bool inject = rank == c.fail_rank && step == (c.fail_step < 0 ? 0 : c.fail_step);
        if (inject && c.fail_at == "forward") throw InjectedFailure("injected failure before forward (--fail-at forward)");
        if (inject && c.fail_at == "hang") {
          // A rank that stops answering: the others' next collective times out and names it.
          while (!transport.aborted()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
          throw StopRequested{};
        }
        if (dp) {  // nn.DataParallel: this device's part of one iteration (data_parallel.h)
          const DpStepResult r = dp_device.train_step(
              x, labels, n, "batch " + std::to_string(bi) + " of epoch " + std::to_string(epoch), [&] {
                if (inject && c.fail_at == "backward")
                  throw InjectedFailure("injected failure in backward (--fail-at backward)");
              });
          record_dp_step(step, epoch, static_cast<int64_t>(bi), r);
          periodic_eval(step, epoch);  // device 0 holds the module itself
          continue;
        }

        std::vector<Buffer> kept;  // (mutation bn-updates-on-sync-only: a no_sync forward's running statistics undone)
        if (bn_update_on_sync_only && !synced)
          for (BatchNorm* b : bns)
            for (Buffer* buf : b->buffers()) kept.push_back(*buf);
        const Tensor& logits = comm.timed(Phase::Forward, "forward", step, [&]() -> const Tensor& { return model.forward(x, Mode::Train); });
        if (!kept.empty()) {
          size_t k = 0;
          for (BatchNorm* b : bns)
            for (Buffer* buf : b->buffers()) *buf = kept[k++];
        }
        int correct = 0;
        const float loss = cross_entropy(logits, labels, &dlogits, &correct);
        if (inject && c.fail_at == "nan") dlogits.data[0] = NAN;  // --fail-at nan: a NaN enters this rank's backward
        std::string nonfinite;  // the first parameter whose local gradient is NaN or infinite

        // The backward event is the computation; waiting for the last buckets' allreduces (or,
        // with --no-overlap, running them all) follows it on the communication track.
        comm.timed(Phase::Backward, "backward", step, [&] {
          if (c.no_sync_steps == 0 || step % (c.no_sync_steps + 1) == 0 || grad_overwrites)
            model.zero_grad();  // no_sync accumulates
          if (grad_allreduce) reducer.prepare_for_backward();
          bool first_grad = true;
          model.backward(dlogits, [&](int i) {
            if (inject && c.fail_at == "backward" && first_grad)
              throw InjectedFailure("injected failure in backward (--fail-at backward)");
            first_grad = false;
            // Before DDP copies it into a bucket: a non-finite gradient is caught on the rank it comes from.
            if (nonfinite.empty() && !all_finite(params[static_cast<size_t>(i)]->grad)) {
              nonfinite = pnames[static_cast<size_t>(i)];
              if (c.on_nonfinite == "stop")
                throw TrainingError(
                    "iteration " + std::to_string(step) + " (epoch " +
                        std::to_string(epoch) + ", batch " + std::to_string(bi) + "): the gradient of " + nonfinite +
                        " is " + nonfinite_kind(params[static_cast<size_t>(i)]->grad) + " before the allreduce (loss " +
                        (std::isfinite(loss) ? std::to_string(loss) : std::string(std::isnan(loss) ? "NaN" : "inf")) + ")",
                    "the allreduce would have spread it to every rank. Lower --lr, or pass --on-nonfinite skip-step to "
                    "skip such steps as AMP's GradScaler does");
            }
            if (grad_allreduce) reducer.mark_param_ready(i);
          });
        });
        if (grad_allreduce) reducer.finalize_backward();
        // --on-nonfinite skip-step: the averaged gradient is the same on every rank, so every rank
        // skips the same steps (as GradScaler.step does when it finds infs); BatchNorm's running
        // statistics keep this step's update, as they do under GradScaler.
        bool skipped = false;
        if (synced && c.on_nonfinite == "skip-step" && (!nonfinite.empty() || grad_allreduce)) {
          for (const Param* p : params)
            if (!all_finite(p->grad)) skipped = true;
          if (skipped) model.zero_grad();
        }
        if (synced && !skipped) comm.timed(Phase::OptimizerStep, "optimizer-step", step, [&] { opt.step(); });
        // PeriodicModelAverager.average_parameters after every optimizer step (local SGD).
        const double drift = local_sgd ? averager.average_parameters(model, comm) : -1.0;
        require_forward_param_sync = synced || no_sync_broadcasts;  // DDP: a no_sync forward leaves the next one unsynced

        StepRecord rec;
        rec.rank = rank;
        rec.step = step;
        rec.epoch = epoch;
        rec.batch = static_cast<int64_t>(bi);
        rec.batch_size = n;
        rec.loss = loss;
        rec.correct = correct;
        rec.bytes_sent = comm.bytes_sent();
        rec.t = now_seconds() - m_t0;
        rec.param_drift = drift;
        rec.grad_sync = synced;
        rec.skipped = skipped;
        rec.nonfinite = nonfinite;
        rec.bn = bn_layer_records(bns, bn_index, c.track_running_stats);
        if (c.nondeterministic) {
          double sum = 0;
          for (const Param* p : model.params())
            for (float v : p->value.data) sum += v;
          rec.param_checksum = sum;
        }
        {
          std::lock_guard<std::mutex> lock(rs.mu);
          rs.loss_sum += loss;
          rs.correct += correct;
          rs.samples += n;
          rs.steps += 1;
          rs.trained_samples += n;
          if (drift >= 0) rs.drifts.emplace_back(step, drift);
          if (skipped) rs.skipped.push_back(step);
          if (!nonfinite.empty()) rs.nonfinite.emplace_back(step, nonfinite);
          rs.latest = std::make_shared<const StepRecord>(rec);
          rs.pending.push_back(std::move(rec));
        }
        periodic_eval(step, epoch);
      }
      if (stopped_at_checkpoint) break;
      if (c.join) {
        // DDP join (join.h): out of data (or at the end of the epoch), shadow the collectives of
        // the ranks still training until every rank has joined; then take the last joiner's model.
        bool last_joiner = true;
        for (;; ++step) {
          m_control->before_iteration(rank, step);
          comm.set_train_step(step);
          if (!join.shadow_iteration(require_forward_param_sync)) break;
          last_joiner = false;
        }
        join.sync_final_model(last_joiner);
      } else if (c.uneven_data && static_cast<int64_t>(batches.size()) < m_steps_per_epoch && step < m_steps_total) {
        // Out of data while the others still train, and no join: in PyTorch the others now hang
        // in their next collective. Record it and wait for their timeout to end the run;
        // finish() then says who waited where and who had finished.
        {
          std::lock_guard<std::mutex> lock(rs.mu);
          rs.out_of_data_step = step;
          rs.out_of_data_epoch = epoch;
          rs.out_of_data_batches = static_cast<int64_t>(batches.size());
        }
        while (!transport.aborted()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
        throw StopRequested{};
      }
      // End of epoch: evaluate like a DDP user does. The first no-grad forward after training
      // broadcasts rank 0's buffers (broadcast_buffers); each rank evaluates a contiguous shard
      // of the test set in eval mode and the sums are allreduced.
      comm.set_train_step(-1);
      if (dp) dp_device.replicate_all();  // DataParallel: the evaluation forward's replicas
      else if (broadcast && require_forward_param_sync && !eval_no_broadcast) broadcast_buffers(model, comm);
      require_forward_param_sync = false;
      const int64_t L = m_test.size;
      const double t_eval = now_seconds();
      EvalResult mine = comm.timed(Phase::Eval, "eval", -1, [&] {
        return evaluate(model, Mode::Eval, c.eval_batch_size, L * rank / world, L * (rank + 1) / world);
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
      const EpochCounters counters = epoch_counters(rank, transport);
      if (rank == 0) {
        EpochRecord e;
        e.epoch = epoch;
        e.steps = step;
        const int64_t ep_steps = counters.steps, ep_samples = counters.samples, ep_correct = counters.correct;
        e.train_loss = ep_steps ? sums[3] / static_cast<double>(ep_steps) : 0.0;
        e.train_acc = ep_samples ? static_cast<double>(ep_correct) / static_cast<double>(ep_samples) : 0.0;
        e.test_loss = sums[2] > 0 ? sums[0] / sums[2] : 0.0;
        e.test_acc = sums[2] > 0 ? sums[1] / sums[2] : 0.0;
        e.seconds = t_eval - t_epoch0;  // training only: evaluation starts at t_eval
        e.samples_per_s = e.seconds > 0 ? static_cast<double>(ep_samples) / e.seconds : 0.0;
        e.lr = opt.options().lr;
        std::lock_guard<std::mutex> lock(m_epoch_mu);
        m_epochs.push_back(e);
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
    // Ranks in other processes: records, events and final state go to rank 0's process.
    if (m_local.size() < static_cast<size_t>(world)) gather_to_rank0(rank, transport, model);
  } catch (const StopRequested&) {
  } catch (const CommError& e) {
    fail_rank(rank, e, true);
  } catch (const std::exception& e) {
    fail_rank(rank, e, false);
  }
  --m_running;
}

void Run::fail_rank(int rank, const std::exception& e, bool is_comm) {
  std::string msg = e.what();
  std::string hint;
  if (const auto* le = dynamic_cast<const Error*>(&e)) hint = le->hint();
  std::string full = is_comm ? msg : "rank " + std::to_string(rank) + " failed: " + msg;
  {
    std::lock_guard<std::mutex> lock(m_err_mu);
    m_errors[static_cast<size_t>(rank)] = full;
    const bool take = m_root_code == 0 || (!is_comm && m_root_code == kExitCommunication);
    if (take) {
      m_root_rank = rank;
      const auto* le = dynamic_cast<const Error*>(&e);
      m_root_code = le ? le->exit_code() : kExitFailure;
      m_root_what = full;
      m_root_hint = hint;
    }
  }
  // Tell every other rank: their blocking calls now fail at once instead of timing out.
  m_world->transport(rank).abort(full);
}

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

// ---- 5. poll / finish ----

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
  s->samples_per_s = elapsed > 0 ? static_cast<double>(done) * static_cast<double>(m_cfg.global_batch()) / elapsed : 0;
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

// --uneven-data without --join. Ranks that ran out of data wait (section 4) while the others block
// in their next collective until the timeout; that timeout is the root error. Rewritten here into
// what happened: who waited in which collective, who had finished after how many steps.
void Run::throw_if_ranks_ran_out(const std::string& root_what) {
  if (root_what.find("timed out") == std::string::npos) return;  // a real failure: report it as is
  std::vector<int> finished, waiting;
  for (size_t r = 0; r < m_ranks.size(); ++r) {
    std::lock_guard<std::mutex> lock(m_ranks[r]->mu);
    (m_ranks[r]->out_of_data_step >= 0 ? finished : waiting).push_back(static_cast<int>(r));
  }
  if (finished.empty()) return;
  auto list = [](const std::vector<int>& v) {
    std::string s = v.size() == 1 ? "rank " : "ranks ";
    for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
    return s;
  };
  // A collective's error reads "rank R: allreduce #41 (grad bucket 1) at step 4: <detail>"
  // (communicator.cpp's error protocol): the collective is the part before the detail.
  auto collective_of = [](const std::string& err, int r) {
    const std::string prefix = "rank " + std::to_string(r) + ": ";
    if (err.compare(0, prefix.size(), prefix) != 0) return err.empty() ? std::string("(stopped)") : err;
    const std::string rest = err.substr(prefix.size());
    return rest.substr(0, rest.find(": "));
  };
  std::ostringstream msg;
  msg << "uneven inputs without --join: " << list(finished) << " ran out of data while " << list(waiting)
      << " still had batches; those waited in their next collective for ranks that had left training until the "
      << m_cfg.timeout_s << " s timeout";
  std::lock_guard<std::mutex> lock(m_err_mu);
  for (size_t r = 0; r < m_ranks.size(); ++r) {
    const RankState& rs = *m_ranks[r];
    if (rs.out_of_data_step >= 0)
      msg << "\n  rank " << r << ": finished: ran out of data after " << rs.out_of_data_step << " steps (its "
          << rs.out_of_data_batches << " batches of epoch " << rs.out_of_data_epoch << ") and never joined that collective";
    else
      msg << "\n  rank " << r << ": waiting in " << collective_of(m_errors[r], static_cast<int>(r))
          << " (it still had batches)";
  }
  throw CommError(msg.str(),
                  "DDP needs every rank in every collective. Pass --join (DDP's join context: ranks that run out "
                  "of data shadow the others' collectives with zero gradients and the run completes), or give "
                  "every rank the same number of batches (drop --uneven-data)");
}

const RunSummary& Run::finish() {
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
  // Whatever is left (a failed run leaves ranks at different steps): in (step, rank) order.
  {
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
  }
  if (m_dir) {
    for (const EpochRecord& e : m_epochs) m_dir->append_epoch(e);
    for (const EvalPoint& p : m_evals) m_dir->append_eval(p);
  }
  const double t_end = now_seconds();
  std::vector<std::vector<Event>> events(m_logs.size());
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
  publish();
  if (m_root_code == kExitCommunication) throw_if_ranks_ran_out(m_root_what);
  if (m_root_code) {
    // Root cause first, then how every other rank ended.
    std::ostringstream msg;
    msg << m_root_what;
    for (size_t r = 0; r < m_errors.size(); ++r) {
      if (static_cast<int>(r) == m_root_rank || !is_local(static_cast<int>(r))) continue;
      // The others' errors end with the root cause's text: keep where each rank was.
      std::string e = m_errors[r];
      const size_t cut = e.find(" aborted: ");
      if (cut != std::string::npos) e = e.substr(0, cut) + " aborted";
      const std::string self = "rank " + std::to_string(r) + ": ", self_failed = "rank " + std::to_string(r) + " failed: ";
      if (e.rfind(self, 0) == 0) e = e.substr(self.size());
      else if (e.rfind(self_failed, 0) == 0) e = "failed: " + e.substr(self_failed.size());
      msg << "\n  rank " << r << ": " << (e.empty() ? "stopped" : e);
    }
    throw_error(m_root_code, msg.str(), m_root_hint);
  }
  // A rank of a multi-process world that stopped without an error of its own (it hung, or was
  // past its last collective) when another process's rank failed: the world's abort is its error.
  if (m_local.size() < static_cast<size_t>(m_cfg.world_size))
    for (int r : m_local)
      if (m_world->transport(r).aborted())
        throw CommError("rank " + std::to_string(r) + ": stopped because another rank failed: " +
                            m_world->transport(r).abort_reason(),
                        "the first failing rank's error is the cause; this rank stopped because of it");

  // Training throughput: samples trained / wall time of the rank threads (evaluation included in
  // per-epoch figures, excluded here by subtracting eval events of rank 0).
  int64_t samples = 0, steps = 0;
  double eval_time = 0;
  for (const Event& e : events[static_cast<size_t>(m_local.front())])
    if (e.kind == EventKind::Compute && e.phase == Phase::Eval) eval_time += e.t_end - e.t_start;
  {
    int64_t max_step = -1;
    for (auto& rs : m_ranks) {
      if (rs->latest) max_step = std::max(max_step, rs->latest->step);
    }
    steps = std::max(max_step + 1, m_start_step_resumed);
  }
  // Samples actually trained: sum of every rank's batch sizes over the run.
  samples = 0;
  if (m_cfg.mode == "dp" || m_cfg.mode == "async" || m_cfg.uneven_data) {
    // DataParallel's global batches, or ranks with different numbers of batches: as counted.
    for (auto& rs : m_ranks) samples += rs->trained_samples;
  } else {
    // DistributedSampler gives every rank the same number of samples per epoch.
    DistributedSampler probe({m_train.size, m_cfg.world_size, 0, m_cfg.shuffle, m_cfg.seed, m_cfg.sampler_drop_last});
    const auto per_rank_batches = make_batches(probe.indices(), m_cfg.batch_size, m_cfg.drop_last);
    for (int64_t s = 0; s < steps; ++s)
      samples += static_cast<int64_t>(per_rank_batches[static_cast<size_t>(s % m_steps_per_epoch)].size()) *
                 m_cfg.world_size;
  }
  m_summary.steps = steps;
  m_summary.samples = samples;
  m_summary.epochs = m_epochs;
  m_summary.epochs_completed = static_cast<int64_t>(m_epochs.size());
  if (m_resume) eval_time += m_resume->eval_seconds;
  m_summary.train_seconds = std::max(1e-9, (t_end - m_t0) - eval_time);
  m_summary.samples_per_s = static_cast<double>(samples) / m_summary.train_seconds;
  if (!is_local(0)) return m_summary;  // rank 0's process evaluates and writes the outputs

  // Final evaluation of rank 0's model (as PyTorch users do: model.eval() on rank 0). Evaluation
  // in train mode runs on a copy, so the saved running statistics are untouched.
  set_compute_threads(m_cfg.threads > 0 ? m_cfg.threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
  Model& m0 = *m_replicas[0];
  m_summary.eval_mode = evaluate(m0, Mode::Eval, m_cfg.eval_batch_size, 0, m_test.size);
  auto copy = build_model(model_options(m_cfg), m_cfg.seed);
  attach_device(*copy, 0);
  copy_state(m0, *copy);
  m_summary.train_mode = evaluate(*copy, Mode::Train, m_cfg.batch_size, 0, m_test.size);

  // Ranks whose buffers differ from rank 0's (no broadcast_buffers, or a run that stopped
  // mid-epoch after each rank updated its own statistics).
  const auto b0 = model_tensors(m0, true);
  std::vector<int> differing;
  // (DataParallel's devices other than 0 hold last iteration's replicas, not models of their own.)
  for (int r = 1; r < m_cfg.world_size && m_cfg.mode != "dp"; ++r) {
    const auto br = model_tensors(*m_replicas[static_cast<size_t>(r)], true);
    bool same = br.size() == b0.size();
    for (size_t i = 0; same && i < br.size(); ++i) same = br[i].bytes == b0[i].bytes;
    if (!same) differing.push_back(r);
  }
  if (!differing.empty()) {
    m_summary.eval_mode_per_rank.push_back(m_summary.eval_mode);
    for (int r = 1; r < m_cfg.world_size; ++r)
      m_summary.eval_mode_per_rank.push_back(
          evaluate(*m_replicas[static_cast<size_t>(r)], Mode::Eval, m_cfg.eval_batch_size, 0, m_test.size));
  }

  // Communication figures and local SGD's drift (comm_stats.h, local_sgd.h).
  for (auto& rs : m_ranks) {
    std::lock_guard<std::mutex> lock(rs->mu);
    for (int64_t st : rs->skipped)
      if (std::find(m_summary.skipped_steps.begin(), m_summary.skipped_steps.end(), st) == m_summary.skipped_steps.end())
        m_summary.skipped_steps.push_back(st);
  }
  std::sort(m_summary.skipped_steps.begin(), m_summary.skipped_steps.end());
  m_summary.traffic = traffic_stats(events);
  m_summary.overlap = overlap_stats(events);
  ComputeStats cs = compute_stats(events);
  add_resumed_stats(m_summary, cs);  // --resume: the iterations before the checkpoint
  {
    std::map<int64_t, double> max_drift;  // step -> max over ranks
    for (auto& rs : m_ranks)
      for (const auto& [st, d] : rs->drifts) max_drift[st] = std::max(max_drift[st], d);
    m_summary.drift.assign(max_drift.begin(), max_drift.end());
    m_summary.drift_max = m_summary.drift_mean = 0;
    for (const auto& [st, d] : m_summary.drift) {
      m_summary.drift_max = std::max(m_summary.drift_max, d);
      m_summary.drift_mean += d / static_cast<double>(m_summary.drift.size());
    }
  }
  // Local SGD: ranks whose parameters differ from rank 0's (the run ended between averagings).
  std::vector<int> params_differ;
  if (m_cfg.mode == "local-sgd") {
    const auto p0 = model_tensors(m0);
    for (int r = 1; r < m_cfg.world_size; ++r) {
      const auto pr = model_tensors(*m_replicas[static_cast<size_t>(r)]);
      bool same = pr.size() == p0.size();
      for (size_t i = 0; same && i < pr.size(); ++i) same = pr[i].bytes == p0[i].bytes;
      if (!same) params_differ.push_back(r);
    }
  }

  if (m_dir) {
    const std::map<std::string, std::string> meta = {
        {"format", "pt"}, {"producer", std::string("dtlab ") + kDtlabVersion}, {"rank", "0"}};
    m_dir->write_weights("final.safetensors", model_tensors(m0), meta);
    for (int r : differing) {
      auto m = meta;
      m["rank"] = std::to_string(r);
      m_dir->write_weights("final.rank" + std::to_string(r) + ".buffers.safetensors",
                           model_tensors(*m_replicas[static_cast<size_t>(r)], true), m);
    }
    nlohmann::json j;
    j["format_version"] = kRunDirFormatVersion;
    j["producer"] = std::string("dtlab ") + kDtlabVersion;
    j["test_eval_mode"] = {{"accuracy", m_summary.eval_mode.acc}, {"loss", m_summary.eval_mode.loss},
                           {"samples", m_summary.eval_mode.samples},
                           {"what", "rank 0's final model, model.eval(): running statistics"}};
    j["test_train_mode"] = {{"accuracy", m_summary.train_mode.acc}, {"loss", m_summary.train_mode.loss},
                            {"samples", m_summary.train_mode.samples}, {"batch_size", m_cfg.batch_size},
                            {"what", "rank 0's final model, model.train(): batch statistics of test batches of "
                                     "batch_size (on a copy: the saved running statistics are unchanged)"}};
    if (!m_summary.eval_mode_per_rank.empty()) {
      nlohmann::json pr = nlohmann::json::array();
      for (const auto& e : m_summary.eval_mode_per_rank) pr.push_back({{"accuracy", e.acc}, {"loss", e.loss}});
      j["test_eval_mode_per_rank"] = pr;
      j["ranks_with_different_buffers"] = differing;
    }
    {
      int64_t params = 0, buffer_values = 0;
      for (const StateEntry& e : m0.state_dict()) {
        if (e.param) params += e.param->value.numel();
        else if (e.buffer) buffer_values += e.buffer->is_int64 ? 1 : e.buffer->value.numel();
      }
      j["model"] = {{"name", m_cfg.model}, {"parameters", params}, {"parameter_bytes", params * 4},
                    {"buffer_values", buffer_values},
                    {"what", "parameters: trainable values (the gradient every step allreduces has as many); "
                             "parameter_bytes: as float32"}};
    }
    j["device"] = device_summary();
    j["steps"] = m_summary.steps;
    j["steps_per_epoch"] = m_steps_per_epoch;
    j["train_samples"] = m_train.size;
    j["test_samples"] = m_test.size;
    j["epochs"] = m_summary.epochs_completed;
    j["samples"] = m_summary.samples;
    j["train_seconds"] = m_summary.train_seconds;
    j["samples_per_s"] = m_summary.samples_per_s;
    nlohmann::json ep = nlohmann::json::array();
    for (const EpochRecord& e : m_summary.epochs)
      ep.push_back({{"epoch", e.epoch}, {"steps", e.steps}, {"train_loss", e.train_loss},
                    {"train_accuracy", e.train_acc}, {"test_loss", e.test_loss}, {"test_accuracy", e.test_acc},
                    {"seconds", e.seconds}});
    j["per_epoch"] = ep;
    // ---- parallelism mode and communication ----
    j["mode"] = m_cfg.mode;
    const TrafficStats& tr = m_summary.traffic;
    nlohmann::json parts = nlohmann::json::object();
    for (const TrafficStats::Part& p : tr.by_what)
      parts[p.what] = {{"bytes_moved", p.bytes_moved}, {"sent_per_rank", p.sent}, {"received_per_rank", p.received}};
    j["traffic"] = {{"bytes_moved", tr.bytes_moved}, {"sent_per_rank", tr.sent}, {"received_per_rank", tr.received},
                    {"rank0_share", tr.rank0_share}, {"by_what", parts},
                    {"what", "messages of the training steps; rank0_share = bytes sent or received by rank 0 "
                             "(DataParallel: device 0) / bytes moved; by_what: the same per kind of message "
                             "(grad bucket, buffers, bn stats, ...)"}};
    const OverlapStats& ov = m_summary.overlap;
    nlohmann::json per_rank = nlohmann::json::array();
    for (size_t r = 0; r < ov.comm_seconds.size(); ++r)
      per_rank.push_back({{"rank", r}, {"comm_seconds", ov.comm_seconds[r]}, {"hidden_seconds", ov.hidden_seconds[r]},
                          {"hidden_fraction", ov.comm_seconds[r] > 0 ? ov.hidden_seconds[r] / ov.comm_seconds[r] : 0.0}});
    j["communication"] = {{"per_rank", per_rank}, {"comm_seconds", ov.comm_seconds_total},
                          {"hidden_seconds", ov.hidden_seconds_total}, {"hidden_fraction", ov.hidden_fraction},
                          {"overlap", m_cfg.overlap},
                          {"link", {{"latency_us", m_cfg.link_latency_us}, {"gbps", m_cfg.link_gbps}}},
                          {"what", "seconds inside collectives during training steps, and the part of them "
                                   "that overlapped the same rank's backward computation"}};
    nlohmann::json cpr = nlohmann::json::array();
    double fw = 0, bw = 0, opt = 0;
    for (size_t r = 0; r < cs.forward.size(); ++r) {
      cpr.push_back({{"rank", r}, {"forward_seconds", cs.forward[r]}, {"backward_seconds", cs.backward[r]},
                     {"optimizer_seconds", cs.optimizer[r]}});
      fw += cs.forward[r] / static_cast<double>(cs.forward.size());
      bw += cs.backward[r] / static_cast<double>(cs.forward.size());
      opt += cs.optimizer[r] / static_cast<double>(cs.forward.size());
    }
    j["compute"] = {{"per_rank", cpr}, {"forward_seconds", fw}, {"backward_seconds", bw}, {"optimizer_seconds", opt},
                    {"what", "seconds of forward, backward and optimizer steps during training (mean over ranks, and "
                             "per rank); a backward includes the waits DDP's buckets make it do"}};
    if (m_cfg.mode != "dp" && m_cfg.mode != "async" && m_cfg.world_size > 1) {  // (the parameter server has no buckets)
      nlohmann::json bj = nlohmann::json::array();
      for (const BucketInfo& b : grad_buckets(events)) bj.push_back({{"index", b.index}, {"bytes", b.bytes}});
      j["ddp"] = {{"buckets", bj}, {"bucket_cap_mb", m_cfg.bucket_cap_mb},
                  {"what", "the gradient buckets of the last training step: bucket 0 holds the last layers' "
                           "gradients (ready first in backward; after the first iteration's rebuild it closes "
                           "once it holds 1 MiB or more)"}};
    }
    if (m_cfg.mode == "async") {
      std::lock_guard<std::mutex> lock(m_async_mu);
      m_summary.async_updates = m_async_updates;
      int64_t max_st = 0;
      double mean_st = 0;
      for (const auto& [w, st] : m_async_updates) {
        max_st = std::max(max_st, st);
        mean_st += static_cast<double>(st) / static_cast<double>(m_async_updates.size());
      }
      std::vector<int64_t> hist(static_cast<size_t>(max_st + 1), 0);
      std::vector<int64_t> per_update, workers;
      for (const auto& [w, st] : m_async_updates) {
        ++hist[static_cast<size_t>(st)];
        per_update.push_back(st);
        workers.push_back(w);
      }
      j["async"] = {{"schedule", m_cfg.async_schedule}, {"seed", m_cfg.async_seed}, {"workers", m_cfg.world_size},
                    {"updates", m_async_updates.size()},
                    {"staleness", {{"mean", mean_st}, {"max", max_st}, {"histogram", hist}}},
                    {"per_update", {{"staleness", per_update}, {"worker", workers}}},
                    {"what", "staleness: updates the server applied between a worker's pull and its push; histogram[k]: "
                             "pushes that were k updates stale; per_update: in the order the server applied them"}};
    }
    if (m_cfg.mode == "dp") {
      j["data_parallel"] = {{"devices", m_cfg.world_size}, {"global_batch", m_cfg.batch_size},
                            {"device0_share_of_bytes", tr.rank0_share},
                            {"device0_bytes", tr.bytes_moved ? tr.sent[0] + tr.received[0] : 0}};
    }
    if (m_cfg.mode == "local-sgd") {
      nlohmann::json av = nlohmann::json::array();
      for (const auto& [st, d] : m_summary.drift) av.push_back({{"step", st}, {"drift", d}});
      j["local_sgd"] = {{"average_every", m_cfg.average_every}, {"warmup_steps", m_cfg.warmup_steps},
                        {"averagings", m_summary.drift.size()}, {"drift_max", m_summary.drift_max},
                        {"drift_mean", m_summary.drift_mean}, {"per_averaging", av},
                        {"ranks_with_different_parameters", params_differ},
                        {"what", "drift: before an averaging, the largest L2 distance between a rank's "
                                 "parameters and their average"}};
      for (int r : params_differ)
        m_dir->write_weights("final.rank" + std::to_string(r) + ".safetensors",
                             model_tensors(*m_replicas[static_cast<size_t>(r)]),
                             {{"format", "pt"}, {"producer", std::string("dtlab ") + kDtlabVersion},
                              {"rank", std::to_string(r)}});
    }
    {
      nlohmann::json skipped = nlohmann::json::array(), sources = nlohmann::json::array();
      for (size_t r = 0; r < m_ranks.size(); ++r) {
        std::lock_guard<std::mutex> lock(m_ranks[r]->mu);
        for (int64_t st : m_ranks[r]->skipped) skipped.push_back({{"rank", r}, {"step", st}});
        for (const auto& [st, layer] : m_ranks[r]->nonfinite)
          sources.push_back({{"rank", r}, {"step", st}, {"parameter", layer}});
      }
      if (!skipped.empty() || !sources.empty())
        j["nonfinite"] = {{"on_nonfinite", m_cfg.on_nonfinite}, {"skipped", skipped}, {"sources", sources},
                          {"what", "skipped: iterations whose averaged gradient was NaN or infinite, with no optimizer "
                                   "step; sources: where a rank's own gradient was not finite before the allreduce"}};
    }
    if (m_resume)
      j["resumed"] = {{"from_step", m_start_step_resumed}, {"checkpoint", m_resume->found.dir},
                      {"what", "this run continued from a checkpoint; its numbers are those of the whole run"}};
    if (m_interrupted_at >= 0)
      j["interrupted"] = {{"at_step", m_interrupted_at.load()},
                          {"what", "stopped early (Ctrl-C) after writing a checkpoint there: dtlab run --resume " +
                                       m_cfg.out_dir + " continues it"}};
    m_dir->write_json("summary.json", j);
  }
  return m_summary;
}

// ---- 6. ranks in other processes ----
//
// Run-internal messages between processes: tags in run_internal.h.

namespace {

// Processes whose steady clocks differ by more than this are on different hosts: their events
// are aligned by the run's start instead.
constexpr double kMaxClockShiftSeconds = 3600;

}  // namespace

// The epoch's train counters summed over all ranks, on rank 0 (zeros elsewhere). Local ranks'
// counters are read under their locks; a rank of another process sends its own to rank 0.
// Called by every rank between the epoch's "eval sums" allreduce and the epoch barrier.
Run::EpochCounters Run::epoch_counters(int rank, Transport& transport) {
  auto read = [this](int r) {
    RankState& o = *m_ranks[static_cast<size_t>(r)];
    std::lock_guard<std::mutex> lock(o.mu);
    return EpochCounters{o.steps, o.samples, o.correct};
  };
  EpochCounters sum;
  if (rank != 0) {
    if (!is_local(0)) {
      const EpochCounters mine = read(rank);
      const int64_t v[3] = {mine.steps, mine.samples, mine.correct};
      transport.send(0, v, sizeof v, kTagEpochCounters);
    }
    return sum;
  }
  for (int r = 0; r < m_cfg.world_size; ++r) {
    EpochCounters c;
    if (is_local(r)) {
      c = read(r);
    } else {
      int64_t v[3];
      transport.recv(r, v, sizeof v, kTagEpochCounters);
      c = EpochCounters{v[0], v[1], v[2]};
    }
    sum.steps += c.steps;
    sum.samples += c.samples;
    sum.correct += c.correct;
  }
  return sum;
}

const char* Run::intern(const std::string& name) {
  std::lock_guard<std::mutex> lock(m_names_mu);
  return m_names.insert(name).first->c_str();
}

// End of a successful run: each rank of another process sends rank 0 its step records, events
// and final model state (size first, then the RankReport); rank 0 receives them in rank order
// and files them as if the rank had run here: pending records (written by poll/finish in
// (step, rank) order), events (times shifted onto this process's clock) and a replica.
void Run::gather_to_rank0(int rank, Transport& transport, Model& model) {
  if (rank != 0) {
    if (is_local(0)) return;
    RankReport rep;
    rep.clock_origin = clock_origin_seconds();
    rep.t0 = m_t0;
    {
      RankState& rs = *m_ranks[static_cast<size_t>(rank)];
      std::lock_guard<std::mutex> lock(rs.mu);
      rep.records.assign(rs.pending.begin(), rs.pending.end());
    }
    m_logs[static_cast<size_t>(rank)]->copy_since(0, rep.events);
    rep.tensors = model_tensors(model);
    const std::vector<char> bytes = encode_rank_report(rep);
    const uint64_t n = bytes.size();
    transport.send(0, &n, sizeof n, kTagReportSize);
    transport.send(0, bytes.data(), bytes.size(), kTagReport);
    return;
  }
  const double origin = clock_origin_seconds();
  for (int r = 1; r < m_cfg.world_size; ++r) {
    if (is_local(r)) continue;
    uint64_t n = 0;
    transport.recv(r, &n, sizeof n, kTagReportSize);
    std::vector<char> bytes(n);
    transport.recv(r, bytes.data(), n, kTagReport);
    RankReport rep = decode_rank_report(bytes, r, [this](const std::string& s) { return intern(s); });
    double shift = rep.clock_origin - origin;
    if (std::abs(shift) > kMaxClockShiftSeconds) shift = m_t0 - rep.t0;
    EventLog& log = *m_logs[static_cast<size_t>(r)];
    for (Event& e : rep.events) {
      e.t_start += shift;
      e.t_end += shift;
      log.record(e);
    }
    auto replica = build_model(model_options(m_cfg), m_cfg.seed);
    load_model_tensors(*replica, rep.tensors, "the final state of rank " + std::to_string(r));
    m_replicas[static_cast<size_t>(r)] = std::move(replica);
    RankState& o = *m_ranks[static_cast<size_t>(r)];
    std::lock_guard<std::mutex> lock(o.mu);  // poll sees all of a rank's records or none
    if (!rep.records.empty()) o.latest = std::make_shared<const StepRecord>(rep.records.back());
    for (StepRecord& rec : rep.records) o.pending.push_back(std::move(rec));
  }
}

}  // namespace lab
