// RunData: everything the panels show about one run, whether it is training now (filled from a
// RunHost, incrementally) or finished (loaded from its run directory). Owned and changed by the
// GUI thread only, between frames; panels read it as const.
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "config.h"
#include "mode.h"
#include "events.h"
#include "run.h"
#include "run_format.h"

namespace viz {

class RunHost;

// Where a run is in its life, as the app sees it (a superset of lab::RunState).
enum class RunPhase { Empty, Loading, Running, Paused, Finishing, Finished, Failed, Stopped, Opened };
const char* run_phase_name(RunPhase p);

// summary.json's fields the views show (lab/run/run_format.h): of a finished live run, or of a run
// opened from its directory.
struct RunSummaryView : lab::SummaryFields {
  bool valid = false;  // the run finished (or the directory holds a summary)
};

class RunData {
 public:
  // Keep every step's scalars; keep BatchNorm arrays within a memory budget (older steps are
  // thinned as the run grows): at most kMaxBnSteps steps, fewer when the world is large.
  static constexpr size_t kMaxBnSteps = 3000;
  static constexpr size_t kBnBudgetBytes = size_t{64} << 20;
  // Keep at most this many events per rank (the oldest half is dropped when exceeded): about
  // 5 MB per rank, a few thousand iterations of the mlp.
  static constexpr size_t kMaxEvents = 60000;
  // Keep the memory points (memory.h) of the newest steps only (summary.json has each rank's peak).
  static constexpr int64_t kMemorySteps = 256;

  std::string source;             // "live" or the run directory
  bool live = false;
  lab::RunConfig cfg;
  RunPhase phase = RunPhase::Empty;
  std::string error, error_hint;  // a failed run's root cause
  int error_code = 0;
  int64_t train_size = 0, test_size = 0;  // samples in use (0: unknown)
  int64_t steps_total = 0, steps_per_epoch = 0;
  double samples_per_s = 0;
  double gate_delay_s = 0;                // slow motion of the live run (0: full speed)
  std::vector<uint8_t> probe_pixels;      // (28, 28) test sample 0, for the train/eval view
  RunSummaryView summary;

  // History: by_step[s][r] is rank r's record of iteration s (rank == -1 where missing). A
  // BatchNorm record's local_mean/local_var are empty where they equal batch_mean/batch_var.
  std::vector<std::vector<lab::StepRecord>> by_step;
  std::vector<lab::EpochRecord> epochs;
  std::vector<lab::EvalPoint> evals;
  // Events per rank, in recording order; events_dropped[r] older ones were let go.
  std::vector<std::vector<lab::Event>> events;
  std::vector<size_t> events_dropped;
  uint64_t events_version = 0;    // grows whenever any events were added
  // Which run this is, for the views' caches: every RunData made has a new one (reset_live too).
  uint64_t identity = next_identity();
  static uint64_t next_identity();

  int world() const { return cfg.world_size; }
  // What the views call a member of the world: DataParallel has devices in one process, the
  // other modes have ranks.
  std::string member(int r) const { return std::string(caps_member().second) + " " + std::to_string(r); }
  // The run's mode's capabilities (lab/modes/mode.h), DDP's for a mode this build does not know.
  lab::ModeCaps caps() const { return caps_member().first; }
  std::pair<lab::ModeCaps, const char*> caps_member() const {
    const lab::ParallelMode* m = lab::find_mode(cfg.mode);
    if (!m) m = lab::find_mode("ddp");
    return {m->caps(), m->member()};
  }
  int64_t steps_done() const { return static_cast<int64_t>(by_step.size()); }
  // A run opened from its run directory is a recording: nothing can pause, step or speed it up.
  // Its views only move through what the directory holds.
  bool opened() const { return !live && phase == RunPhase::Opened; }
  // What an opened run is, in a line the controls show instead of the run buttons: "finished run,
  // opened from DIR: 64 iterations, 2 epochs of 32 iterations" (summary.json present), or "unfinished run
  // (no summary.json: it failed or was stopped), opened from DIR: 10 iterations". "" for others.
  std::string opened_description() const;
  // The state in a few words for headers: run_phase_name, or "finished run, from its run directory".
  std::string state_text() const;
  // The newest complete step (every rank recorded), -1 if none.
  int64_t last_complete_step() const;
  const lab::StepRecord* record(int64_t step, int rank) const;
  // The newest step at or before `step` whose BatchNorm statistics were recorded (--record-bn
  // keeps some steps only), -1 if none.
  int64_t bn_step_at_or_before(int64_t step) const;

  // Appends records in (step, rank) order (metrics.jsonl order).
  void add_steps(const std::vector<lab::StepRecord>& recs);
  void add_events(int rank, std::vector<lab::Event>& evs);
  // Keeps pointers to strings that events loaded from files point into (op, what).
  const char* intern(const std::string& s);

  // Pulls what is new from a live run: snapshot, steps, events, status. Cheap when nothing moved.
  void update_from(RunHost& host);
  void reset_live(const lab::RunConfig& c);

 private:
  void thin_bn();
  size_t bn_step_cap() const;
  size_t m_bn_steps = 0;
  size_t m_bn_record_bytes = 0;  // BatchNorm bytes of one rank's record
  std::vector<size_t> m_event_pos;        // per rank: events copied from the host so far
  std::deque<std::string> m_strings;
  std::vector<lab::Event> m_scratch;
};

// What a view says when it has none of `what` ("collectives", "pushes", "events") to show: a live
// run has none yet ("No collectives recorded yet. " + live_hint); a run opened from its directory
// holds none, and will never have any (it stopped before them, or has no trace.json), or only none
// of the kind the view was asked for.
std::string nothing_recorded(const RunData& d, const std::string& what, const std::string& live_hint);

// Loads a run directory (config.toml, metrics.jsonl, trace.json, summary.json). Throws
// lab::IoError / lab::ConfigError naming the file. Missing trace or summary is fine (a failed or
// interrupted run); a missing config.toml or metrics.jsonl is not.
RunData load_run_dir(const std::string& dir);

}  // namespace viz
