// The run directory's format: the schema of every file a run writes, written and read by this code
// only. RunDir (run_dir.h) writes through it; the app (viz/data/run_dir_reader.cpp) and the lesson
// runner (lessons/runner/quantity.cpp) read through it. A field added here is written and read in
// one place, and tests/test_run_format.cpp reads back every field it writes. (checkpoints/ has its
// own forms of these records, with the run's state: checkpoint.h.)
//
// Files (format version kRunDirFormatVersion, recorded in summary.json's "format_version"; a run
// directory of a newer format is refused by name):
//   config.toml         the resolved configuration (config.h)
//   metrics.jsonl       one JSON object per line, in the order they happened:
//     {"kind":"step", ...}   per step and rank, in (step, rank) order: StepRecord (run.h); the
//                            BatchNorm arrays ("bn") only where bn_stats.bin is not written (older
//                            run directories); mode fields only when set (chunks, param_drift,
//                            grad_sync, param_checksum, skipped, nonfinite, staleness + version);
//                            with --record-memory, "memory": the rank's points of the step (memory.h),
//                            [{"at":"forward","bytes":[parameters, gradients, optimizer_state,
//                            activations, comm_buffers, gathered_parameters]}, ...]
//     {"kind":"epoch", ...}  after each epoch: EpochRecord
//     {"kind":"eval", ...}   per periodic evaluation (--eval-every): EvalPoint
//   bn_stats.bin        the BatchNorm statistics of the steps --record-bn chooses (bn_stats.h)
//   trace.json          Chrome Trace Event format (Perfetto, chrome://tracing): one process per
//                       rank; compute on thread 0, collectives on 1, ring chunks on 2
//   init.safetensors, final.safetensors, final.rank<R>.buffers.safetensors   weights (safetensors.h)
//   summary.json        the run's outcome (Run::summary_json, run_summary.cpp); read here for the
//                       fields the app shows (SummaryFields)
//   checkpoints/        --checkpoint-every (checkpoint.h)
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "events.h"
#include "run.h"

namespace lab {

constexpr int kRunDirFormatVersion = 1;

// The files' names in a run directory.
namespace run_files {
constexpr const char* kConfig = "config.toml";
constexpr const char* kMetrics = "metrics.jsonl";
constexpr const char* kBnStats = "bn_stats.bin";
constexpr const char* kTrace = "trace.json";
constexpr const char* kSummary = "summary.json";
constexpr const char* kInitWeights = "init.safetensors";
constexpr const char* kFinalWeights = "final.safetensors";
constexpr const char* kCheckpoints = "checkpoints";
}  // namespace run_files

// ---- metrics.jsonl ----

// One step line (no newline), with or without the BatchNorm arrays and the memory points, and the
// same as a JSON value (with both).
std::string step_record_line(const StepRecord& r, bool with_bn, bool with_memory = false);
nlohmann::json step_record_json(const StepRecord& r);
// Memory points (memory.h) as metrics.jsonl, summary.json and checkpoints hold them:
// [{"at": "forward", "bytes": [one number per category, memory.h's order]}, ...]. The reader
// throws nlohmann::json's exceptions on a malformed value (its callers name the file).
nlohmann::json memory_points_json(const std::vector<MemorySample>& points);
std::vector<MemorySample> memory_points_from_json(const nlohmann::json& j);
nlohmann::json epoch_record_json(const EpochRecord& e);  // {"kind":"epoch", ...}
nlohmann::json eval_point_json(const EvalPoint& p);      // {"kind":"eval", ...}

// The records read back. Lenient where older run directories differ (a missing field keeps its
// default; a null loss is NaN; local_* absent means equal to batch_*); an integer field holding a
// float no integer of its type holds is std::out_of_range, a wrong JSON type nlohmann's
// type_error: read_metrics turns both into an IoError naming the file and line.
StepRecord step_record_from_json(const nlohmann::json& j);
EpochRecord epoch_record_from_json(const nlohmann::json& j);
EvalPoint eval_point_from_json(const nlohmann::json& j);

// Reads metrics.jsonl line by line, handing each record to its callback (a null callback skips
// that kind). Lines of other kinds are skipped (a newer dtlab may add some). Throws IoError naming
// the file (and line) when it cannot be read, a line is not JSON or a record is malformed.
struct MetricsReader {
  std::function<void(StepRecord&&, int line)> on_step;
  std::function<void(EpochRecord&&)> on_epoch;
  std::function<void(EvalPoint&&)> on_eval;
};
void read_metrics(const std::string& path, const MetricsReader& reader);
// Every line as JSON, for readers that look fields up by JSON pointer (the lesson runner).
std::vector<nlohmann::json> read_metrics_json(const std::string& path);

// ---- trace.json ----

// events_per_rank[r]: rank r's events; only those with train_step < max_step (or all when
// max_step < 0, plus those outside training) are written. metadata becomes "otherData".
void write_trace(const std::string& path, const std::vector<std::vector<Event>>& events_per_rank, int64_t max_step,
                 const nlohmann::json& metadata);

struct TraceContents {
  nlohmann::json other_data = nlohmann::json::object();  // the metadata written with it
  int64_t train_samples = 0, test_samples = 0;            // from it (0: not there)
  std::vector<std::vector<Event>> per_rank;               // events of ranks 0 .. world - 1
};
// Reads trace.json back into events (Event holds its names as static strings: `intern` returns a
// string that outlives the events for each name read). Events of ranks outside [0, world) and
// metadata events are skipped. Throws IoError naming the file when it is not a trace.
TraceContents read_trace(const std::string& path, int world, const std::function<const char*(const std::string&)>& intern);

// ---- summary.json ----

// The fields of summary.json that the app shows of a run (live or opened from its directory) and
// that `--out` uses to describe a run directory it finds.
struct SummaryFields {
  std::string model;                 // model.name ("" in an older summary without it)
  bool interrupted = false;          // stopped by Ctrl-C / SIGTERM at a checkpoint ("interrupted")
  EvalResult eval_mode, train_mode;  // test_eval_mode, test_train_mode
  int64_t steps = 0;
  int64_t steps_per_epoch = 0;       // 0: not written (older runs)
  int64_t train_samples = 0, test_samples = 0;
  double samples_per_s = 0, train_seconds = 0;
  std::string device_name;           // "" on the CPU
  uint64_t staged_bytes = 0;         // host-to-device plus device-to-host bytes of --device staging
  std::vector<std::string> conv_algorithms;  // rank 0's cuDNN algorithm per convolution pass
  std::string cuda_graphs;           // --cuda-graphs: "1 captured, 17 replayed, 2 eager" (steps; "" without)
  int64_t parameters = 0;            // model.parameters (0: not written)
  // memory.per_rank: each rank's peak step and its points (empty: an older summary)
  std::vector<int64_t> memory_peak_step;
  std::vector<std::vector<MemorySample>> memory_peak_points;
};
// The fields of a summary.json document; `where` names it in errors. Throws IoError when a field
// has the wrong type or its format_version is newer than kRunDirFormatVersion.
SummaryFields summary_fields(const nlohmann::json& summary, const std::string& where);
// The same, of the file: IoError naming it also when it cannot be read or is not JSON.
SummaryFields read_summary_fields(const std::string& path);

// Reads a whole JSON file (summary.json, trace.json); IoError naming it when unreadable or not JSON.
nlohmann::json read_json_file(const std::string& path);

}  // namespace lab
