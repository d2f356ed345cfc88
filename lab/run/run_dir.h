// RunDir: the run directory, the contract between a headless run and everything that reads runs
// (the GUI, lessons, comparison scripts). Files:
//   config.toml         the resolved configuration (config.h), written before training starts
//   metrics.jsonl       one JSON object per line: {"kind":"step", rank, step, ...} per step and
//                       rank in (step, rank) order, and {"kind":"epoch", ...} after each epoch.
//                       With eval_every > 0, {"kind":"eval", ...} per periodic evaluation (test
//                       accuracy and loss in eval and train mode, one probe input's outputs).
//                       BatchNorm arrays per layer: batch_mean/batch_var (used to normalize),
//                       local_mean/local_var (the rank's own batch; only when they differ, i.e.
//                       SyncBN), running_mean/running_var/num_batches_tracked (when tracked).
//                       Modes add: chunks (dp, device 0: torch.chunk sizes; its batch_size, loss and
//                       accuracy are the global batch's, other devices' lines have their chunk and
//                       loss null), param_drift (local-sgd, at averaging steps), grad_sync: false
//                       (a backward under no_sync).
//   trace.json          Chrome Trace Event format (open in Perfetto / chrome://tracing): one
//                       process per rank, compute on thread 0, communication on thread 1
//   init.safetensors    rank 0's parameters and buffers after DDP's initial broadcast
//   final.safetensors   rank 0's parameters and buffers at the end
//   final.rank<R>.buffers.safetensors   rank R's buffers, only where they differ from rank 0's
//   summary.json        final evaluation, steps, epochs, throughput; mode, traffic (bytes, rank 0's
//                       share), communication (seconds, hidden behind backward), local_sgd (drift)
#pragma once

#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "events.h"
#include "safetensors.h"

namespace lab {

struct StepRecord;
struct EpochRecord;
struct EvalPoint;

constexpr int kRunDirFormatVersion = 1;

class RunDir {
 public:
  // Creates the directory (and parents) and checks it is writable; throws IoError naming it.
  explicit RunDir(const std::string& path);
  const std::string& path() const { return m_path; }
  std::string file(const std::string& name) const { return m_path + "/" + name; }

  void write_text(const std::string& name, const std::string& text);
  void write_json(const std::string& name, const nlohmann::json& j);
  void append_steps(const std::vector<StepRecord>& records);
  void append_epoch(const EpochRecord& e);
  // {"kind":"eval", steps, epoch, samples, eval_mode:{accuracy,loss}, train_mode:{...}, probe}
  void append_eval(const EvalPoint& p);
  // events_per_rank[r]: rank r's events; only those with train_step < max_step (or all when
  // max_step < 0, plus those outside training) are written.
  void write_trace(const std::vector<std::vector<Event>>& events_per_rank, int64_t max_step,
                   const nlohmann::json& metadata);
  void write_weights(const std::string& name, const std::vector<SafeTensor>& tensors,
                     const std::map<std::string, std::string>& metadata);

 private:
  std::string m_path;
  std::ofstream m_metrics;
};

// One metrics.jsonl line (no newline) and the same as a JSON value.
std::string step_record_line(const StepRecord& r);
nlohmann::json step_record_json(const StepRecord& r);

}  // namespace lab
