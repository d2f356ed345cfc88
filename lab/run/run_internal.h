// What the files of Run share (run.cpp, rank_loop.cpp, run_checkpoint.cpp, run_summary.cpp,
// diagnosis.cpp, run_remote.cpp): not part of Run's interface.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "batchnorm.h"
#include "checkpoint.h"
#include "config.h"
#include "errors.h"
#include "faults.h"
#include "lr_schedule.h"
#include "run.h"

namespace lab {

class Communicator;
class RankMode;
class Optimizer;
class LrSchedule;

// Run-internal messages between processes go straight over the transport, not through a
// Communicator: they record no events and are not counted in bytes_sent, so an MPI run's
// metrics equal an emulated run's. Their tags lie at the top of the tag space, far from the
// collectives' sequence numbers. Between one pair, messages with one tag arrive in order.
constexpr uint64_t kRunTagBase = uint64_t{1} << 62;
constexpr uint64_t kTagEpochCounters = kRunTagBase + 1;  // int64 {steps, samples, correct}
constexpr uint64_t kTagReportSize = kRunTagBase + 2;     // uint64 byte count of the report
constexpr uint64_t kTagReport = kRunTagBase + 3;         // RankReport (run_wire.h)
constexpr uint64_t kTagCheckpoint = kRunTagBase + 4;     // int64 step: the rank's checkpoint files are written
constexpr uint64_t kTagStopVote = kRunTagBase + 5;       // int64: this process was interrupted (1) or not (0)
constexpr uint64_t kTagStopDecision = kRunTagBase + 6;   // int64: every rank stops here (1) or goes on (0)

// One rank's state that the run's other threads read: finished steps waiting to be written, the
// latest step for snapshots, the epoch's counters.
struct Run::RankState {
  std::mutex mu;
  std::deque<StepRecord> pending;  // finished steps not yet written
  std::shared_ptr<const StepRecord> latest;
  double loss_sum = 0;             // over the current epoch
  int64_t correct = 0, samples = 0, steps = 0;
  // Parallelism modes.
  int64_t trained_samples = 0;     // over the run (DataParallel: device 0 counts the global batch)
  std::vector<std::pair<int64_t, double>> drifts;  // local-sgd: (step, drift) per averaging
  std::vector<int64_t> skipped;                    // --on-nonfinite skip-step: iterations without a step
  std::vector<std::pair<int64_t, std::string>> nonfinite;  // (iteration, parameter): NaN/inf here first
  int64_t out_of_data_step = -1;   // --uneven-data without --join: the rank ran out at this step,
  int64_t out_of_data_epoch = 0;   // in this epoch,
  int64_t out_of_data_batches = 0; // after this many batches of it
  // Memory (memory.h), from the records: the step with the highest total and its points, and the
  // last step's points.
  MemoryPeak memory_peak;
  std::vector<MemorySample> memory_last_points;
  void note_memory(const StepRecord& rec) {
    if (rec.memory.empty()) return;
    memory_last_points = rec.memory;
    memory_peak.offer(rec.step, rec.memory);
  }
};

// What a rank's training loop holds that a checkpoint saves and a resumed run restores (besides
// the run's own per-rank state): the model, the optimizer, the mode's state (mode.h), the
// communicator's counters, the schedule and when the epoch began.
struct Run::RankCheckpointRefs {
  Model& model;
  Optimizer& opt;
  RankMode& mode;
  Communicator& comm;
  LrSchedule& schedule;
  double& t_epoch0;      // when the current epoch's training began (now_seconds)
  int64_t step = 0;      // write_checkpoint: the iteration about to run
  int64_t epoch = 0;
  int64_t batch = 0;
};

// --resume: the checkpoint, read in the constructor.
struct Run::ResumeState {
  FoundCheckpoint found;
  CheckpointState state;
  std::vector<RankCheckpoint> ranks;              // local ranks' parts (others: empty)
  std::vector<std::vector<Event>> events;         // every rank's traced events before it (rank 0's process)
  TrafficStats traffic;                           // the training steps' messages before it
  OverlapStats overlap;
  ComputeStats compute;
  double elapsed = 0;                             // seconds since the run's start at the checkpoint
  double eval_seconds = 0;                        // of which rank 0 spent evaluating
};


// What BatchNorm's batch-of-one error adds: which batch it was and how to avoid it.
std::string batch_of_one_hint(const RunConfig& c, int rank, size_t batch, int64_t epoch, int64_t samples_per_rank);
// What each BatchNorm layer saw in the last training forward, for metrics and the GUI.
std::vector<BnLayerRecord> bn_layer_records(const std::vector<BatchNorm*>& bns, const std::vector<int>& bn_index,
                                            bool track_running_stats);

}  // namespace lab
