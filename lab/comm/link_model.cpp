// LinkModelWorld: see link_model.h for the model and the waiting rules.
#include "device_memory.h"
#include "link_model.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <deque>
#include <limits>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "config.h"
#include "errors.h"
#include "events.h"
#include "mutation.h"

namespace lab {

namespace {

// Below this much remaining time a wait yields instead of sleeping (sleeps overshoot by ~0.1 ms).
constexpr double kSpinSeconds = 3e-4;
constexpr double kMaxSleepSeconds = 2e-3;

std::string fmt(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g", s);
  return buf;
}

}  // namespace

// One resource a message occupies while its bytes pass (a rank's link out, a rank's link in, a
// NIC, a leaf's uplink): its bandwidth and the intervals for which messages already placed hold it.
// A link or a NIC is held by one message at a time (`busy`); an uplink is shared (`shares`): the
// messages on it at any moment take at most its bandwidth between them.
struct LinkTimetable::Resource {
  double bytes_per_s = 0;                       // 0: unlimited
  bool shared = false;                          // a leaf's uplink
  std::vector<std::pair<double, double>> busy;  // [start, end), disjoint, sorted by start
  struct Share {
    double start, end, rate;  // [start, end) at `rate` bytes per second
  };
  std::vector<Share> shares;  // shared: sorted by start, may overlap

  // The earliest t' >= t at which [t', t' + d) overlaps no busy interval (shared: at which `rate`
  // fits beside the shares throughout [t', t' + d)).
  double first_fit(double t, double d, double rate) const {
    if (d <= 0) return t;
    if (shared) return first_share(t, d, rate);
    for (const auto& [s, e] : busy) {
      if (e <= t) continue;
      if (t + d <= s) return t;
      t = e;
    }
    return t;
  }
  void reserve(double s, double e, double rate) {
    if (e <= s) return;
    if (shared) {
      const Share sh{s, e, rate};
      shares.insert(std::upper_bound(shares.begin(), shares.end(), sh,
                                     [](const Share& a, const Share& b) { return a.start < b.start; }),
                    sh);
      return;
    }
    busy.insert(std::lower_bound(busy.begin(), busy.end(), std::make_pair(s, e)), {s, e});
  }
  // Intervals over by `now` can hold up no message posted from now on.
  void forget_before(double now) {
    busy.erase(busy.begin(),
               std::find_if(busy.begin(), busy.end(), [&](const std::pair<double, double>& iv) { return iv.second > now; }));
    shares.erase(std::remove_if(shares.begin(), shares.end(), [&](const Share& sh) { return sh.end <= now; }),
                 shares.end());
  }

 private:
  // The rate the shares take at time p.
  double taken(double p) const {
    double sum = 0;
    for (const Share& sh : shares) {
      if (sh.start > p) break;
      if (p < sh.end) sum += sh.rate;
    }
    return sum;
  }
  // Whether `rate` fits beside the shares throughout [t, t + d): what they take only grows where
  // one starts, so it is enough to look at t and at every start inside.
  bool fits(double t, double d, double rate) const {
    const double room = bytes_per_s * (1 + 1e-9) - rate;  // within rounding: k x (C / k) fits in C
    if (taken(t) > room) return false;
    for (const Share& sh : shares) {
      if (sh.start >= t + d) break;
      if (sh.start > t && taken(sh.start) > room) return false;
    }
    return true;
  }
  double first_share(double t, double d, double rate) const {
    if (fits(t, d, rate)) return t;
    // room appears only where a share ends; after the last one ends the whole bandwidth is free
    std::vector<double> ends;
    for (const Share& sh : shares)
      if (sh.end > t) ends.push_back(sh.end);
    std::sort(ends.begin(), ends.end());
    for (double e : ends)
      if (fits(e, d, rate)) return e;
    return ends.empty() ? t : ends.back();
  }
};

double LinkModelOptions::seconds(size_t bytes, int src, int dst) const {
  if (!crosses_nodes(src, dst)) return seconds(bytes);
  double rate = bytes_per_s > 0 ? std::min(bytes_per_s, nic_bytes_per_s) : nic_bytes_per_s;
  if (crosses_leaves(src, dst)) rate = std::min(rate, uplink_bytes_per_s());
  return latency(src, dst) + (rate > 0 ? static_cast<double>(bytes) / rate : 0.0);
}

void check_link_model_options(const LinkModelOptions& o, int ranks) {
  if (!(o.latency_s >= 0) || !std::isfinite(o.latency_s)) throw ConfigError("--link-latency-us must be >= 0 (microseconds)");
  if (!(o.bytes_per_s >= 0) || !std::isfinite(o.bytes_per_s))
    throw ConfigError("--link-gbps must be >= 0 (gigabits per second; 0: unlimited)");
  if (o.gpus_per_node < 0)
    throw ConfigError("--link-gpus-per-node must be >= 0 (0: no nodes), got " + std::to_string(o.gpus_per_node));
  if (!o.has_nodes()) return;  // the NIC settings are not read
  const std::string g = std::to_string(o.gpus_per_node);
  if (!(o.nic_bytes_per_s > 0) || !std::isfinite(o.nic_bytes_per_s))
    throw ConfigError("--link-gpus-per-node " + g + " needs --link-nic-gbps > 0: the bandwidth of each node's NIC",
                      "e.g. --link-nic-gbps 100");
  if (!(o.nic_latency_s >= 0) || !std::isfinite(o.nic_latency_s))
    throw ConfigError("--link-nic-latency-us must be >= 0 (microseconds)");
  if (o.nics_per_node < 1 || o.nics_per_node > o.gpus_per_node)
    throw ConfigError("--link-nics-per-node must be between 1 and --link-gpus-per-node " + g + ", got " +
                          std::to_string(o.nics_per_node),
                      "rank i of a node uses its NIC i % K: a NIC beyond the node's ranks would carry nothing");
  if (ranks % o.gpus_per_node != 0)
    throw ConfigError("--link-gpus-per-node " + g + ": the world size " + std::to_string(ranks) +
                          " is not a multiple of it (ranks are placed on nodes of " + g + ", in order)",
                      "choose a --link-gpus-per-node that divides the world size");
  if (o.nodes_per_leaf < 0)
    throw ConfigError("--link-nodes-per-leaf must be >= 0 (0: every node on one switch), got " +
                      std::to_string(o.nodes_per_leaf));
  if (o.nodes_per_leaf == 0) return;  // no leaves: the oversubscription is not read
  // a node count that is not a multiple of nodes_per_leaf is fine: the last leaf holds fewer
  if (!(o.oversubscription >= 1) || !std::isfinite(o.oversubscription))
    throw ConfigError("--link-oversubscription must be >= 1 (1: each leaf's uplink carries all its NICs' bandwidth), got " +
                          fmt(o.oversubscription),
                      "a leaf's uplink carries --link-nodes-per-leaf x --link-nics-per-node x --link-nic-gbps / X");
}

LinkTimetable::LinkTimetable(int ranks, const LinkModelOptions& opt, bool per_pair)
    : m_n(ranks), m_opt(opt), m_per_pair(per_pair) {
  check_link_model_options(opt, ranks);
  const size_t n = static_cast<size_t>(ranks);
  // [0, n): rank r's link out; [n, 2n): rank r's link in; with per_pair, [2n, 2n + n^2): src -> dst;
  // with nodes, then node m's NIC k: out at m_nic_base + 2 (m K + k), in right after it
  m_nic_base = 2 * n + (per_pair ? n * n : 0);
  m_resources.resize(m_nic_base);
  for (Resource& r : m_resources) r.bytes_per_s = opt.bytes_per_s;
  if (opt.has_nodes() && !per_pair) {
    const size_t nics = n / static_cast<size_t>(opt.gpus_per_node) * static_cast<size_t>(opt.nics_per_node);
    m_resources.resize(m_nic_base + 2 * nics);
    for (size_t i = m_nic_base; i < m_resources.size(); ++i) m_resources[i].bytes_per_s = opt.nic_bytes_per_s;
  }
  // with leaves, then leaf l's uplink: out at m_uplink_base + 2 l, in right after it
  m_uplink_base = m_resources.size();
  if (opt.has_leaves() && !per_pair) {
    const size_t nodes = n / static_cast<size_t>(opt.gpus_per_node), per_leaf = static_cast<size_t>(opt.nodes_per_leaf);
    const size_t leaves = (nodes + per_leaf - 1) / per_leaf;
    m_resources.resize(m_uplink_base + 2 * leaves);
    for (size_t i = m_uplink_base; i < m_resources.size(); ++i) {
      m_resources[i].bytes_per_s = opt.uplink_bytes_per_s();
      m_resources[i].shared = true;
    }
  }
  m_pair_leave.assign(n * n, 0.0);
}

LinkTimetable::~LinkTimetable() = default;

std::vector<size_t> LinkTimetable::path(int src, int dst) const {
  const size_t n = static_cast<size_t>(m_n), s = static_cast<size_t>(src), d = static_cast<size_t>(dst);
  if (m_per_pair) return {2 * n + s * n + d};
  if (!m_opt.crosses_nodes(src, dst)) return {s, n + d};  // src's link out, dst's link in
  // ... and between them the NIC out of src's node and the NIC in of dst's node
  const auto nic = [&](int rank) {
    return m_nic_base + 2 * (static_cast<size_t>(m_opt.node(rank)) * static_cast<size_t>(m_opt.nics_per_node) +
                             static_cast<size_t>(m_opt.nic(rank)));
  };
  if (!m_opt.crosses_leaves(src, dst)) return {s, nic(src), nic(dst) + 1, n + d};
  // ... and between those the uplink out of src's leaf and the uplink in of dst's leaf
  const auto uplink = [&](int rank) { return m_uplink_base + 2 * static_cast<size_t>(m_opt.leaf(rank)); };
  return {s, nic(src), uplink(src), uplink(dst) + 1, nic(dst) + 1, n + d};
}

LinkTimetable::Placed LinkTimetable::place(int src, int dst, size_t bytes, double posted) {
  const std::vector<size_t> on = path(src, dst);
  double rate = std::numeric_limits<double>::infinity();  // the slowest resource on the path
  for (size_t r : on) {
    m_resources[r].forget_before(posted);
    if (m_resources[r].bytes_per_s > 0) rate = std::min(rate, m_resources[r].bytes_per_s);
  }
  const double d = std::isinf(rate) ? 0.0 : static_cast<double>(bytes) / rate;
  double& pair_leave = m_pair_leave[static_cast<size_t>(src) * static_cast<size_t>(m_n) + static_cast<size_t>(dst)];
  double start = std::max(posted, pair_leave);
  for (;;) {  // every first_fit only moves later: stop once all resources agree
    double next = start;
    for (size_t r : on) next = m_resources[r].first_fit(next, d, rate);
    if (next == start) break;
    start = next;
  }
  for (size_t r : on) m_resources[r].reserve(start, start + d, rate);
  pair_leave = start + d;
  return {start, start + d, start + d + m_opt.latency(src, dst)};
}

// The timetable and the arrival times of the messages not yet received, shared by the ranks.
struct LinkState {
  LinkState(int n, const LinkModelOptions& opt, bool per_pair)
      : n(n), timetable(n, opt, per_pair), arrivals(static_cast<size_t>(n) * static_cast<size_t>(n)) {}
  const int n;
  std::mutex mu;  // placing a message and matching an arrival
  LinkTimetable timetable;
  std::vector<std::deque<std::pair<uint64_t, double>>> arrivals;  // [src * n + dst]: (tag, arrival), posting order
  // How late the host woke the ranks that waited for a message (LinkModelWorld::wait_stats), in
  // nanoseconds; atomics, not a lock: 16 ranks on 2 cores count a wait each per step.
  std::atomic<uint64_t> waits{0}, late_total_ns{0}, late_max_ns{0};

  void count_wait(double late_s) {
    const auto ns = static_cast<uint64_t>(late_s * 1e9);
    waits.fetch_add(1, std::memory_order_relaxed);
    late_total_ns.fetch_add(ns, std::memory_order_relaxed);
    uint64_t m = late_max_ns.load(std::memory_order_relaxed);
    while (ns > m && !late_max_ns.compare_exchange_weak(m, ns, std::memory_order_relaxed)) {
    }
  }

  std::deque<std::pair<uint64_t, double>>& queue(int src, int dst) {
    return arrivals[static_cast<size_t>(src) * static_cast<size_t>(n) + static_cast<size_t>(dst)];
  }

  // Places a message posted now; returns when its last byte leaves.
  double place(int src, int dst, size_t bytes, uint64_t tag) {
    std::lock_guard<std::mutex> lock(mu);
    // read under the lock: placements come in the order of their posting times
    const LinkTimetable::Placed p = timetable.place(src, dst, bytes, now_seconds());
    queue(src, dst).emplace_back(tag, p.arrival);
    return p.leave;
  }

  // Arrival time of the first message with `tag` from src to dst (the one just received).
  double arrival(int src, int dst, uint64_t tag) {
    std::lock_guard<std::mutex> lock(mu);
    auto& q = queue(src, dst);
    for (auto it = q.begin(); it != q.end(); ++it)
      if (it->first == tag) {
        const double t = it->second;
        q.erase(it);
        return t;
      }
    return 0;  // not placed: a message posted before the decorator existed
  }
};

namespace {

class LinkModelTransport final : public Transport {
 public:
  LinkModelTransport(Transport& inner, LinkState& state, const LinkModelOptions& opt)
      : m_inner(inner), m_state(state), m_opt(opt) {
    m_timeout = inner.timeout();
  }

  int rank() const override { return m_inner.rank(); }
  int world_size() const override { return m_inner.world_size(); }
  const char* name() const override { return m_inner.name(); }

  void send(int dst, const void* buf, size_t bytes, uint64_t tag) override {
    sync_settings();
    check_peer(dst);
    stamp(dst, bytes, tag);
    m_inner.send(dst, buf, bytes, tag);
  }

  void recv(int src, void* buf, size_t bytes, uint64_t tag) override {
    sync_settings();
    check_peer(src);
    m_inner.recv(src, buf, bytes, tag);
    wait_until(arrival(src, tag), "recv", src, bytes, tag);
  }

  // Arrival order is the inner transport's: a message counts as arrived when its bytes were handed
  // over; then it waits out its link's delivery time, as recv does.
  int recv_any(const std::vector<int>& srcs, void* buf, size_t bytes, uint64_t tag) override {
    sync_settings();
    for (int src : srcs) check_peer(src);
    const int src = m_inner.recv_any(srcs, buf, bytes, tag);
    wait_until(arrival(src, tag), "recv_any", src, bytes, tag);
    return src;
  }

  void sendrecv(int dst, const void* sbuf, size_t sbytes, int src, void* rbuf, size_t rbytes,
                uint64_t tag) override {
    sync_settings();
    check_peer(dst);
    check_peer(src);
    const double sent = stamp(dst, sbytes, tag);
    m_inner.sendrecv(dst, sbuf, sbytes, src, rbuf, rbytes, tag);
    wait_until(std::max(sent, arrival(src, tag)), "sendrecv", src, rbytes, tag);
  }

  void sendrecv_reduce(int dst, const float* sbuf, size_t scount, int src, float* acc, size_t rcount,
                       uint64_t tag) override {
    sync_settings();
    check_peer(dst);
    check_peer(src);
    const double sent = stamp(dst, scount * sizeof(float), tag);
    m_inner.sendrecv_reduce(dst, sbuf, scount, src, acc, rcount, tag);
    wait_until(std::max(sent, arrival(src, tag)), "sendrecv_reduce", src, rcount * sizeof(float), tag);
  }

  bool device_aware() const override { return m_inner.device_aware(); }

  void sendrecv_on(DeviceMemory& mem, int dst, const void* sbuf, size_t sbytes, int src, void* rbuf, size_t rbytes,
                   uint64_t tag) override {
    sync_settings();
    check_peer(dst);
    check_peer(src);
    const double sent = stamp(dst, sbytes, tag);
    m_inner.sendrecv_on(mem, dst, sbuf, sbytes, src, rbuf, rbytes, tag);
    wait_until(std::max(sent, arrival(src, tag)), "sendrecv", src, rbytes, tag);
  }

  void sendrecv_reduce_on(DeviceMemory& mem, int dst, const float* sbuf, size_t scount, int src, float* acc,
                          size_t rcount, uint64_t tag) override {
    sync_settings();
    check_peer(dst);
    check_peer(src);
    const double sent = stamp(dst, scount * sizeof(float), tag);
    m_inner.sendrecv_reduce_on(mem, dst, sbuf, scount, src, acc, rcount, tag);
    wait_until(std::max(sent, arrival(src, tag)), "sendrecv_reduce", src, rcount * sizeof(float), tag);
  }

  void abort(const std::string& reason) override { m_inner.abort(reason); }
  bool aborted() const override { return m_inner.aborted(); }
  std::string abort_reason() const override { return m_inner.abort_reason(); }

 private:
  // Transport's timeout and hold flag are plain members set on this object; the wrapped
  // transport must wait under the same rules.
  void sync_settings() {
    m_inner.set_timeout(m_timeout);
    m_inner.set_hold_flag(m_hold);
  }

  // Out-of-range peers are left to the wrapped transport's error; only guard our array.
  void check_peer(int peer) const {
    if (peer < 0 || peer >= m_state.n)
      throw CommError("rank " + std::to_string(rank()) + ": peer rank " + std::to_string(peer) +
                      " is outside the world of " + std::to_string(m_state.n) + " ranks");
  }

  // Places a message on the simulated network; returns when its last byte has left.
  double stamp(int dst, size_t bytes, uint64_t tag) { return m_state.place(rank(), dst, bytes, tag); }

  // Arrival time of the first message with `tag` from src to us (the one just received).
  double arrival(int src, uint64_t tag) { return m_state.arrival(src, rank(), tag); }

  void wait_until(double deadline, const char* call, int peer, size_t bytes, uint64_t tag) {
    double waited = 0;
    double last = now_seconds();
    const bool early = last < deadline;  // the message is still on the link: this rank waits for it
    for (;;) {
      const double now = now_seconds();
      if (now >= deadline) {
        if (early) m_state.count_wait(now - deadline);
        return;
      }
      if (m_inner.aborted())
        throw CommError("rank " + std::to_string(rank()) + ": " + call + " from rank " + std::to_string(peer) +
                            " aborted: " + m_inner.abort_reason(),
                        "the first failing rank's error above is the cause; this rank stopped because of it");
      const bool held = m_hold && m_hold->load(std::memory_order_relaxed);
      if (!held) waited += now - last;
      last = now;
      if (waited > m_timeout) {
        const std::string msg = "rank " + std::to_string(rank()) + ": timed out after " + fmt(m_timeout) +
                                " s on the simulated link from rank " + std::to_string(peer) + " (" + call +
                                ", tag " + std::to_string(tag) + ", " + std::to_string(bytes) +
                                " bytes): the link model delays this message by " + fmt(deadline - now) +
                                " s more";
        m_inner.abort(msg);
        throw CommError(msg, "raise --timeout, or --link-gbps / --link-nic-gbps, or lower --link-latency-us / "
                             "--link-nic-latency-us / --link-oversubscription");
      }
      const double remaining = deadline - now;
      if (remaining > kSpinSeconds)
        std::this_thread::sleep_for(std::chrono::duration<double>(std::min(remaining - kSpinSeconds / 2, kMaxSleepSeconds)));
      else
        std::this_thread::yield();
    }
  }

  Transport& m_inner;
  LinkState& m_state;
  LinkModelOptions m_opt;
};

}  // namespace

LinkModelOptions link_model_options(double latency_us, double gbps, int gpus_per_node, double nic_gbps,
                                    double nic_latency_us, int nics_per_node, int nodes_per_leaf,
                                    double oversubscription) {
  LinkModelOptions o;
  o.latency_s = latency_us * 1e-6;
  o.bytes_per_s = gbps * 1e9 / 8.0;
  o.gpus_per_node = gpus_per_node;
  o.nic_bytes_per_s = nic_gbps * 1e9 / 8.0;
  o.nic_latency_s = nic_latency_us * 1e-6;
  o.nics_per_node = nics_per_node;
  o.nodes_per_leaf = nodes_per_leaf;
  o.oversubscription = oversubscription;
  return o;
}

LinkModelOptions link_model_options(const RunConfig& c) {
  return link_model_options(c.link_latency_us, c.link_gbps, c.link_gpus_per_node, c.link_nic_gbps, c.link_nic_latency_us,
                            c.link_nics_per_node, c.link_nodes_per_leaf, c.link_oversubscription);
}

LinkModelWorld::LinkModelWorld(std::unique_ptr<World> inner, const LinkModelOptions& opt)
    : m_inner(std::move(inner)), m_opt(opt) {
  const int n = m_inner->world_size();
  if (static_cast<int>(m_inner->local_ranks().size()) != n)
    throw ConfigError("--link-latency-us/--link-gbps need every rank in this process (emulated ranks)",
                      "the simulated link shares message arrival times in memory; use --comm threads");
  m_state = std::make_unique<LinkState>(n, opt, mutated("link-per-pair"));  // a lesson's mutation test (mutation.h)
  for (int r = 0; r < n; ++r)
    m_transports.push_back(std::make_unique<LinkModelTransport>(m_inner->transport(r), *m_state, m_opt));
}

LinkModelWorld::~LinkModelWorld() = default;

int LinkModelWorld::world_size() const { return m_inner->world_size(); }
std::vector<int> LinkModelWorld::local_ranks() const { return m_inner->local_ranks(); }

LinkModelWorld::WaitStats LinkModelWorld::wait_stats() const {
  WaitStats s;
  s.waits = m_state->waits.load();
  s.late_total_s = static_cast<double>(m_state->late_total_ns.load()) * 1e-9;
  s.late_max_s = static_cast<double>(m_state->late_max_ns.load()) * 1e-9;
  return s;
}

Transport& LinkModelWorld::transport(int rank) {
  if (rank < 0 || rank >= m_state->n)
    throw ConfigError("Invalid rank " + std::to_string(rank) + ", rank should be in the interval [0, " +
                      std::to_string(m_state->n - 1) + "]");
  return *m_transports[static_cast<size_t>(rank)];
}

}  // namespace lab
