// Run: one training run of N ranks, the lab's central object. The ranks this process drives
// (World::local_ranks: all N for emulated ranks, one for an MPI process) run as threads; ranks in
// other processes send their step records, events and final state to rank 0's process at the
// end of the run, which alone writes the run directory, in the same format either way.
//
//   Run run(cfg);            // validates, loads data, builds replicas; throws on bad input
//   run.start();             // one thread per rank
//   while (!run.poll()) ...  // drains metrics to the run directory; snapshot() for display
//   run.finish();            // joins, evaluates, writes outputs; rethrows the root-cause error
//
// Observing: snapshot() returns an immutable Snapshot published by pointer swap; readers never
// lock the training threads. Driving: control() pauses, resumes and single-steps the world at the
// granularity of one ring step (every rank sends one chunk), one iteration, or any gate a front end
// chooses (run_until), and slows it down (set_delay). Paused time does not count towards
// collective timeouts.
#pragma once

#include <atomic>
#include <cmath>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "comm_stats.h"
#include "communicator.h"
#include "config.h"
#include "dataset.h"
#include "evaluate.h"
#include "events.h"
#include "memory.h"
#include "model.h"
#include "optim.h"
#include "run_control.h"

namespace lab {

class RunDir;
class ComputeSettingsScope;
struct RankCheckpoint;
struct SummaryFields;
struct ModeCheckpoint;

// The model a configuration trains (name and BatchNorm options).
ModelOptions model_options(const RunConfig& c);
// The optimizer a configuration trains with (torch.optim.SGD's lr, momentum, weight_decay, nesterov).
OptimizerOptions optimizer_options(const RunConfig& c);  // --optimizer and its settings

// Creates the ranks' transports for a validated configuration (backends/backends.h).
using WorldFactory = std::function<std::unique_ptr<World>(const RunConfig&)>;

// ---- what a run records per step and rank (one line of metrics.jsonl) ----
struct BnLayerRecord {
  std::string layer;                 // module index, e.g. "1" for "1.running_mean"
  int64_t count = 0;                 // values per channel used for the statistics (global with SyncBN)
  std::vector<float> batch_mean;     // (C,) statistics used to normalize
  std::vector<float> batch_var;      // (C,) biased
  std::vector<float> local_mean;     // (C,) this rank's own batch
  std::vector<float> local_var;      // (C,)
  std::vector<float> running_mean;   // (C,) buffers after this step's forward
  std::vector<float> running_var;    // (C,)
  int64_t num_batches_tracked = 0;
};

struct StepRecord {
  int rank = 0;
  int64_t step = 0;        // global iteration index, from 0
  int64_t epoch = 0;
  int64_t batch = 0;       // index of the batch within the epoch
  int64_t batch_size = 0;  // this rank's samples in this step
  float loss = 0;
  int64_t correct = 0;
  uint64_t bytes_sent = 0; // cumulative
  double t = 0;            // seconds since start (wall clock)
  std::vector<BnLayerRecord> bn;
  // Parallelism modes; written to metrics.jsonl only when set.
  std::vector<int64_t> chunks;  // --mode dp, device 0: torch.chunk sizes of the global batch over the devices
  double param_drift = -1;      // --mode local-sgd: L2 distance to the average, before this step's averaging
  bool grad_sync = true;        // false: a backward under DDP's no_sync (--no-sync-steps), no optimizer step
  int64_t staleness = -1;       // --mode async: updates the server applied between this worker's pull and its push
  int64_t version = -1;         // --mode async: the server's update count when this worker pulled
  double param_checksum = NAN;  // --nondeterministic: the sum of every parameter after the step (float64),
                                // a fingerprint to compare two runs step by step
  bool skipped = false;         // --on-nonfinite skip-step: the averaged gradient was not finite, no optimizer step
  std::string nonfinite;        // the first parameter whose gradient on this rank was NaN or infinite before the
                                // allreduce ("" when all were finite)
  std::vector<MemorySample> memory;  // the rank's bytes by category at each point of the step (memory.h);
                                     // in metrics.jsonl with --record-memory only
};

struct EpochRecord {
  int64_t epoch = 0;
  int64_t steps = 0;             // iterations done so far
  double train_loss = 0;         // mean over the epoch's steps and ranks
  double train_acc = 0;
  double test_loss = 0;          // eval mode, all test samples (sharded over ranks)
  double test_acc = 0;
  double seconds = 0;            // wall clock of the epoch's training (evaluation excluded)
  double samples_per_s = 0;
  double lr = 0;                 // the learning rate of the epoch (--lr-schedule)
};

// One periodic evaluation (RunConfig::eval_every) of a copy of rank 0's model on the first
// `samples` test samples, in eval mode (running statistics) and in train mode (batch statistics of
// test batches of batch_size; the copy's buffers change, the model's do not).
struct EvalPoint {
  int64_t steps = 0;                  // iterations done when it was taken
  int64_t epoch = 0;
  int64_t samples = 0;
  EvalResult eval_mode, train_mode;
  int probe_label = -1;               // test sample 0, the same input in both modes:
  std::vector<float> probe_eval;      // (10,) its softmax output in eval mode
  std::vector<float> probe_train;     // (10,) in train mode, inside the first test batch
};

struct RunSummary {
  EvalResult eval_mode;    // rank 0's final model, running statistics
  EvalResult train_mode;   // rank 0's final model, batch statistics (batches of batch_size)
  std::vector<EvalResult> eval_mode_per_rank;  // filled when ranks' buffers differ
  int64_t steps = 0;
  int64_t epochs_completed = 0;
  double train_seconds = 0;
  double samples_per_s = 0;
  int64_t samples = 0;
  std::vector<EpochRecord> epochs;
  // Communication (comm_stats.h) and the parallelism modes.
  TrafficStats traffic;                 // training steps only
  OverlapStats overlap;
  std::vector<std::pair<int64_t, double>> drift;  // local-sgd: (step, max over ranks) per averaging
  double drift_max = 0, drift_mean = 0;           // over the averagings
  std::vector<std::pair<int, int64_t>> async_updates;  // async: (worker, staleness) per applied push
  std::vector<int64_t> skipped_steps;                  // --on-nonfinite skip-step: iterations without a step
  // Memory (memory.h; summary.json's "memory"): the rank with the highest peak, where it happened,
  // its model states after the last iteration, and the ZeRO formula's for the mode.
  struct MemoryOutline {
    int rank = -1;                 // -1: nothing measured
    int64_t step = -1, peak = 0, states_end = 0, formula = 0;
    std::string at, expression;
  } memory;
};

enum class RunState { Created, Running, Paused, Finished, Failed };
const char* run_state_name(RunState s);

struct Snapshot {
  RunState state = RunState::Created;
  int64_t steps_total = 0;          // planned iterations
  int64_t steps_per_epoch = 0;
  std::vector<StepRecord> latest;   // per rank: the last completed step (rank == index)
  std::vector<EpochRecord> epochs;
  std::vector<EvalPoint> evals;     // periodic evaluations (eval_every > 0)
  double samples_per_s = 0;         // over the run so far
  std::string error;
};

class Run {
 public:
  Run(const RunConfig& cfg, const WorldFactory& make_world);
  ~Run();
  Run(const Run&) = delete;
  Run& operator=(const Run&) = delete;

  void start();
  // Drains finished steps to the run directory and republishes the snapshot. True when all rank
  // threads have finished (successfully or not).
  bool poll();
  // Joins the threads, evaluates the final model, writes outputs. Throws the root-cause error of
  // a failed run (the failing rank's own error, with the others' errors summarized).
  const RunSummary& finish();
  // After finish(), in rank 0's process: summary.json's fields the app shows (run_format.h), read
  // from the document finish() wrote (or would have written, without a run directory).
  SummaryFields summary_fields() const;
  // start + poll loop + finish; tick is called about every 100 ms with the latest snapshot.
  const RunSummary& run(const std::function<void(const Snapshot&)>& tick = {});
  // Receives every finished step of every rank, in (step, rank) order, on the thread that calls
  // poll() and finish() (the same records as metrics.jsonl). Set before start().
  void set_step_sink(std::function<void(const std::vector<StepRecord>&)> sink) { m_step_sink = std::move(sink); }

  const RunConfig& config() const { return m_cfg; }
  RunControl& control() { return *m_control; }
  std::shared_ptr<const Snapshot> snapshot() const { return std::atomic_load(&m_snapshot); }
  EventLog& events(int rank) { return *m_logs[static_cast<size_t>(rank)]; }
  // A local rank's model; a rank of another process has one in rank 0's process after finish().
  Model& replica(int rank) { return *m_replicas[static_cast<size_t>(rank)]; }
  // Ranks driven by this process (World::local_ranks), ascending.
  const std::vector<int>& local_ranks() const { return m_local; }
  bool is_local(int rank) const { return m_is_local[static_cast<size_t>(rank)] != 0; }
  const Dataset& train_set() const { return m_train; }
  const Dataset& test_set() const { return m_test; }
  int64_t steps_per_epoch() const { return m_steps_per_epoch; }
  int64_t steps_total() const { return m_steps_total; }
  // The epochs the run touches: the last one may be cut short by --steps.
  int64_t epochs_total() const { return (m_steps_total + m_steps_per_epoch - 1) / m_steps_per_epoch; }
  // Ctrl-C: with a run directory and every rank in this process, the ranks stop at the next
  // iteration boundary after writing a checkpoint there (true); otherwise false (stop instead).
  bool interrupt();
  // The run stopped at the checkpoint interrupt() asked for, and where (-1: it did not).
  int64_t interrupted_at() const { return m_interrupted_at.load(); }
  // A resumed run (--resume): the checkpoint's iteration; -1 for a fresh run.
  int64_t resumed_from() const { return m_start_step_resumed; }
  // What resuming found on the way, e.g. a newer checkpoint that was skipped (damaged).
  const std::vector<std::string>& notes() const { return m_notes; }
  // Resolved backends, e.g. {"sgemm", "openblas (Haswell)"}, {"transport", "threads"}.
  std::vector<std::pair<std::string, std::string>> backends() const;

 private:
  struct RankState;
  struct ResumeState;
  struct RankCheckpointRefs;
  struct RankLoop;  // one rank's training loop (rank_loop.cpp)
  struct EpochCounters {  // one epoch's train counters, summed over ranks
    int64_t steps = 0, samples = 0, correct = 0;
  };
  // construction (run.cpp)
  void make_ranks(const WorldFactory& make_world);
  void load_data();
  void build_replicas();
  void open_run_dir();
  void set_up_control();
  // the threads (rank_loop.cpp)
  void rank_main(int rank);
  void server_main();  // the parameter server of a mode that has one (Mode::serve)
  // ranks in other processes (run_remote.cpp)
  EpochCounters epoch_counters(int rank, Transport& transport);
  void gather_to_rank0(int rank, Transport& transport, Model& model);
  const char* intern(const std::string& name);
  // evaluation during the run (rank_loop.cpp): lab::evaluate() on the test set
  EvalResult evaluate(Model& model, Mode mode, int64_t batch_size, int64_t begin, int64_t end,
                      std::vector<float>* first_probs = nullptr);
  bool eval_due(int64_t steps_done) const;
  EvalPoint evaluate_point(Model& model, int64_t steps_done, int64_t epoch);
  // errors (diagnosis.cpp)
  void fail_rank(int rank, const std::exception& e, bool is_comm);
  // --uneven-data without --join: when ranks ran out of data, replaces a timeout by an error that
  // says which ranks waited in which collective and which had finished.
  void throw_if_ranks_ran_out(const std::string& root_what);
  void throw_if_failed();
  void publish();
  // finish's parts (run.cpp, run_summary.cpp)
  void join_threads();
  double write_records(std::vector<std::vector<Event>>& events);
  void summarize(const std::vector<std::vector<Event>>& events, double t_end);
  std::vector<int> final_evaluation();
  ComputeStats communication(const std::vector<std::vector<Event>>& events);
  void write_outputs(const std::vector<std::vector<Event>>& events, const std::vector<int>& differing,
                     const ComputeStats& cs);
  nlohmann::json summary_json(const std::vector<int>& differing, const ComputeStats& cs);
  // summary.json's "memory": every rank's peak and last step, by category, beside ZeRO's formula
  // (psi: the model's parameters).
  nlohmann::json memory_json(int64_t psi);
  // Checkpoints (run_checkpoint.cpp).
  void load_resume();                            // constructor, --resume
  bool checkpoint_due(int64_t step, size_t batch_in_epoch) const;
  void write_checkpoint(int rank, const RankCheckpointRefs& refs);
  RankCheckpoint rank_checkpoint(int rank, const RankCheckpointRefs& refs, ModeCheckpoint& mode_part);
  // Ranks in several processes: at every iteration gate, whether any process was interrupted.
  void vote_on_stop(int rank, int64_t step);
  void restore_rank(int rank, RankCheckpointRefs& refs);
  // A resumed run's figures: what the iterations before the checkpoint added (traffic, seconds),
  // and its trace events before the checkpoint followed by this process's.
  void add_resumed_stats(RunSummary& s, ComputeStats& compute);
  std::vector<std::vector<Event>> trace_events(const std::vector<std::vector<Event>>& events) const;

  RunConfig m_cfg;
  Dataset m_train, m_test;
  int64_t m_steps_per_epoch = 0, m_steps_total = 0;
  std::unique_ptr<World> m_world;
  std::vector<int> m_local;       // World::local_ranks()
  std::vector<char> m_is_local;   // per rank
  std::mutex m_names_mu;
  std::set<std::string> m_names;  // op/what names of events received from other processes
  std::unique_ptr<RunControl> m_control;
  std::vector<std::unique_ptr<EventLog>> m_logs;
  std::vector<std::unique_ptr<Model>> m_replicas;
  std::unique_ptr<ComputeSettingsScope> m_compute_settings;  // from start(): the pool's size, --nondeterministic
  std::vector<std::unique_ptr<RankState>> m_ranks;
  std::vector<std::thread> m_threads;
  std::unique_ptr<RunDir> m_dir;
  std::unique_ptr<nlohmann::json> m_summary_doc;  // summary.json, after finish() (rank 0's process)
  std::shared_ptr<const Snapshot> m_snapshot;
  std::atomic<int> m_running{0};
  double m_t0 = 0;

  // Errors: the first non-communication error is the root cause; else the first error.
  std::mutex m_err_mu;
  std::vector<std::string> m_errors;  // per rank, empty if fine
  int m_root_rank = -1;
  int m_root_code = 0;          // exit code of the root cause (0: no error)
  std::string m_root_what, m_root_hint;

  std::mutex m_epoch_mu;
  std::vector<EpochRecord> m_epochs;
  std::vector<EvalPoint> m_evals;           // under m_epoch_mu
  // --device other than cpu: gives `model` rank `rank`'s executor (executor.h); no-op on the CPU.
  void attach_device(Model& model, int rank);
  nlohmann::json device_summary();          // summary.json's "device": where the model computed, what it moved
  std::string m_device_name;                // the first executor's describe(): "cuda:0 (NVIDIA ...)"
  std::unique_ptr<Model> m_eval_model;      // rank 0's copy for periodic evaluation
  // A mode with a parameter server (transport world_size, a thread of its own) and what it did
  std::unique_ptr<Model> m_server_model;
  std::thread m_server;
  std::atomic<bool> m_server_done{false};
  std::mutex m_async_mu;
  std::vector<std::pair<int, int64_t>> m_async_updates;  // (worker, staleness) per applied push, in order
  std::function<void(const std::vector<StepRecord>&)> m_step_sink;
  // Checkpoints: poll() and a checkpoint's snapshot of the pending records exclude each other.
  std::mutex m_drain_mu;
  std::unique_ptr<ResumeState> m_resume;
  int64_t m_start_step_resumed = -1;
  std::atomic<int64_t> m_interrupted_at{-1};
  std::atomic<bool> m_stop_wanted{false};  // interrupt() in a process of a multi-process run
  bool m_stop_vote = false;                // the ranks vote every iteration (several processes, a run directory)
  std::vector<std::string> m_notes;
  RunSummary m_summary;
  bool m_finished = false;
};

}  // namespace lab
