#include "run_data.h"

#include <atomic>
#include <algorithm>

#include "run_host.h"

namespace viz {

const char* run_phase_name(RunPhase p) {
  switch (p) {
    case RunPhase::Empty: return "no run";
    case RunPhase::Loading: return "loading data";
    case RunPhase::Running: return "running";
    case RunPhase::Paused: return "paused";
    case RunPhase::Finishing: return "final evaluation";
    case RunPhase::Finished: return "finished";
    case RunPhase::Failed: return "failed";
    case RunPhase::Stopped: return "stopped";
    case RunPhase::Opened: return "run directory";
  }
  return "?";
}

std::string RunData::opened_description() const {
  if (!opened()) return "";
  const int64_t n = steps_done();
  std::string s = summary.valid ? "finished run" : "unfinished run (no summary.json: it failed or was stopped)";
  s += ", opened from " + source + ": " + std::to_string(n) + (n == 1 ? " iteration" : " iterations");
  // epochs: those the run finished (an epoch record each), and the iterations each had
  if (!epochs.empty() || steps_per_epoch > 0) {
    const size_t e = epochs.size();
    s += ", " + std::to_string(e) + (e == 1 ? " epoch" : " epochs");
    if (steps_per_epoch > 0) s += " of " + std::to_string(steps_per_epoch) + " iterations";
  }
  return s;
}

std::string RunData::state_text() const {
  if (!opened()) return run_phase_name(phase);
  return std::string(summary.valid ? "finished" : "unfinished") + " run, from its run directory";
}

std::string nothing_recorded(const RunData& d, const std::string& what, const std::string& live_hint) {
  if (!d.opened()) return "No " + what + " recorded yet." + (live_hint.empty() ? "" : " " + live_hint);
  bool traced = false;
  for (const auto& log : d.events) traced = traced || !log.empty();
  if (traced) return "This run directory's trace holds none of the " + what + " chosen here.";
  return "This run directory holds no " + what + ": the run stopped before any, or its trace.json is missing.";
}

int64_t RunData::last_complete_step() const {
  for (int64_t s = steps_done() - 1; s >= 0; --s) {
    bool all = true;
    for (const lab::StepRecord& r : by_step[static_cast<size_t>(s)]) all = all && r.rank >= 0;
    if (all) return s;
  }
  return -1;
}

int64_t RunData::bn_step_at_or_before(int64_t step) const {
  if (cfg.record_bn == "off") return -1;
  for (int64_t s = std::min(step, steps_done() - 1); s >= 0; --s) {
    const lab::StepRecord* r = record(s, 0);
    if (r && !r->bn.empty()) return s;
  }
  return -1;
}

const lab::StepRecord* RunData::record(int64_t step, int rank) const {
  if (step < 0 || step >= steps_done() || rank < 0) return nullptr;
  const auto& row = by_step[static_cast<size_t>(step)];
  if (rank >= static_cast<int>(row.size()) || row[static_cast<size_t>(rank)].rank < 0) return nullptr;
  return &row[static_cast<size_t>(rank)];
}

void RunData::add_steps(const std::vector<lab::StepRecord>& recs) {
  const int w = std::max(1, world());
  for (const lab::StepRecord& r : recs) {
    if (r.step < 0 || r.rank < 0 || r.rank >= w) continue;
    while (steps_done() <= r.step) {
      by_step.emplace_back(static_cast<size_t>(w));
      for (lab::StepRecord& empty : by_step.back()) empty.rank = -1;
    }
    lab::StepRecord& slot = by_step[static_cast<size_t>(r.step)][static_cast<size_t>(r.rank)];
    if (slot.rank < 0 && !r.bn.empty() && r.rank == 0) ++m_bn_steps;
    slot = r;
    if (!r.memory.empty() && r.step >= kMemorySteps)
      by_step[static_cast<size_t>(r.step - kMemorySteps)][static_cast<size_t>(r.rank)].memory.clear();
    // local BN: the rank's own statistics are the ones used; keep one copy
    for (lab::BnLayerRecord& b : slot.bn)
      if (b.local_mean == b.batch_mean && b.local_var == b.batch_var) {
        b.local_mean.clear();
        b.local_var.clear();
      }
    if (m_bn_record_bytes == 0)
      for (const lab::BnLayerRecord& b : slot.bn)
        m_bn_record_bytes += 4 * (b.batch_mean.size() + b.batch_var.size() + b.local_mean.size() +
                                  b.local_var.size() + b.running_mean.size() + b.running_var.size());
  }
  if (m_bn_steps > bn_step_cap()) thin_bn();
}

size_t RunData::bn_step_cap() const {
  const size_t per_step = m_bn_record_bytes * static_cast<size_t>(std::max(1, world()));
  if (per_step == 0) return kMaxBnSteps;
  return std::max<size_t>(64, std::min(kMaxBnSteps, kBnBudgetBytes / per_step));
}

// Keeps the BatchNorm arrays of the newest kMaxBnSteps/2 steps and of every stride-th older step,
// stride a power of two: long runs keep their shape in the charts at a bounded memory cost (a few
// KB per rank and step).
void RunData::thin_bn() {
  const size_t cap = bn_step_cap();
  const size_t recent = cap / 2;
  const size_t older = by_step.size() > recent ? by_step.size() - recent : 0;
  size_t stride = 1;
  while (older / stride > cap / 4) stride *= 2;
  size_t kept = 0;
  for (size_t s = 0; s < by_step.size(); ++s) {
    bool has = !by_step[s].empty() && !by_step[s][0].bn.empty();
    if (has && s < older && s % stride != 0) {
      for (lab::StepRecord& r : by_step[s]) {
        r.bn.clear();
        r.bn.shrink_to_fit();
      }
      has = false;
    }
    kept += has;
  }
  m_bn_steps = kept;
}

void RunData::add_events(int rank, std::vector<lab::Event>& evs) {
  if (evs.empty()) return;
  if (static_cast<int>(events.size()) <= rank) {
    events.resize(static_cast<size_t>(rank + 1));
    events_dropped.resize(events.size(), 0);
  }
  auto& log = events[static_cast<size_t>(rank)];
  log.insert(log.end(), evs.begin(), evs.end());
  if (log.size() > kMaxEvents) {
    const size_t drop = log.size() / 2;
    log.erase(log.begin(), log.begin() + static_cast<std::ptrdiff_t>(drop));
    events_dropped[static_cast<size_t>(rank)] += drop;
  }
  ++events_version;
}

const char* RunData::intern(const std::string& s) {
  for (const std::string& have : m_strings)
    if (have == s) return have.c_str();
  m_strings.push_back(s);
  return m_strings.back().c_str();
}

uint64_t RunData::next_identity() {
  static std::atomic<uint64_t> next{1};
  return next++;
}

void RunData::reset_live(const lab::RunConfig& c) {
  *this = RunData();
  source = "live";
  live = true;
  cfg = c;
  phase = RunPhase::Loading;
  events.resize(static_cast<size_t>(c.world_size));
  events_dropped.assign(static_cast<size_t>(c.world_size), 0);
  m_event_pos.assign(static_cast<size_t>(c.world_size), 0);
}

void RunData::update_from(RunHost& host) {
  const HostStatus st = host.status();
  phase = st.phase;
  error = st.error;
  error_hint = st.hint;
  error_code = st.error_code;
  if (st.train_size) train_size = st.train_size;
  if (st.test_size) test_size = st.test_size;
  if (st.summary.valid) summary = st.summary;
  if (probe_pixels.empty()) probe_pixels = host.probe_pixels();

  if (auto snap = host.snapshot()) {
    steps_total = snap->steps_total;
    steps_per_epoch = snap->steps_per_epoch;
    samples_per_s = summary.valid ? summary.samples_per_s : snap->samples_per_s;
    if (snap->epochs.size() != epochs.size()) epochs = snap->epochs;
    if (snap->evals.size() != evals.size()) evals = snap->evals;
  }
  std::vector<lab::StepRecord> recs;
  host.take_steps(recs);
  if (!recs.empty()) add_steps(recs);

  m_event_pos.resize(static_cast<size_t>(world()), 0);
  for (int r = 0; r < world(); ++r) {
    m_scratch.clear();
    const size_t total = host.copy_events(r, m_event_pos[static_cast<size_t>(r)], m_scratch);
    if (total > m_event_pos[static_cast<size_t>(r)]) m_event_pos[static_cast<size_t>(r)] = total;
    add_events(r, m_scratch);
  }
}

}  // namespace viz
