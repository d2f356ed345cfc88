// RunDir: the run directory a run writes, the contract between a headless run and everything that
// reads runs (the app, lessons, comparison scripts). Its files and their schema: run_format.h,
// which writes and reads every record; RunDir is the writer that appends them as the run goes
// (metrics.jsonl line by line, bn_stats.bin by step) and cuts them back on --resume. Also here:
// what a folder given as --out already holds, and the rule that a run is never replaced unasked.
#pragma once

#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bn_stats.h"
#include "events.h"
#include "run_format.h"
#include "safetensors.h"

namespace lab {

// The sizes of the files a run appends to (a checkpoint keeps them: a resumed run cuts the files
// back to them, dropping what was written after the checkpoint).
struct RunDirSizes {
  uint64_t metrics = 0;   // metrics.jsonl
  uint64_t bn_stats = 0;  // bn_stats.bin (0: none yet)
};

class RunDir {
 public:
  // Creates the directory (and parents) and checks it is writable; throws IoError naming it.
  // keep: a resumed run, which continues metrics.jsonl (and bn_stats.bin) from these sizes.
  explicit RunDir(const std::string& path, const RunDirSizes* keep = nullptr);
  ~RunDir();
  const std::string& path() const { return m_path; }
  // BatchNorm statistics go to bn_stats.bin (bn_stats.h) for the steps --record-bn chooses ("off":
  // nowhere). Without this call they stay in metrics.jsonl, as run directories of format 1 had them.
  void set_bn_stats(int world_size, const std::string& policy);
  // --record-memory: step lines carry their memory points (memory.h).
  void set_record_memory(bool on) { m_record_memory = on; }
  // Everything appended so far on disk (the last complete step's BatchNorm statistics too): the
  // sizes a checkpoint records.
  RunDirSizes sync_sizes();
  // The last step's statistics, once every record of the run has been appended.
  void flush_bn();
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
  RunDirSizes m_keep;
  std::string m_bn_policy;
  bool m_record_memory = false;
  int m_bn_world = 0;
  std::unique_ptr<BnStatsWriter> m_bn;
  std::vector<StepRecord> m_bn_pending;  // the records of the step being collected
};

// What a folder already holds, before a run writes into it (--out): nothing (missing or empty), a
// run directory (finished, interrupted with a checkpoint, or ended without one), or files that
// are not a run.
struct OutDirContents {
  enum class Kind { Empty, Run, Other };
  Kind kind = Kind::Empty;
  std::string what;             // "a finished run (cnn, 120 steps, test accuracy 0.8123)"
  int64_t checkpoint_step = -1; // the newest usable checkpoint (a run that can be resumed), or -1
  bool finished = false;        // summary.json without "interrupted"
};
OutDirContents inspect_out_dir(const std::string& path);

// Makes `path` ready for a new run. A run is never replaced unasked: a folder that holds
// anything is refused (IoError, exit 4, saying what is there and how to continue it), unless
// `overwrite` and it is a run directory, whose files (and only those) are then removed. A folder
// that is not a run directory is refused even with `overwrite`: dtlab deletes only what it wrote.
// `flag` names the option in messages ("--out").
void prepare_out_dir(const std::string& path, bool overwrite, const std::string& flag = "--out");

// `base` when nothing is there (or an empty folder), else the first of base-2, base-3, ... that is:
// where a session that starts several runs (the app's Reset) puts each one.
std::string fresh_dir_name(const std::string& base);

// The files and folders a run writes into its run directory (what --overwrite removes).
bool is_run_dir_entry(const std::string& name);

}  // namespace lab
