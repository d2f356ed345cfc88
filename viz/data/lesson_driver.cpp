#include "lesson_driver.h"

#include <algorithm>
#include <filesystem>

#include "catalog.h"
#include "command_line.h"
#include "errors.h"
#include "events.h"
#include "lesson_runs.h"
#include "ring_model.h"

namespace viz {

using lessons::Observe;
using lessons::RunOutcome;
using lessons::RunSpec;

const char* lesson_stage_name(LessonStage s) {
  switch (s) {
    case LessonStage::Question: return "question";
    case LessonStage::Running: return "running";
    case LessonStage::Observing: return "observing";
    case LessonStage::Results: return "results";
    case LessonStage::Finished: return "finished";
  }
  return "?";
}

bool staged_in_allreduce(const RunData& d, int64_t iteration, int ring_steps, bool* passed_without) {
  if (passed_without) *passed_without = false;
  auto staged = [&] {
    uint64_t seq = 0;
    if (!latest_collective(d.events, training_sync_filter(d.cfg), false, seq)) return false;
    const CollectiveTrace t = collect_trace(d.events, seq, d.cfg.allreduce);
    if (t.train_step != iteration) return false;
    // every sender of each of the first ring_steps steps has recorded its transfer
    std::vector<int> senders;
    for (const PhaseSteps& p : collective_phases(t.op, d.cfg.allreduce, d.world(), t.bytes))
      senders.insert(senders.end(), static_cast<size_t>(p.steps), p.senders);
    for (int k = 0; k < ring_steps && k < static_cast<int>(senders.size()); ++k) {
      std::vector<int> srcs;
      for (const Transfer& x : t.transfers)
        if (x.global_step == k && std::find(srcs.begin(), srcs.end(), x.src) == srcs.end()) srcs.push_back(x.src);
      if (static_cast<int>(srcs.size()) < senders[static_cast<size_t>(k)]) return false;
    }
    return true;
  };
  if (staged()) return true;
  // an iteration without a gradient allreduce (local SGD between averages) stages nothing
  if (d.steps_done() > iteration) {
    if (passed_without) *passed_without = true;
    return true;
  }
  return false;
}

namespace {

bool terminal(RunPhase p) { return p == RunPhase::Finished || p == RunPhase::Failed || p == RunPhase::Stopped; }
bool started(RunPhase p) { return p == RunPhase::Running || p == RunPhase::Paused || terminal(p); }

}  // namespace

LessonDriver::LessonDriver(lessons::Lesson lesson, std::string session_dir, std::string prepared_dir, std::string record_path)
    : m_session(std::move(lesson), prepared_dir.empty() ? session_dir : prepared_dir),
      m_prepared(std::move(prepared_dir)),
      m_record_path(std::move(record_path)) {}

LessonDriver::~LessonDriver() {
  if (m_worker.joinable()) m_worker.join();
}

bool LessonDriver::can_run() const { return m_stage == LessonStage::Question && m_session.answered(part()); }

bool LessonDriver::run() {
  if (!can_run()) return false;
  m_stage = LessonStage::Running;
  m_shown.clear();
  m_activity = "starting";
  return true;
}

size_t LessonDriver::runs_done() const {
  size_t n = 0;
  for (const RunSpec& r : part().runs) n += m_session.outcome(r.name) ? 1 : 0;
  return n;
}

const RunSpec* LessonDriver::next_run() const {
  for (const RunSpec& r : part().runs)
    if (!m_session.outcome(r.name)) return &r;
  return nullptr;
}

// The first observation of this part that shows `run` and has not been shown yet.
const Observe* LessonDriver::observe_for(const std::string& run) const {
  for (const Observe& o : part().observe) {
    if (std::find(m_shown.begin(), m_shown.end(), &o) != m_shown.end()) continue;
    if (!o.runs.empty() && o.runs[0] == run) return &o;
  }
  return nullptr;
}

std::string LessonDriver::observing_text() const {
  if (!m_observing) return "";
  return const_cast<lessons::Session&>(m_session).render_now(part(), m_observing->say);
}

void LessonDriver::start_next(LabHooks& lab) {
  const RunSpec* r = next_run();
  if (!r) {
    finish_part(lab);
    return;
  }
  const size_t index = runs_done() + 1, count = part().runs.size();
  const std::vector<std::string> args = m_session.concrete_args(*r);
  const std::string dir = m_session.run_dir(r->name);
  const std::string line = commands::command_line(r->command, args);
  m_activity = "run " + r->name + " (" + std::to_string(index) + " of " + std::to_string(count) + "): " + line;

  if (prepared()) {
    try {
      RunOutcome o = lessons::read_outcome(dir);
      if (o.args != args || o.command != r->command)
        throw lab::ConfigError("the prepared run '" + r->name + "' was made for another version of the lesson",
                               "prepare it again: dtlab lesson prepare " + lesson().id);
      o.prepared = true;
      m_session.set_outcome(std::move(o));
    } catch (const lab::Error& e) {
      m_error = std::string(e.what()) + (e.hint().empty() ? "" : " (" + e.hint() + ")");
      m_stage = LessonStage::Finished;
      return;
    }
    if (const Observe* o = observe_for(r->name)) {
      std::string twin_dir;
      if (o->runs.size() == 2) twin_dir = m_session.run_dir(o->runs[1]);
      // the twin's outcome is read when its turn comes; its directory is already there
      const std::string err = lab.open_dirs(dir, twin_dir);
      if (!err.empty()) m_error = err;
      lab.show(*o);
      m_shown.push_back(o);
      m_observing = o;
      m_stage = LessonStage::Observing;
    }
    return;
  }

  if (r->command != "run" || r->parsed.run.comm == "mpi") {
    // bench and eval, and ranks as processes (mpirun): on the driver's thread; the views keep
    // what they show (an observation of such a run opens its directory when the part ends)
    m_worker_done = false;
    m_worker_outcome.reset();
    m_worker_error.clear();
    const RunSpec spec = *r;
    m_worker = std::thread([this, spec, args, dir] {
      try {
        m_worker_outcome = lessons::execute_run(spec, args, dir);
      } catch (const std::exception& e) {
        m_worker_error = e.what();
      }
      m_worker_done = true;
    });
    return;
  }

  // a training run, live in the views; with its twin when an observation shows the two together
  const Observe* obs = observe_for(r->name);
  const RunSpec* twin = nullptr;
  if (obs && obs->runs.size() == 2) {
    const RunSpec* t = lesson().find_run(obs->runs[1]);
    bool ready = t && t->command == "run" && !m_session.outcome(t->name);
    if (ready)
      for (const std::string& dep : t->after) ready = ready && m_session.outcome(dep) != nullptr;  // not r: it has not run
    if (ready) twin = t;
  }
  try {
    m_live = {r};
    m_live_args = {args};
    lab::RunConfig cfg = commands::parse_command(r->command, args).run;
    lab::RunConfig tcfg;
    if (twin) {
      m_live.push_back(twin);
      m_live_args.push_back(m_session.concrete_args(*twin));
      tcfg = commands::parse_command(twin->command, m_live_args[1]).run;
      m_activity += "  |  twin: " + twin->name;
    }
    for (size_t i = 0; i < m_live.size(); ++i) {
      std::error_code ec;
      std::filesystem::remove_all(m_session.run_dir(m_live[i]->name), ec);  // a run directory holds one run
    }
    const bool stage_it = obs && obs->step >= 0;
    lab.start_live(cfg, twin ? &tcfg : nullptr, stage_it);
    m_live_t0 = lab::now_seconds();
    m_live_observe = obs;
    m_staged = false;
    m_observed = !stage_it;
    if (obs) {
      lab.show(*obs);
      m_shown.push_back(obs);
    }
  } catch (const lab::Error& e) {
    // the lesson was checked when it loaded: a run that cannot start is an outcome like any failure
    m_live.clear();
    RunOutcome o = lessons::outcome_of(*r, args, dir, e.exit_code(), e.what(), e.hint(), 0);
    try {
      lessons::write_outcome(o);
    } catch (const std::exception&) {
    }
    m_session.set_outcome(std::move(o));
  }
}

void LessonDriver::update(LabHooks& lab) {
  if (m_stage != LessonStage::Running) return;
  if (m_worker.joinable()) {
    if (!m_worker_done) return;
    m_worker.join();
    if (m_worker_outcome) {
      m_session.set_outcome(std::move(*m_worker_outcome));
    } else {
      m_error = m_worker_error;
      m_stage = LessonStage::Finished;
      return;
    }
    start_next(lab);
    return;
  }
  if (!m_live.empty()) {
    const RunData* d0 = lab.live(0);
    const RunData* d1 = m_live.size() > 1 ? lab.live(1) : nullptr;
    if (!d0 || (m_live.size() > 1 && !d1)) return;
    if (m_live_observe && !m_observed) {
      const bool ended = terminal(d0->phase) || (d1 && terminal(d1->phase));
      if (!m_staged && started(d0->phase) && (!d1 || started(d1->phase)) && !ended) {
        // ring_step: partway into iteration `step`'s gradient allreduce; else when iteration `step` is done
        lab.stage(m_live_observe->ring_step >= 0 ? m_live_observe->step : m_live_observe->step + 1, m_live_observe->ring_step);
        m_staged = true;
        return;
      }
      auto reached = [&](const RunData& d) {
        if (terminal(d.phase)) return true;
        if (m_live_observe->ring_step >= 0) return staged_in_allreduce(d, m_live_observe->step, m_live_observe->ring_step);
        return d.steps_done() > m_live_observe->step && d.phase == RunPhase::Paused;
      };
      if (m_staged && reached(*d0) && (!d1 || reached(*d1))) {
        m_observed = true;
        if (!ended) {
          m_observing = m_live_observe;
          m_stage = LessonStage::Observing;
          return;
        }
      }
      if (!ended) return;
      m_observed = true;
    }
    if (!terminal(d0->phase) || (d1 && !terminal(d1->phase))) return;
    const double secs = lab::now_seconds() - m_live_t0;
    for (size_t i = 0; i < m_live.size(); ++i) {
      const RunData& d = *(i == 0 ? d0 : d1);
      const RunSpec& r = *m_live[i];
      int code = 0;
      std::string error, hint;
      if (d.phase == RunPhase::Failed) {
        code = d.error_code ? d.error_code : lab::kExitFailure;
        error = d.error;
        hint = d.error_hint;
      } else if (d.phase == RunPhase::Stopped) {
        code = lab::kExitInterrupted;
        error = "stopped";
      }
      RunOutcome o = lessons::outcome_of(r, m_live_args[i], m_session.run_dir(r.name), code, error, hint, secs);
      try {
        lessons::write_outcome(o);
      } catch (const std::exception& e) {
        m_error = e.what();
      }
      m_session.set_outcome(std::move(o));
    }
    m_live.clear();
    m_live_args.clear();
    m_live_observe = nullptr;
  }
  start_next(lab);
}

void LessonDriver::continue_after_observe(LabHooks& lab) {
  if (m_stage != LessonStage::Observing) return;
  m_observing = nullptr;
  m_stage = LessonStage::Running;
  if (!m_live.empty()) lab.resume();
}

void LessonDriver::finish_part(LabHooks& lab) {
  // observations whose runs ran earlier (or in the main part) are shown from their directories
  for (const Observe& o : part().observe) {
    if (std::find(m_shown.begin(), m_shown.end(), &o) != m_shown.end()) continue;
    const std::string err = lab.open_dirs(m_session.run_dir(o.runs[0]), o.runs.size() > 1 ? m_session.run_dir(o.runs[1]) : "");
    if (!err.empty()) m_error = err;
    lab.show(o);
    m_shown.push_back(&o);
    m_observing = &o;
    m_stage = LessonStage::Observing;
    return;
  }
  m_session.evaluate(part());
  write_record();
  m_activity.clear();
  // the contrast stays in view: the first observation's runs, finished, from their directories
  if (!part().observe.empty()) {
    const Observe& o = part().observe.front();
    const std::string err = lab.open_dirs(m_session.run_dir(o.runs[0]), o.runs.size() > 1 ? m_session.run_dir(o.runs[1]) : "");
    if (err.empty()) lab.show(o);
  }
  m_stage = LessonStage::Results;
}

void LessonDriver::write_record() {
  if (m_record_path.empty()) return;
  try {
    std::filesystem::create_directories(std::filesystem::path(m_record_path).parent_path());
    commands::write_result_json(m_record_path, m_session.record("app", lessons::learner_name()));
  } catch (const std::exception& e) {
    m_error = std::string("cannot write the record: ") + e.what();
  }
}

void LessonDriver::next_part() {
  if (m_stage != LessonStage::Results || !has_next_part()) return;
  ++m_part;
  m_stage = LessonStage::Question;
  m_shown.clear();
  m_activity.clear();
}

}  // namespace viz
