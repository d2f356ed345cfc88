// A parallelism mode as a thing: DistributedDataParallel, nn.DataParallel, local SGD, the
// parameter server, and whatever comes next. A mode has a name, the settings it owns, what it can
// do (capabilities), what one rank does per iteration and at the end of an epoch, what it adds to
// a checkpoint and to summary.json, and the words the front ends use for it. Run (lab/run) drives
// every mode through this interface; outside lab/modes/ nothing compares a mode's name: the CLI,
// the configuration checks, the app and lessons ask the registry and the capabilities.
//
// Writing a mode: lab/modes/README.md (the smallest real mode, local SGD, is the worked example).
// One file per mode (mode_<name>.cpp) over the mechanisms (ddp.h, data_parallel.h, local_sgd.h,
// join.h, async_ps.h), and one line in builtin_modes() (mode_registry.cpp).
//
// Sections: capabilities | the mode's own settings | what a rank's mode gets | RankMode (one rank) |
// the parameter server's side | summary | ParallelMode | the registry
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "config.h"
#include "faults.h"
#include "memory.h"
#include "safetensors.h"

namespace lab {

class CommWorker;
class Communicator;
class Model;
class Optimizer;
class Transport;
struct Dataset;
struct StepRecord;
struct RunSummary;
struct Event;
struct EpochRecord;
struct EvalResult;
struct Tensor;

// ---- capabilities: what a mode can do, asked instead of its name ----
struct ModeCaps {
  bool gradient_allreduce = false;   // DDP's gradient buckets: --bucket-cap-mb, --no-overlap, --allreduce
  bool sync_bn = false;              // --bn sync (SyncBatchNorm needs every rank in one forward)
  bool buffer_broadcast = false;     // --no-broadcast-buffers applies (DDP's broadcast_buffers)
  bool no_sync = false;              // --no-sync-steps (DDP.no_sync)
  bool uneven_data = false;          // --uneven-data and --join (DDP's Join)
  bool skip_step = false;            // --on-nonfinite skip-step and --fail-at nan
  bool checkpoints = false;          // --checkpoint-every, --checkpoint-every-epoch, --resume
  bool fail_at_allreduce = false;    // --fail-at allreduce can fire (the mode has gradient allreduces)
  bool threads_only = false;         // every rank in one process: --comm threads only
  bool global_batch = false;         // --batch-size is the global batch, split over the devices
  bool distributed_sampler = true;   // each rank draws from a DistributedSampler (--sampler-drop-last)
  bool master_device = false;        // every byte to or from device 0 (DataParallel): views draw it so
  bool averages_parameters = false;  // parameters are averaged between ranks (local SGD)
  bool own_parameters = false;       // ranks may end with parameters of their own (local SGD between
                                     // averagings): final.rank<R>.safetensors and summary's list of them
  bool parameter_server = false;     // a server beside the ranks (one more transport; views draw it)
  bool ranks_evaluate_epochs = true; // the ranks evaluate at the end of every epoch (else the server)
  bool replicas_are_models = true;   // every rank's model is a model of its own (not a per-step replica)
  bool counts_trained_samples = false;  // the run's samples are counted as trained, not from the sampler
  bool sharded_collectives = false;  // reduce-scatter and all-gather carry training (FSDP): the views name them
  bool one_loader = false;           // the ranks split the model, not the data: every rank of a data-parallel
                                     // replica (--dp; one by default) iterates the same batches of one loader
                                     // (a pipeline's stages, tensor parallelism's slices), and --batch-size is
                                     // the replica's samples per iteration
  bool micro_batches = false;        // the batch is cut into --microbatches that flow through stages (a
                                     // pipeline): the Pipeline view draws it
};

// ---- the mode's own settings: what the app shows and what has no effect elsewhere ----
struct ModeSetting {
  std::string field;    // RunConfig's name: "average_every"
  std::string flag;     // "--average-every"
  std::string label;    // the app's label: "average every"
  enum class Kind { Int, Bool, Choice } kind = Kind::Int;
  std::vector<std::pair<std::string, std::string>> choices;  // Choice: (value, what it does)
  int64_t min = 0;                   // Int: the smallest value
  std::string help;                  // the app's tooltip
  std::string pytorch;               // what it is in PyTorch, for messages ("PeriodicModelAverager")
  bool exclusive = true;             // only this mode has it (false: the app shows it here, and other
                                     // modes may have it too: DDP's overlap applies to local SGD's warm-up)
  std::function<bool(const RunConfig&)> shown;  // shown only when this holds (empty: always)
};

// ---- what a rank's mode gets from the run (owned by the rank loop, lab/run/rank_loop.cpp) ----
// faults (faults.h): where this rank fails on purpose (--fail-rank/--fail-step/--fail-at).
struct RankEnv {
  const RunConfig& cfg;
  int rank = 0;
  int world = 1;
  Model& model;
  Communicator& comm;
  Transport& transport;
  CommWorker& worker;       // the rank's communication thread (DDP's overlap)
  Optimizer& opt;
  const Dataset& train;
  const FaultPlan& faults;
  int64_t steps_per_epoch = 0, steps_total = 0;
  // The run's gate before iteration `step` (pause, single steps, stop): an iteration a mode runs
  // outside the rank loop (DDP join's shadow iterations) passes it too.
  std::function<void(int64_t step)> iteration_gate;
  // A rank that ran out of data while others still train (--uneven-data without --join): where,
  // for the run's diagnosis of the timeout that follows.
  std::function<void(int64_t step, int64_t epoch, int64_t batches)> ran_out_of_data;
  // The rank's memory accounting (memory.h): the rank loop records the step's start and end, a
  // mode the points in between where its bytes change ("forward", "backward: all-gather 4").
  MemoryLedger* memory = nullptr;
  void memory_at(const std::string& point) const {
    if (memory) memory->sample(point);
  }
};

// What a rank's mode adds to a checkpoint (beside the model, the optimizer, the counters and the
// records the rank loop saves), and reads back.
struct ModeCheckpoint {
  nlohmann::json counters = nlohmann::json::object();  // merged into rank<R>.json
  std::vector<SafeTensor> tensors;                    // added to rank<R>.safetensors
  bool require_forward_param_sync = true;             // DDP: the next forward syncs buffers (state.json)
  // Whether the model's parameters are the rank's state (saved and restored with the model). false:
  // the mode's tensors hold them (FSDP's shards; the model's are freed between iterations) and the
  // checkpoint keeps the model's buffers only.
  bool model_parameters = true;
};

// One iteration of a rank.
struct StepInput {
  int64_t step = 0;                     // the global iteration
  int64_t epoch = 0;
  int64_t batch = 0;                    // index of the batch within the epoch
  const std::vector<int64_t>* indices = nullptr;  // the batch's dataset indices (dp: the global batch)
  const Tensor* x = nullptr;            // (n, 1, 28, 28), gathered
  const std::vector<int>* labels = nullptr;
};

// What an iteration adds to the epoch's train figures and the run's counters (the record itself
// carries loss, correct, batch_size and the mode's fields).
struct StepCount {
  bool counts = true;             // adds the record's loss and correct, `samples` and one step
  int64_t samples = 0;            // samples the epoch's accuracy divides by
  int64_t trained = 0;            // samples the run trained (summary.json's samples)
  bool record_bn = true;          // the record holds this rank's BatchNorm statistics
};

// ---- RankMode: one rank's share of a mode, across the run ----
class RankMode {
 public:
  virtual ~RankMode() = default;
  // Before the first iteration of a run that starts fresh (DDP: rank 0's state everywhere).
  virtual void start() {}
  // This rank's batches of `epoch`, as dataset indices (DistributedSampler's, DataParallel's loader).
  virtual std::vector<std::vector<int64_t>> batches(int64_t epoch) = 0;
  // The rank's samples per epoch (its sampler's num_samples; the batch-of-one hint says it).
  virtual int64_t samples_per_epoch() const = 0;
  // Before the batch is gathered, after the iteration gate: what the iteration must know first.
  virtual void before_step(const StepInput&) {}
  // One iteration: forward, backward, communication, optimizer step. Fills the record's loss,
  // correct, batch_size and the mode's own fields (chunks, param_drift, grad_sync, staleness, ...).
  virtual StepCount step(const StepInput& in, StepRecord& rec) = 0;
  // After the epoch's batches: what the rank does while others may still train (DDP's join:
  // shadow their collectives; --uneven-data without it: wait to be stopped). `step` is the next
  // iteration; batches_done: how many the rank had.
  virtual void after_batches(int64_t epoch, int64_t& step, int64_t batches_done) {
    (void)epoch, (void)step, (void)batches_done;
  }
  // Before the end-of-epoch evaluation: DDP's no-grad forward broadcasts rank 0's buffers;
  // DataParallel replicates device 0's module.
  virtual void before_evaluation() {}
  // Every rank, after an iteration whose end rank 0 evaluates its model at (--eval-every): a mode
  // whose ranks hold only shards of it (FSDP) makes it whole first.
  virtual void before_periodic_evaluation() {}
  // After the run's last iteration (the parameter server's Done).
  virtual void finish() {}
  // Checkpoints: what the mode adds, and reads back (counters: the rank's whole rank<R>.json;
  // tensors: the checkpoint's tensors that are neither the model's nor the optimizer's).
  // epochs_done: the epochs finished before the checkpoint (DataParallel's loader replays them).
  virtual void save(ModeCheckpoint& mc) const { (void)mc; }
  // Memory accounting (memory.h): b holds the model's parameters and gradients, the optimizer's
  // state and the saved activations as the rank loop measured them; a mode adds its own buffers
  // (DDP's buckets) or says what the model's bytes are (FSDP: its shards are the parameters, the
  // model's gathered ones are gathered_parameters).
  virtual void measure_memory(MemoryBytes& b) const { (void)b; }
  virtual void restore(const ModeCheckpoint& mc, int64_t epochs_done) { (void)mc, (void)epochs_done; }
  // The checkpoint's names of the parameters the rank's optimizer steps, where they are not the
  // model's own (a mode's copies: tensor parallelism's slices, "tp.4.weight"); empty: the model's
  // state_dict names of them (a pipeline stage's: "4.weight"), else their own names (FSDP's shards).
  virtual std::vector<std::string> optimizer_param_names() const { return {}; }
};

// ---- the parameter server's side (a thread beside the ranks: caps.parameter_server) ----
struct ServerEnv {
  const RunConfig& cfg;
  Model& model;                        // the server's model
  Transport& transport;                // the server's transport (rank world_size)
  const Dataset& test;
  int64_t steps_per_epoch = 0, steps_total = 0, epochs_total = 0;
  std::function<void(const EpochRecord&)> record_epoch;       // one epoch of the server's figures
  std::function<void(int worker, int64_t staleness)> record_update;  // every applied push, in order
};

// ---- summary: what the mode adds to summary.json and the console ----
struct SummaryEnv {
  const RunConfig& cfg;
  const RunSummary& summary;
  const std::vector<std::vector<Event>>& events;  // every rank's, this process's clock
  std::vector<int> ranks_with_own_parameters;      // ranks whose parameters differ from rank 0's
};

// The collectives that synchronize training in a mode (the views show these first): an op ("" any)
// and what they carry ("grad bucket", ...; empty: anything).
struct SyncCollectives {
  std::string op = "allreduce";                  // "" for any
  std::vector<std::string> what{"grad bucket"};  // empty for any (default: DDP's gradient buckets)
};

// ---- ParallelMode ----
class ParallelMode {
 public:
  virtual ~ParallelMode() = default;
  virtual const char* name() const = 0;        // "ddp": --mode's value
  virtual const char* title() const = 0;       // "DistributedDataParallel": PyTorch's name
  virtual const char* help() const = 0;        // a few words for --mode's help ("DistributedDataParallel")
  virtual const char* about() const = 0;       // what it does, for the app's tooltip and the docs
  virtual ModeCaps caps() const = 0;
  // The settings the mode owns (they have no effect in other modes; the app shows them).
  virtual std::vector<ModeSetting> settings() const { return {}; }
  // The values of the mode's own settings, checked whatever the mode (a bad --average-every is an
  // error even under --mode ddp, where it has no effect).
  virtual void validate_settings(const RunConfig& c) const { (void)c; }
  // When it is the configuration's mode: combinations it refuses in its own words (PyTorch's
  // where PyTorch has them), before the run's checks by capability (config.cpp).
  virtual void validate(const RunConfig& c) const { (void)c; }
  // Why `setting` (RunConfig's name) has no effect under this mode in configuration c, in the
  // mode's own words ("" when the mode has nothing to say: config_effects.h's general rules
  // apply). "fail_at": why --fail-at cannot fire at --fail-step.
  virtual std::string no_effect_reason(const RunConfig& c, const std::string& setting) const {
    (void)c, (void)setting;
    return "";
  }
  // Settings the mode derives when the configuration leaves them open (the pipeline's stage map,
  // --balance), filled in before the run prints and writes its configuration.
  virtual void resolve(RunConfig& c) const { (void)c; }
  // Short words: "DDP, 4 ranks, ring allreduce", "DataParallel, 4 devices".
  virtual std::string describe(const RunConfig& c) const = 0;
  // What a member of the world is called: "rank" (DataParallel: "device").
  virtual const char* member() const { return "rank"; }
  // The run header's mode line after "mode=<name>" (settings worth echoing).
  virtual std::string header(const RunConfig& c) const { (void)c; return ""; }
  // One rank's part of the mode.
  virtual std::unique_ptr<RankMode> make_rank(RankEnv& env) const = 0;
  // The parameter server's loop (caps.parameter_server only).
  virtual void serve(ServerEnv& env) const { (void)env; }
  // summary.json's section(s) of this mode (e.g. "ddp": the buckets).
  virtual void summary(const SummaryEnv& env, nlohmann::json& j) const { (void)env, (void)j; }
  // What the app's settings notes say about this configuration under the mode, as (setting, note):
  // steps_total: the iterations the run will take.
  virtual std::vector<std::pair<std::string, std::string>> notes(const RunConfig& c, int64_t steps_total) const {
    (void)c, (void)steps_total;
    return {};
  }
  // The ZeRO stage of its memory (memory.h's ZeroFormula): 0 replicates everything (DDP), 1 shards
  // the optimizer state, 2 the gradients too, 3 the parameters too.
  virtual int zero_stage(const RunConfig& c) const { (void)c; return 0; }
  // A mode that splits the model (a pipeline's stages, tensor parallelism's slices): the parameters
  // (elements) `rank` holds, its Psi_r in the formula (8+K) Psi_r; -1 for a mode whose every rank
  // holds the whole model (the ZeRO stages' Psi).
  virtual int64_t rank_parameters(const RunConfig& c, int rank) const { (void)c, (void)rank; return -1; }
  // The collectives that synchronize its training (the Allreduce view's first choice).
  virtual SyncCollectives sync_collectives() const { return {}; }
  // Lines the console prints after a run, beside the communication figures.
  virtual std::vector<std::string> summary_lines(const RunConfig& c, const RunSummary& s) const {
    (void)c, (void)s;
    return {};
  }
};

// ---- the registry ----
// Every mode, in the order --mode's help and the app list them: the built-in ones
// (builtin_modes(), mode_registry.cpp) and any added with register_mode().
const std::vector<const ParallelMode*>& modes();
// The mode called `name`, or nullptr.
const ParallelMode* find_mode(const std::string& name);
// The configuration's mode; throws ConfigError naming --mode and the known ones.
const ParallelMode& mode_of(const RunConfig& c);
// Adds a mode (a test's toy mode, or a plug-in's). Throws ConfigError for a name already taken.
void register_mode(std::unique_ptr<ParallelMode> mode);
// "ddp, dp, local-sgd or async"
std::string mode_names(const char* last_joiner = "or");
// The names of the modes that have a capability: modes_with(&ModeCaps::checkpoints) is
// "ddp, dp and local-sgd".
std::string modes_with(bool ModeCaps::*cap);

// Samples per iteration over all ranks (DataParallel: --batch-size is already the global batch).
int64_t global_batch(const RunConfig& c);
// Whether a run can write checkpoints and be resumed: its mode can, and every rank is at the same
// iteration (not with --uneven-data or --join).
bool checkpointable(const RunConfig& c);

}  // namespace lab
