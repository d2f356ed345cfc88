// Ranks in other processes (--comm mpi): each sends rank 0 its epoch counters at the end of every
// epoch, and at the end of the run its step records, events and final state; rank 0's process
// files them as if the rank had run here. Run-internal messages between processes go straight
// over the transport (tags in run_internal.h).
#include <cmath>

#include "run.h"
#include "run_internal.h"
#include "run_wire.h"

namespace lab {

namespace {

// Processes whose steady clocks differ by more than this are on different hosts: their events
// are aligned by the run's start instead.
constexpr double kMaxClockShiftSeconds = 3600;

}  // namespace

// The epoch's train counters summed over all ranks, on rank 0 (zeros elsewhere). Local ranks'
// counters are read under their locks; a rank of another process sends its own to rank 0.
// Called by every rank between the epoch's "eval sums" allreduce and the epoch barrier.
Run::EpochCounters Run::epoch_counters(int rank, Transport& transport) {
  auto read = [this](int r) {
    RankState& o = *m_ranks[static_cast<size_t>(r)];
    std::lock_guard<std::mutex> lock(o.mu);
    return EpochCounters{o.steps, o.samples, o.correct};
  };
  EpochCounters sum;
  if (rank != 0) {
    if (!is_local(0)) {
      const EpochCounters mine = read(rank);
      const int64_t v[3] = {mine.steps, mine.samples, mine.correct};
      transport.send(0, v, sizeof v, kTagEpochCounters);
    }
    return sum;
  }
  for (int r = 0; r < m_cfg.world_size; ++r) {
    EpochCounters c;
    if (is_local(r)) {
      c = read(r);
    } else {
      int64_t v[3];
      transport.recv(r, v, sizeof v, kTagEpochCounters);
      c = EpochCounters{v[0], v[1], v[2]};
    }
    sum.steps += c.steps;
    sum.samples += c.samples;
    sum.correct += c.correct;
  }
  return sum;
}

const char* Run::intern(const std::string& name) {
  std::lock_guard<std::mutex> lock(m_names_mu);
  return m_names.insert(name).first->c_str();
}

// End of a successful run: each rank of another process sends rank 0 its step records, events
// and final model state (size first, then the RankReport); rank 0 receives them in rank order
// and files them as if the rank had run here: pending records (written by poll/finish in
// (step, rank) order), events (times shifted onto this process's clock) and a replica.
void Run::gather_to_rank0(int rank, Transport& transport, Model& model) {
  if (rank != 0) {
    if (is_local(0)) return;
    RankReport rep;
    rep.clock_origin = clock_origin_seconds();
    rep.t0 = m_t0;
    {
      RankState& rs = *m_ranks[static_cast<size_t>(rank)];
      std::lock_guard<std::mutex> lock(rs.mu);
      rep.records.assign(rs.pending.begin(), rs.pending.end());
      rep.trained_samples = rs.trained_samples;
    }
    m_logs[static_cast<size_t>(rank)]->copy_since(0, rep.events);
    rep.tensors = model_tensors(model);
    const std::vector<char> bytes = encode_rank_report(rep);
    const uint64_t n = bytes.size();
    transport.send(0, &n, sizeof n, kTagReportSize);
    transport.send(0, bytes.data(), bytes.size(), kTagReport);
    return;
  }
  const double origin = clock_origin_seconds();
  for (int r = 1; r < m_cfg.world_size; ++r) {
    if (is_local(r)) continue;
    uint64_t n = 0;
    transport.recv(r, &n, sizeof n, kTagReportSize);
    std::vector<char> bytes(n);
    transport.recv(r, bytes.data(), n, kTagReport);
    RankReport rep = decode_rank_report(bytes, r, [this](const std::string& s) { return intern(s); });
    double shift = rep.clock_origin - origin;
    if (std::abs(shift) > kMaxClockShiftSeconds) shift = m_t0 - rep.t0;
    EventLog& log = *m_logs[static_cast<size_t>(r)];
    for (Event& e : rep.events) {
      e.t_start += shift;
      e.t_end += shift;
      log.record(e);
    }
    auto replica = build_model(model_options(m_cfg), m_cfg.seed);
    load_model_tensors(*replica, rep.tensors, "the final state of rank " + std::to_string(r));
    m_replicas[static_cast<size_t>(r)] = std::move(replica);
    RankState& o = *m_ranks[static_cast<size_t>(r)];
    std::lock_guard<std::mutex> lock(o.mu);  // poll sees all of a rank's records or none
    if (!rep.records.empty()) o.latest = std::make_shared<const StepRecord>(rep.records.back());
    o.trained_samples = rep.trained_samples;
    for (StepRecord& rec : rep.records) {
      o.note_memory(rec);
      o.pending.push_back(std::move(rec));
    }
  }
}

}  // namespace lab
