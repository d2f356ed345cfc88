// Checkpoints: everything a run needs to continue bit for bit from a step boundary, written so
// that a kill at any moment (SIGKILL, power loss) leaves a committed checkpoint behind.
//
// Layout, in the run directory:
//   checkpoints/step-00000040/            one committed checkpoint (after 40 iterations)
//     rank<R>.safetensors                 rank R's parameters, buffers, and optimizer state
//                                         ("optim.momentum.<name>": SGD's momentum buffers)
//     rank<R>.json                        rank R's counters (the epoch's loss and accuracy sums,
//                                         samples trained, bytes sent, local SGD's drifts, DDP's
//                                         buckets) and its traffic and seconds so far
//     rank<R>.records                     rank R's step records not yet in metrics.jsonl
//     rank<R>.events                      the rank's events of the traced iterations (trace.json)
//     state.json                          where to continue (iteration, epoch, batch), the
//                                         configuration, the epochs and evaluations so far, the
//                                         seconds so far, the sizes metrics.jsonl and
//                                         bn_stats.bin had, and a CRC-32 of every file above
//     COMMITTED                           written last: the CRC-32 of state.json
//
// Protocol (write_checkpoint): every file goes into checkpoints/.tmp-step-N/ and is fsync'd; the
// directory is renamed to step-N and checkpoints/ fsync'd; then COMMITTED is written to a
// temporary name, fsync'd, renamed, and the directory fsync'd again. A checkpoint without a valid
// COMMITTED, or whose files do not match their CRCs, is not used: resume falls back to the one
// before (the previous checkpoint is deleted only after the new one is committed).
//
// What needs no saving: the DistributedSampler's order and DataParallel's loader are functions of
// the seed and the epoch; the learning-rate schedule of the number of epochs done; no other random
// numbers are drawn during training.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "comm_stats.h"
#include "config.h"
#include "run.h"
#include "safetensors.h"

namespace lab {

constexpr int kCheckpointFormatVersion = 1;

// One rank's part of a checkpoint.
struct RankCheckpoint {
  std::vector<SafeTensor> tensors;  // parameters, buffers, "optim.momentum.<name>"
  nlohmann::json counters;          // see the layout above
  std::vector<char> records;        // encode_rank_report (ranks of other processes), or empty
  std::vector<char> events;         // encode_rank_report of the traced events, or empty
};

// Where a run continues and what it carried so far.
struct CheckpointState {
  int64_t step = 0;    // iterations done: the next one to run
  int64_t epoch = 0;   // the epoch that iteration belongs to
  int64_t batch = 0;   // its batch index within the epoch
  bool require_forward_param_sync = true;
  std::vector<EpochRecord> epochs;
  std::vector<EvalPoint> evals;
  double elapsed = 0;               // seconds since the run's start (wall clock)
  double eval_seconds = 0;          // of them, rank 0's evaluations
  uint64_t metrics_bytes = 0;       // metrics.jsonl's size at the checkpoint
  uint64_t bn_stats_bytes = 0;      // bn_stats.bin's size (0: none)
  std::string config_toml;          // the run's configuration
  int world_size = 0;
  std::string model, mode;
  bool interrupted = false;         // written because of SIGINT / SIGTERM
};

// CRC-32 (IEEE 802.3, as zlib's crc32) of bytes.
uint32_t crc32_of(const std::string& bytes);

// Writes rank `rank`'s files into the checkpoint being written for step `step` (the temporary
// directory; created if needed). Every rank calls this before write_checkpoint_state.
// Files left in the same .tmp directory by an earlier, killed attempt at this checkpoint are
// replaced, or removed where this one has none.
void write_rank_checkpoint(const std::string& run_dir, int64_t step, int rank, const RankCheckpoint& rc);
// Rank `rank`'s step records not yet in metrics.jsonl (encode_rank_report), beside its files.
void write_rank_records(const std::string& run_dir, int64_t step, int rank, const std::vector<char>& records);
// Writes state.json and commits the checkpoint (the protocol above); then deletes every older
// checkpoint but the one before it. Throws IoError naming the file.
void commit_checkpoint(const std::string& run_dir, const CheckpointState& st);

// The newest committed, intact checkpoint of a run directory: its directory, with `notes` saying
// which newer ones were skipped and why. Throws IoError when there is none.
struct FoundCheckpoint {
  std::string dir;
  int64_t step = 0;
  std::vector<std::string> notes;
};
FoundCheckpoint find_checkpoint(const std::string& run_dir);
CheckpointState read_checkpoint_state(const std::string& dir);
RankCheckpoint read_rank_checkpoint(const std::string& dir, int rank);

// rank<R>.json alone (the counters), for the ranks of other processes.
nlohmann::json read_rank_counters(const std::string& dir, int rank);

// JSON forms (state.json holds them).
nlohmann::json epoch_json(const EpochRecord& e);
EpochRecord epoch_from_json(const nlohmann::json& j);
nlohmann::json eval_json(const EvalPoint& p);
EvalPoint eval_from_json(const nlohmann::json& j);
nlohmann::json traffic_json(const TrafficStats& t);
TrafficStats traffic_from_json(const nlohmann::json& j);
// a + b (b's ranks and parts added to a's)
TrafficStats add_traffic(const TrafficStats& a, const TrafficStats& b);
nlohmann::json overlap_json(const OverlapStats& o);
OverlapStats overlap_from_json(const nlohmann::json& j);
OverlapStats add_overlap(const OverlapStats& a, const OverlapStats& b);
nlohmann::json compute_json(const ComputeStats& c);
ComputeStats compute_from_json(const nlohmann::json& j);
ComputeStats add_compute(const ComputeStats& a, const ComputeStats& b);

// Writes `bytes` to path through a temporary file: write, fsync, rename, fsync of the directory.
void write_file_atomic(const std::string& path, const std::string& bytes);

}  // namespace lab
