#include "comm_stats.h"

#include <algorithm>
#include <utility>

namespace lab {

TrafficStats traffic_stats(const std::vector<std::vector<Event>>& events_per_rank) {
  const size_t n = events_per_rank.size();
  TrafficStats t;
  t.sent.assign(n, 0);
  t.received.assign(n, 0);
  for (const auto& events : events_per_rank)
    for (const Event& e : events) {
      if (e.kind != EventKind::Chunk || e.train_step < 0) continue;
      t.bytes_moved += e.bytes;
      if (e.src >= 0 && static_cast<size_t>(e.src) < n) t.sent[static_cast<size_t>(e.src)] += e.bytes;
      if (e.dst >= 0 && static_cast<size_t>(e.dst) < n) t.received[static_cast<size_t>(e.dst)] += e.bytes;
      const std::string what = e.what ? e.what : "";
      auto part = std::find_if(t.by_what.begin(), t.by_what.end(),
                               [&](const TrafficStats::Part& p) { return p.what == what; });
      if (part == t.by_what.end()) {
        t.by_what.push_back({what, 0, std::vector<uint64_t>(n, 0), std::vector<uint64_t>(n, 0)});
        part = t.by_what.end() - 1;
      }
      part->bytes_moved += e.bytes;
      if (e.src >= 0 && static_cast<size_t>(e.src) < n) part->sent[static_cast<size_t>(e.src)] += e.bytes;
      if (e.dst >= 0 && static_cast<size_t>(e.dst) < n) part->received[static_cast<size_t>(e.dst)] += e.bytes;
    }
  if (t.bytes_moved > 0 && n > 0)
    t.rank0_share = static_cast<double>(t.sent[0] + t.received[0]) / static_cast<double>(t.bytes_moved);
  return t;
}

ComputeStats compute_stats(const std::vector<std::vector<Event>>& events_per_rank) {
  const size_t n = events_per_rank.size();
  ComputeStats c;
  c.forward.assign(n, 0);
  c.backward.assign(n, 0);
  c.optimizer.assign(n, 0);
  for (size_t r = 0; r < n; ++r)
    for (const Event& e : events_per_rank[r]) {
      if (e.kind != EventKind::Compute || e.train_step < 0) continue;
      const double s = e.t_end - e.t_start;
      if (e.phase == Phase::Forward) c.forward[r] += s;
      else if (e.phase == Phase::Backward) c.backward[r] += s;
      else if (e.phase == Phase::OptimizerStep) c.optimizer[r] += s;
    }
  return c;
}

std::vector<BucketInfo> grad_buckets(const std::vector<std::vector<Event>>& events_per_rank) {
  std::vector<BucketInfo> out;
  if (events_per_rank.empty()) return out;
  int64_t last = -1;
  for (const Event& e : events_per_rank[0])
    if (e.kind == EventKind::Collective && e.train_step >= 0 && std::string(e.what) == "grad bucket") last = std::max(last, e.train_step);
  for (const Event& e : events_per_rank[0])
    if (e.kind == EventKind::Collective && e.train_step == last && std::string(e.what) == "grad bucket")
      out.push_back({e.tag, e.bytes});
  std::sort(out.begin(), out.end(), [](const BucketInfo& a, const BucketInfo& b) { return a.index < b.index; });
  return out;
}

OverlapStats overlap_stats(const std::vector<std::vector<Event>>& events_per_rank) {
  OverlapStats o;
  for (const auto& events : events_per_rank) {
    // The rank's backward intervals, sorted (they do not overlap each other).
    std::vector<std::pair<double, double>> backward;
    for (const Event& e : events)
      if (e.kind == EventKind::Compute && e.phase == Phase::Backward && e.train_step >= 0)
        backward.emplace_back(e.t_start, e.t_end);
    std::sort(backward.begin(), backward.end());
    double comm = 0, hidden = 0;
    for (const Event& e : events) {
      if (e.kind != EventKind::Collective || e.train_step < 0) continue;
      comm += e.t_end - e.t_start;
      auto it = std::lower_bound(backward.begin(), backward.end(), std::make_pair(e.t_start, e.t_start));
      if (it != backward.begin()) --it;  // the backward that started before this collective
      for (; it != backward.end() && it->first < e.t_end; ++it)
        hidden += std::max(0.0, std::min(e.t_end, it->second) - std::max(e.t_start, it->first));
    }
    o.comm_seconds.push_back(comm);
    o.hidden_seconds.push_back(hidden);
    o.comm_seconds_total += comm;
    o.hidden_seconds_total += hidden;
  }
  if (o.comm_seconds_total > 0) o.hidden_fraction = o.hidden_seconds_total / o.comm_seconds_total;
  return o;
}

}  // namespace lab
