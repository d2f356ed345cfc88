// RunHost: sections
//   0. thread priorities
//   1. driver thread (build, start, poll, finish)
//   2. commands: pause / resume / steps / delay, as RunControl gates
//   3. reading
#include "run_host.h"

#include "run_data.h"

#include <sys/resource.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <sstream>

#include "backends.h"
#include "checkpoint.h"
#include "errors.h"
#include "ring_model.h"

namespace viz {

// ---- 0. priorities ----

namespace {
// The nice value the process started with, read before anything changes it.
int base_nice() {
  static const int kBase = [] {
    errno = 0;
    const int n = getpriority(PRIO_PROCESS, 0);
    return errno ? 0 : n;
  }();
  return kBase;
}
}  // namespace

bool raise_ui_priority() {
  const int base = base_nice();
  // On Linux PRIO_PROCESS with who = 0 sets the calling thread's nice value only.
  return setpriority(PRIO_PROCESS, 0, base - 5) == 0;
}

bool set_thread_nice(int increment) { return setpriority(PRIO_PROCESS, 0, base_nice() + increment) == 0; }

int thread_nice() {
  errno = 0;
  const int n = getpriority(PRIO_PROCESS, 0);
  return errno ? -100 : n;
}

int thread_nice_of(int tid) {
  // /proc/self/task/<tid>/stat: "tid (comm) state ..." with nice as field 19; comm may hold
  // spaces and parentheses, so the fields are counted after the last ')'.
  std::ifstream f("/proc/self/task/" + std::to_string(tid) + "/stat");
  std::string line;
  if (!std::getline(f, line)) return -100;
  const size_t close = line.rfind(')');
  if (close == std::string::npos) return -100;
  std::istringstream in(line.substr(close + 1));
  std::string field;
  for (int i = 3; i <= 19 && (in >> field); ++i)
    if (i == 19) return std::atoi(field.c_str());
  return -100;
}

// ---- 1. driver ----

RunHost::RunHost(const lab::RunConfig& cfg, bool start_paused, int nice) : m_cfg(cfg), m_nice(nice) {
  m_paused = start_paused;
  m_thread = std::thread([this] { drive(); });
}

RunHost::~RunHost() {
  request_stop();
  if (m_thread.joinable()) m_thread.join();
}

void RunHost::request_stop() {
  {
    std::lock_guard<std::mutex> lock(m_mu);
    m_stop = true;
    if (m_run) m_run->control().stop();
  }
  m_cv.notify_all();
}

lab::Run* RunHost::run() const { return m_run.get(); }

void RunHost::drive() {
  // Before any rank thread exists: they and their communication threads inherit it. (From the
  // GUI thread this thread may have inherited nice - 5; this also undoes that.)
  set_thread_nice(m_nice);
  auto fail = [&](const std::string& what, const std::string& hint, int code) {
    std::lock_guard<std::mutex> lock(m_mu);
    m_status.phase = RunPhase::Failed;
    m_status.error = what;
    m_status.hint = hint;
    m_status.error_code = code;
  };
  try {
    // --resume: the iterations before the checkpoint, read from the run directory before the
    // run cuts its files back to the checkpoint, so the plots start where the run started, not
    // where it resumed. (The run then sends again those it still had to write; they are the
    // same records.) A directory that cannot be read only loses the history, with a note.
    std::vector<lab::StepRecord> before;
    std::string history_note;
    if (!m_cfg.resume.empty()) {
      try {
        const int64_t from = lab::find_checkpoint(m_cfg.resume).step;
        const RunData prior = load_run_dir(m_cfg.resume);
        for (const auto& step : prior.by_step)
          for (const lab::StepRecord& r : step)
            if (r.rank >= 0 && r.step < from) before.push_back(r);
      } catch (const lab::Error& e) {
        history_note = std::string("the plots start at the checkpoint: ") + e.what();
      }
    }
    // Loading Fashion-MNIST and building the replicas takes a moment: here, not on the GUI thread.
    auto built = std::make_unique<lab::Run>(m_cfg, lab::make_world);
    built->set_step_sink([this](const std::vector<lab::StepRecord>& recs) {
      std::lock_guard<std::mutex> lock(m_mu);
      m_new_steps.insert(m_new_steps.end(), recs.begin(), recs.end());
    });
    std::lock_guard<std::mutex> lock(m_mu);
    if (!history_note.empty()) m_status.notes.push_back(history_note);
    m_new_steps.insert(m_new_steps.begin(), before.begin(), before.end());
    for (const std::string& n : built->notes()) m_status.notes.push_back(n);
    if (built->resumed_from() >= 0)
      m_status.notes.push_back("resumed " + built->config().out_dir + " at iteration " +
                               std::to_string(built->resumed_from()) + " (its checkpoint)");
    if (m_paused) built->control().pause();
    built->control().set_delay(m_delay.load());
    const lab::Dataset& test = built->test_set();
    if (test.raw.size() >= 784) m_probe.assign(test.raw.begin(), test.raw.begin() + 784);
    m_status.train_size = built->train_set().size;
    m_status.test_size = test.size;
    m_status.phase = m_paused ? RunPhase::Paused : RunPhase::Running;
    m_run = std::move(built);
    if (m_stop) m_run->control().stop();
    m_run->start();
  } catch (const lab::Error& e) {
    fail(e.what(), e.hint(), e.exit_code());
  } catch (const std::exception& e) {
    fail(std::string("internal error: ") + e.what(), "", lab::kExitFailure);
  }
  if (!m_run) {
    m_done = true;
    return;
  }
  lab::Run& run = *m_run;
  bool finished = false;
  while (!m_stop.load()) {
    if (run.poll()) {
      finished = true;
      break;
    }
    std::unique_lock<std::mutex> lock(m_mu);
    m_cv.wait_for(lock, std::chrono::milliseconds(30), [&] { return m_stop.load(); });
  }
  if (!finished) {
    // Reset or closed: stop the ranks and let go of the run here, so the GUI never waits for a
    // rank to finish its forward pass.
    std::unique_ptr<lab::Run> gone;
    {
      std::lock_guard<std::mutex> lock(m_mu);
      m_run->control().stop();
      gone = std::move(m_run);
      m_status.phase = RunPhase::Stopped;
      m_status.finished_at = lab::now_seconds();
    }
    gone.reset();
    m_done = true;
    return;
  }
  {
    std::lock_guard<std::mutex> lock(m_mu);
    m_status.phase = RunPhase::Finishing;
  }
  try {
    run.finish();
    const lab::SummaryFields fields = run.summary_fields();
    std::lock_guard<std::mutex> lock(m_mu);
    static_cast<lab::SummaryFields&>(m_status.summary) = fields;
    m_status.summary.valid = true;
    m_status.phase = RunPhase::Finished;
  } catch (const lab::Error& e) {
    fail(e.what(), e.hint(), e.exit_code());
  } catch (const std::exception& e) {
    fail(std::string("internal error: ") + e.what(), "", lab::kExitFailure);
  }
  {
    std::lock_guard<std::mutex> lock(m_mu);
    m_status.finished_at = lab::now_seconds();
  }
  m_done = true;
}

// ---- 2. commands ----
// Every step command replaces the previous run_until predicate: a new click takes over from a
// step still in flight. Targets add up: a second "iteration" click while the first is still
// running goes one further (m_last_target).

namespace {

int64_t max_of(const std::vector<int64_t>& v) {
  int64_t m = -1;
  for (int64_t x : v) m = std::max(m, x);
  return m;
}

}  // namespace

void RunHost::pause() {
  std::lock_guard<std::mutex> lock(m_mu);
  m_paused = true;
  m_last_target = -1;
  if (m_run) m_run->control().pause();
}

void RunHost::resume() {
  std::lock_guard<std::mutex> lock(m_mu);
  m_paused = false;
  m_last_target = -1;
  if (m_run) m_run->control().resume();
}

void RunHost::set_delay(double seconds) {
  std::lock_guard<std::mutex> lock(m_mu);
  m_delay = seconds;
  if (m_run) m_run->control().set_delay(seconds);
}

void RunHost::step_ring() {
  if (m_cfg.world_size == 1) return step_iteration();  // no collective has a step with one rank
  std::lock_guard<std::mutex> lock(m_mu);
  if (!m_run) return;
  lab::RunControl& ctl = m_run->control();
  if (!m_paused) ctl.pause();
  m_paused = true;
  ctl.run_until(nullptr);
  ctl.step_ring(1);
}

void RunHost::run_to_step(int64_t target) {
  std::lock_guard<std::mutex> lock(m_mu);
  if (!m_run) return;
  lab::RunControl& ctl = m_run->control();
  if (!m_paused) ctl.pause();
  m_paused = true;
  m_last_target = target;
  ctl.run_until([target](int, int64_t iteration, const lab::Event* next) {
    return next == nullptr && iteration >= target;
  });
}

void RunHost::step_iteration() {
  int64_t from = 0;
  {
    std::lock_guard<std::mutex> lock(m_mu);
    if (!m_run) return;
    from = std::max({max_of(m_run->control().iterations()), int64_t{0}, m_last_target});
  }
  run_to_step(from + 1);
}

void RunHost::step_epoch() {
  int64_t from = 0, spe = 1;
  {
    std::lock_guard<std::mutex> lock(m_mu);
    if (!m_run) return;
    from = std::max({max_of(m_run->control().iterations()), int64_t{0}, m_last_target});
    spe = std::max<int64_t>(1, m_run->steps_per_epoch());
  }
  run_to_step((from / spe + 1) * spe);
}

void RunHost::step_allreduce() {
  if (m_cfg.world_size == 1) return step_iteration();
  std::lock_guard<std::mutex> lock(m_mu);
  if (!m_run) return;
  lab::RunControl& ctl = m_run->control();
  if (!m_paused) ctl.pause();
  m_paused = true;
  m_last_target = -1;
  // Per rank: the op_seq of the allreduce it is in or reaches first; it stops at the first gate
  // after that allreduce (another collective's step, or the next iteration).
  struct Seen {
    bool seen = false;
    uint64_t seq = 0;
  };
  auto seen = std::make_shared<std::vector<Seen>>(static_cast<size_t>(m_cfg.world_size));
  ctl.run_until([seen](int rank, int64_t, const lab::Event* next) {
    Seen& s = (*seen)[static_cast<size_t>(rank)];
    if (!next || std::strcmp(next->op, "allreduce") != 0) return s.seen;
    if (!s.seen) {
      s.seen = true;
      s.seq = next->op_seq;
      return false;
    }
    return next->op_seq != s.seq;
  });
}

void RunHost::run_into_allreduce(int64_t iteration, int ring_steps) {
  std::lock_guard<std::mutex> lock(m_mu);
  if (!m_run) return;
  lab::RunControl& ctl = m_run->control();
  if (!m_paused) ctl.pause();
  m_paused = true;
  m_last_target = -1;
  const int n = m_cfg.world_size;
  struct Seen {
    bool seen = false;
    uint64_t seq = 0;
  };
  auto seen = std::make_shared<std::vector<Seen>>(static_cast<size_t>(n));
  // the allreduces that synchronize training (local SGD's averages too), numbered as the view does
  const CollectiveFilter sync = training_sync_filter(m_cfg);
  const std::string algorithm = m_cfg.allreduce;
  ctl.run_until([=](int rank, int64_t it, const lab::Event* next) {
    Seen& s = (*seen)[static_cast<size_t>(rank)];
    if (!next) return it > iteration || s.seen;
    if (next->train_step != iteration) return s.seen;
    if (!sync.matches(*next)) return s.seen;
    if (!s.seen) {
      s.seen = true;
      s.seq = next->op_seq;
    }
    if (next->op_seq != s.seq) return true;
    return collective_global_step(next->op, algorithm, n, *next) >= ring_steps;
  });
}

// ---- 3. reading ----

HostStatus RunHost::status() const {
  std::lock_guard<std::mutex> lock(m_mu);
  HostStatus s = m_status;
  if ((s.phase == RunPhase::Running || s.phase == RunPhase::Paused) && m_run)
    s.phase = m_paused ? RunPhase::Paused : RunPhase::Running;
  return s;
}

std::shared_ptr<const lab::Snapshot> RunHost::snapshot() const {
  std::lock_guard<std::mutex> lock(m_mu);
  return m_run ? m_run->snapshot() : nullptr;
}

void RunHost::take_steps(std::vector<lab::StepRecord>& out) {
  std::lock_guard<std::mutex> lock(m_mu);
  if (m_new_steps.empty()) return;
  if (out.empty()) {
    out.swap(m_new_steps);
  } else {
    out.insert(out.end(), std::make_move_iterator(m_new_steps.begin()), std::make_move_iterator(m_new_steps.end()));
    m_new_steps.clear();
  }
}

size_t RunHost::copy_events(int rank, size_t from, std::vector<lab::Event>& out) const {
  std::lock_guard<std::mutex> lock(m_mu);  // the driver may let go of a stopped run
  if (!m_run || rank < 0 || rank >= m_cfg.world_size) return from;
  return m_run->events(rank).copy_since(from, out);
}

std::vector<int64_t> RunHost::iterations() const {
  std::lock_guard<std::mutex> lock(m_mu);
  if (!m_run) return {};
  return m_run->control().iterations();
}

std::vector<uint8_t> RunHost::probe_pixels() const {
  std::lock_guard<std::mutex> lock(m_mu);
  return m_probe;
}

}  // namespace viz
