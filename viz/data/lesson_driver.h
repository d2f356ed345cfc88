// LessonDriver: a lesson taken in the lab window, as plain C++ (testable without a display). It
// holds the learner's Session and walks it through each part (the lesson, then its variations):
//
//   Question   the predictions are edited and committed; Run stays disabled until every
//              prediction of the part is committed, and then they are locked
//   Running    the part's runs, one after the other: training runs live in the lab's views
//              (through LabHooks, which the app implements with its run hosts; two runs an
//              [[observe]] names together train side by side as twins), bench and eval commands
//              on a thread of the driver; a prepared lesson opens its run directories instead
//   Observing  paused at the moment an [[observe]] names (an iteration, or a ring step of its
//              gradient allreduce), with the view, layer and channel chosen and a sentence saying
//              what to look at, until the learner continues
//   Results    what was measured against the predictions, every check, the explanation with
//              live numbers, the hints; the record is written; the next part can start
//
// The driver never blocks the GUI thread: update() looks at the hosts' status and moves on.
#pragma once

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "run_data.h"
#include "run_host.h"
#include "session.h"

namespace viz {

// What the driver asks of the lab (the app's run hosts and views).
class LabHooks {
 public:
  virtual ~LabHooks() = default;
  // Replaces the live run (and twin) with new runs of these configurations; paused: waiting before
  // their first iteration.
  virtual void start_live(const lab::RunConfig& cfg, const lab::RunConfig* twin, bool paused) = 0;
  // The live run's (0) or twin's (1) data as the views see it; nullptr when there is none.
  virtual const RunData* live(int which) const = 0;
  // Both live runs: run to the start of `iteration` (ring_step < 0; the driver asks for the one
  // after the iteration to observe) or ring_step steps into its gradient allreduce, then wait.
  virtual void stage(int64_t iteration, int ring_step) = 0;
  virtual void resume() = 0;
  // Shows finished runs from their directories (twin: the second, side by side). Returns "" or
  // the problem.
  virtual std::string open_dirs(const std::string& dir, const std::string& twin_dir) = 0;
  // Brings the observation's view to the front with its layer and channel (and, for finished
  // runs, its iteration).
  virtual void show(const lessons::Observe& o) = 0;
};

enum class LessonStage { Question, Running, Observing, Results, Finished };
const char* lesson_stage_name(LessonStage s);

class LessonDriver {
 public:
  // session_dir: where this learner's runs go; prepared_dir: replay those runs instead ("": train);
  // record_path: where the record is written after each part ("": not written).
  LessonDriver(lessons::Lesson lesson, std::string session_dir, std::string prepared_dir, std::string record_path);
  ~LessonDriver();
  LessonDriver(const LessonDriver&) = delete;
  LessonDriver& operator=(const LessonDriver&) = delete;

  const lessons::Lesson& lesson() const { return m_session.lesson(); }
  lessons::Session& session() { return m_session; }
  const lessons::Session& session() const { return m_session; }
  LessonStage stage() const { return m_stage; }
  size_t part_index() const { return m_part; }
  const lessons::Part& part() const { return *lesson().parts()[m_part]; }
  bool prepared() const { return !m_prepared.empty(); }
  const std::string& record_path() const { return m_record_path; }

  // ---- Question ----
  // Every prediction of the current part is committed (then Run is enabled).
  bool can_run() const;
  // Starts the part's runs (stage Running). False (and nothing happens) unless can_run().
  bool run();

  // ---- Running / Observing ----
  // Moves the lesson on; call once per frame. Never blocks.
  void update(LabHooks& lab);
  // The observation being shown (Observing), or nullptr.
  const lessons::Observe* observing() const { return m_observing; }
  // Its text with the live numbers where they are already known ("" until then).
  std::string observing_text() const;
  void continue_after_observe(LabHooks& lab);
  // What is happening, for the panel: "run sync (2 of 3): dtlab run ...".
  const std::string& activity() const { return m_activity; }
  size_t runs_done() const;

  // ---- Results ----
  const lessons::PartResult* result() const { return m_session.result(part()); }
  bool has_next_part() const { return m_part + 1 < lesson().parts().size(); }
  void next_part();
  // An error that stopped the lesson (a prepared run missing, a run directory not writable).
  const std::string& error() const { return m_error; }

 private:
  void start_next(LabHooks& lab);
  void finish_part(LabHooks& lab);
  void write_record();
  const lessons::RunSpec* next_run() const;
  const lessons::Observe* observe_for(const std::string& run) const;

  lessons::Session m_session;
  std::string m_prepared, m_record_path;
  LessonStage m_stage = LessonStage::Question;
  size_t m_part = 0;
  std::string m_activity, m_error;

  // live runs in flight
  std::vector<const lessons::RunSpec*> m_live;  // 1 or 2 (twin)
  std::vector<std::vector<std::string>> m_live_args;
  double m_live_t0 = 0;
  const lessons::Observe* m_live_observe = nullptr;
  bool m_staged = false, m_observed = false;
  std::vector<const lessons::Observe*> m_shown;  // observations already shown in this part
  const lessons::Observe* m_observing = nullptr;

  // a bench or eval command on the driver's thread
  std::thread m_worker;
  std::atomic<bool> m_worker_done{false};
  std::optional<lessons::RunOutcome> m_worker_outcome;
  std::string m_worker_error;
};

// Whether a live run waits `ring_steps` steps into the gradient allreduce of `iteration` (every
// sender of each of those steps has recorded its transfer), or has passed that iteration without
// one (local SGD between averagings): the moment `--ring-steps` screenshots and lessons stage.
bool staged_in_allreduce(const RunData& d, int64_t iteration, int ring_steps, bool* passed_without = nullptr);

}  // namespace viz
