// The simulated network's nodes (lab/comm/link_model.h: Nodes): ranks on nodes of G, each node's
// NICs shared by its ranks, the paths within and between nodes, contention at a NIC, the flags
// --link-gpus-per-node, --link-nic-gbps, --link-nic-latency-us, --link-nics-per-node, and what is
// refused. Then the leaves (link_model.h: Leaves, suites LinkNodesLeaves*): nodes on leaf switches
// whose uplinks are shared, --link-nodes-per-leaf and --link-oversubscription. LinkTimetable reads
// no clock: its times are checked exactly.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>

#include "backends.h"
#include "command_line.h"
#include "communicator.h"
#include "config.h"
#include "config_effects.h"
#include "errors.h"
#include "link_model.h"
#include "ring_allreduce.h"
#include "run.h"
#include "test_util.h"
#include "threads/transport_threads.h"
#include "topology.h"

namespace {

bool has(const std::string& s, const std::string& what) { return s.find(what) != std::string::npos; }

// 2 nodes x 2 GPUs: links of 1e9 B/s within a node (a 1e6-byte message: 1 ms), NICs of 0.5e9 B/s
// (2 ms), latency 5 us, 20 us more between nodes.
constexpr double kLatency = 5e-6;
constexpr double kNicLatency = 20e-6;
lab::LinkModelOptions two_by_two(int nics_per_node = 1) {
  lab::LinkModelOptions o;
  o.latency_s = kLatency;
  o.bytes_per_s = 1e9;
  o.gpus_per_node = 2;
  o.nic_bytes_per_s = 0.5e9;
  o.nic_latency_s = kNicLatency;
  o.nics_per_node = nics_per_node;
  return o;
}

// What the ConfigError says (message | hint), or "" when none is thrown.
template <typename F>
std::string config_error(F&& f) {
  try {
    f();
  } catch (const lab::ConfigError& e) {
    return std::string(e.what()) + " | " + e.hint();
  }
  return "";
}

}  // namespace

// ---- the timetable ----

TEST(LinkNodesTimetable, WithinANodeTheLinksBetweenNodesAlsoTheNics) {
  lab::LinkTimetable net(4, two_by_two());
  const auto same = net.place(0, 1, 1000000, 0.0);  // node 0 -> node 0: the ranks' links, 1 ms
  EXPECT_EQ(same.start, 0.0);
  EXPECT_EQ(same.leave, 1e-3);
  EXPECT_EQ(same.arrival, 1e-3 + kLatency);
  const auto cross = net.place(2, 0, 1000000, 0.0);  // node 1 -> node 0: at the NIC's rate, 2 ms
  EXPECT_EQ(cross.start, 0.0);
  EXPECT_EQ(cross.leave, 2e-3) << "rank 0's link in is free: 0 -> 1 used rank 1's";
  EXPECT_EQ(cross.arrival, 2e-3 + (kLatency + kNicLatency));
  const auto back = net.place(0, 2, 1000000, 0.0);  // rank 0's link out is busy until 1 ms
  EXPECT_EQ(back.start, 1e-3);
  EXPECT_EQ(back.leave, 1e-3 + 2e-3);
  // the idle path's time, as the options state it
  const lab::LinkModelOptions o = two_by_two();
  EXPECT_EQ(o.seconds(1000000, 0, 1), kLatency + 1e-3);
  EXPECT_EQ(o.seconds(1000000, 0, 1), o.seconds(1000000));
  EXPECT_EQ(o.seconds(1000000, 1, 3), (kLatency + kNicLatency) + 2e-3);
  EXPECT_EQ(o.node(3), 1);
  EXPECT_EQ(o.local_rank(3), 1);
  EXPECT_TRUE(o.crosses_nodes(1, 2));
  EXPECT_FALSE(o.crosses_nodes(2, 3));
}

// Two ranks of node 0 sending off the node at once share its one NIC: the second waits for the
// first; with two NICs (rank i on NIC i % 2) they pass side by side.
TEST(LinkNodesTimetable, TwoRanksOfANodeShareItsNic) {
  {
    lab::LinkTimetable net(4, two_by_two());
    const auto a = net.place(0, 2, 1000000, 0.0);
    const auto b = net.place(1, 3, 1000000, 0.0);
    EXPECT_EQ(a.leave, 2e-3);
    EXPECT_EQ(b.start, 2e-3);
    EXPECT_EQ(b.leave, 4e-3) << "twice as long as one: the NIC out of node 0 (and the NIC in of node 1)";
    EXPECT_EQ(b.arrival, 4e-3 + (kLatency + kNicLatency));
  }
  {
    lab::LinkTimetable net(4, two_by_two(2));
    EXPECT_EQ(net.place(0, 2, 1000000, 0.0).leave, 2e-3);
    EXPECT_EQ(net.place(1, 3, 1000000, 0.0).leave, 2e-3) << "rank 1 uses NIC 1 out of node 0, rank 3 NIC 1 into node 1";
  }
  {  // rail-like means the NIC by local rank: rank 0 -> 3 and 1 -> 2 cross from NIC 0 to NIC 1 and from 1 to 0
    lab::LinkTimetable net(4, two_by_two(2));
    EXPECT_EQ(net.place(0, 3, 1000000, 0.0).leave, 2e-3);
    EXPECT_EQ(net.place(1, 2, 1000000, 0.0).leave, 2e-3);
    EXPECT_EQ(net.place(2, 1, 1000000, 0.0).leave, 2e-3);  // the way back: other directions of the NICs
    EXPECT_EQ(net.place(3, 0, 1000000, 0.0).leave, 2e-3);
    EXPECT_EQ(net.place(2, 0, 1000000, 0.0).start, 2e-3) << "rank 2's link out is still sending to rank 1";
  }
}

// What comes into a node through one NIC comes in one message after another, whatever rank it is
// for; a message within the node passes while the NICs are busy.
TEST(LinkNodesTimetable, MessagesIntoANodeQueueAtItsNicButNotWithinIt) {
  lab::LinkModelOptions o = two_by_two();
  {
    lab::LinkTimetable net(6, o);  // 3 nodes of 2
    EXPECT_EQ(net.place(0, 4, 1000000, 0.0).leave, 2e-3);
    EXPECT_EQ(net.place(2, 5, 1000000, 0.0).leave, 4e-3) << "both enter node 2 through its NIC 0";
    // within node 2 no NIC: 4 -> 5 fits on rank 5's link in before the message from rank 2, while
    // node 2's NIC in is busy
    EXPECT_EQ(net.place(4, 5, 1000000, 0.0).leave, 1e-3);
  }
  o.nics_per_node = 2;
  {
    lab::LinkTimetable net(6, o);
    EXPECT_EQ(net.place(0, 4, 1000000, 0.0).leave, 2e-3);
    EXPECT_EQ(net.place(2, 5, 1000000, 0.0).leave, 2e-3) << "rank 5 is on NIC 1 of node 2";
  }
}

// The message occupies its whole path at the slowest resource's rate: a NIC faster than the
// ranks' links changes nothing but the latency; unlimited links leave the NIC's rate alone.
TEST(LinkNodesTimetable, TheSlowestResourceSetsTheRate) {
  lab::LinkModelOptions fast_nic = two_by_two();
  fast_nic.nic_bytes_per_s = 4e9;
  lab::LinkTimetable net(4, fast_nic);
  EXPECT_EQ(net.place(0, 2, 1000000, 0.0).leave, 1e-3);
  lab::LinkModelOptions unlimited = two_by_two();
  unlimited.bytes_per_s = 0;
  lab::LinkTimetable u(4, unlimited);
  EXPECT_EQ(u.place(0, 1, 1000000, 0.0).leave, 0.0);
  EXPECT_EQ(u.place(0, 2, 1000000, 0.0).leave, 2e-3);
  EXPECT_EQ(u.place(1, 3, 1000000, 1e-3).start, 2e-3);
  // an empty message occupies nothing and takes its path's latency
  EXPECT_EQ(u.place(1, 2, 0, 5e-3).arrival, 5e-3 + (kLatency + kNicLatency));
  EXPECT_EQ(u.place(1, 0, 0, 5e-3).arrival, 5e-3 + kLatency);
}

// The mutation link-per-pair has no NICs: only the latency between nodes applies.
TEST(LinkNodesTimetable, PerPairLinksKeepOnlyTheLatencyBetweenNodes) {
  lab::LinkTimetable net(4, two_by_two(), /*per_pair=*/true);
  EXPECT_EQ(net.place(0, 2, 1000000, 0.0).leave, 1e-3);
  const auto b = net.place(1, 3, 1000000, 0.0);
  EXPECT_EQ(b.leave, 1e-3);
  EXPECT_EQ(b.arrival, 1e-3 + (kLatency + kNicLatency));
}

namespace {

// The timetable as it was before nodes (one switch: rank r's link out and link in, the code of
// link_model.cpp before this change), to hold the new one to it bit for bit.
class SwitchBeforeNodes {
 public:
  SwitchBeforeNodes(int n, double latency_s, double bytes_per_s)
      : m_n(static_cast<size_t>(n)), m_latency(latency_s), m_rate(bytes_per_s), m_busy(2 * m_n), m_pair(m_n * m_n) {}
  lab::LinkTimetable::Placed place(int src, int dst, size_t bytes, double posted) {
    const size_t on[2] = {static_cast<size_t>(src), m_n + static_cast<size_t>(dst)};
    for (size_t r : on) {
      auto& b = m_busy[r];
      b.erase(b.begin(), std::find_if(b.begin(), b.end(), [&](const std::pair<double, double>& iv) { return iv.second > posted; }));
    }
    const double d = m_rate > 0 ? static_cast<double>(bytes) / m_rate : 0.0;
    double& pair_leave = m_pair[static_cast<size_t>(src) * m_n + static_cast<size_t>(dst)];
    double start = std::max(posted, pair_leave);
    for (;;) {
      double next = start;
      for (size_t r : on) next = first_fit(m_busy[r], next, d);
      if (next == start) break;
      start = next;
    }
    for (size_t r : on)
      if (d > 0) m_busy[r].insert(std::lower_bound(m_busy[r].begin(), m_busy[r].end(), std::make_pair(start, start + d)),
                                  {start, start + d});
    pair_leave = start + d;
    return {start, start + d, start + d + m_latency};
  }

 private:
  static double first_fit(const std::vector<std::pair<double, double>>& busy, double t, double d) {
    if (d <= 0) return t;
    for (const auto& [s, e] : busy) {
      if (e <= t) continue;
      if (t + d <= s) return t;
      t = e;
    }
    return t;
  }
  size_t m_n;
  double m_latency, m_rate;
  std::vector<std::vector<std::pair<double, double>>> m_busy;
  std::vector<double> m_pair;
};

}  // namespace

// --link-gpus-per-node 0 (the default) is the single switch: the same timetable bit for bit,
// whatever the NIC fields hold (they are not read).
TEST(LinkNodesTimetable, NoNodesIsTheSwitchBitForBit) {
  std::mt19937 rng(12345);
  const int n = 6;
  lab::LinkModelOptions plain;
  plain.latency_s = 7.5e-6;
  plain.bytes_per_s = 1.25e9;
  lab::LinkModelOptions ignored = plain;  // gpus_per_node stays 0
  ignored.nic_bytes_per_s = 3e8;
  ignored.nic_latency_s = 1e-3;
  ignored.nics_per_node = 3;
  lab::LinkTimetable a(n, plain), b(n, ignored);
  SwitchBeforeNodes before(n, plain.latency_s, plain.bytes_per_s);
  std::uniform_int_distribution<int> rank(0, n - 1);
  std::uniform_int_distribution<size_t> size(0, 4000000);
  std::uniform_real_distribution<double> gap(0.0, 2e-3);
  double t = 0;
  for (int i = 0; i < 2000; ++i) {
    if (i % 3 == 0) t += gap(rng);  // several messages posted at the same time, then a gap
    const int src = rank(rng);
    int dst = rank(rng);
    if (dst == src) dst = (dst + 1) % n;
    const size_t bytes = i % 17 == 0 ? 0 : size(rng);
    const auto pa = a.place(src, dst, bytes, t);
    const auto pb = b.place(src, dst, bytes, t);
    const auto po = before.place(src, dst, bytes, t);
    ASSERT_EQ(pa.start, po.start) << "message " << i;
    ASSERT_EQ(pa.leave, po.leave) << "message " << i;
    ASSERT_EQ(pa.arrival, po.arrival) << "message " << i;
    ASSERT_EQ(pb.start, po.start) << "message " << i;
    ASSERT_EQ(pb.leave, po.leave) << "message " << i;
    ASSERT_EQ(pb.arrival, po.arrival) << "message " << i;
  }
}

// ---- what the model refuses ----

TEST(LinkNodesOptions, AWorldSizeNotAMultipleOfTheNodesIsRefused) {
  lab::LinkModelOptions o = two_by_two();
  o.gpus_per_node = 4;
  const std::string e = config_error([&] { lab::LinkTimetable net(6, o); });
  EXPECT_TRUE(has(e, "--link-gpus-per-node 4")) << e;
  EXPECT_TRUE(has(e, "6")) << e;
  EXPECT_TRUE(has(e, "not a multiple")) << e;
  EXPECT_EQ(config_error([&] { lab::LinkTimetable net(8, o); }), "");
  // the world checks it too, before any message
  const std::string w = config_error([&] { lab::LinkModelWorld world(std::make_unique<lab::ThreadsWorld>(6), o); });
  EXPECT_TRUE(has(w, "--link-gpus-per-node 4")) << w;
}

TEST(LinkNodesOptions, NodesWithoutANicBandwidthAreRefused) {
  lab::LinkModelOptions o = two_by_two();
  o.nic_bytes_per_s = 0;
  const std::string e = config_error([&] { lab::LinkTimetable net(4, o); });
  EXPECT_TRUE(has(e, "--link-nic-gbps")) << e;
  o = two_by_two(3);  // 3 NICs for 2 ranks a node
  EXPECT_TRUE(has(config_error([&] { lab::LinkTimetable net(4, o); }), "--link-nics-per-node")) << "a NIC nobody uses";
  o = two_by_two(0);
  EXPECT_TRUE(has(config_error([&] { lab::LinkTimetable net(4, o); }), "--link-nics-per-node"));
  o = two_by_two();
  o.gpus_per_node = -1;
  EXPECT_TRUE(has(config_error([&] { lab::LinkTimetable net(4, o); }), "--link-gpus-per-node"));
  o = two_by_two();
  o.nic_latency_s = -1e-6;
  EXPECT_TRUE(has(config_error([&] { lab::LinkTimetable net(4, o); }), "--link-nic-latency-us"));
  // the flags' units
  const lab::LinkModelOptions f = lab::link_model_options(5, 80, 2, 40, 20, 2);
  EXPECT_EQ(f.bytes_per_s, 1e10);
  EXPECT_EQ(f.nic_bytes_per_s, 5e9);
  EXPECT_EQ(f.nic_latency_s, 20 * 1e-6);
  EXPECT_EQ(f.gpus_per_node, 2);
  EXPECT_EQ(f.nics_per_node, 2);
}

// ---- a ring allreduce over the emulated network ----

namespace {

// The plain ring allreduce (ring_allreduce.h: 2 (n - 1) sendrecv steps of one chunk each, rank r
// to r + 1) replayed on a LinkTimetable from time 0: rank r posts its step-s message when its step
// s - 1 ended, and its step ends when its own message has left and rank r - 1's message of step s
// has arrived (sendrecv). Messages are placed in the order of their posting times, as the world's
// lock places them. Returns when each rank's last step ends.
std::vector<double> ring_on_timetable(int n, size_t chunk_bytes, const lab::LinkModelOptions& opt) {
  lab::LinkTimetable net(n, opt);
  const size_t steps = 2 * static_cast<size_t>(n - 1);
  std::vector<std::vector<lab::LinkTimetable::Placed>> placed(static_cast<size_t>(n));
  std::vector<size_t> ended(static_cast<size_t>(n), 0);
  std::vector<double> post(static_cast<size_t>(n), 0.0);  // when rank r posts (or posted) its next message
  for (;;) {
    // the rank whose message is ready (its previous step ended) with the earliest posting time: no
    // rank that is not ready can post earlier (its wait ends after a message posted later)
    int who = -1;
    for (int r = 0; r < n; ++r) {
      const size_t k = static_cast<size_t>(r);
      if (placed[k].size() < steps && ended[k] == placed[k].size() && (who < 0 || post[k] < post[static_cast<size_t>(who)]))
        who = r;
    }
    if (who < 0) break;
    const size_t w = static_cast<size_t>(who);
    placed[w].push_back(net.place(who, (who + 1) % n, chunk_bytes, post[w]));
    for (bool more = true; more;) {
      more = false;
      for (int r = 0; r < n; ++r) {
        const size_t k = static_cast<size_t>(r), p = static_cast<size_t>((r + n - 1) % n), s = ended[k];
        if (s < placed[k].size() && s < placed[p].size()) {
          post[k] = std::max(placed[k][s].leave, placed[p][s].arrival);
          ++ended[k];
          more = true;
        }
      }
    }
  }
  return post;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

#if defined(__SANITIZE_THREAD__)
constexpr bool kUpperBoundsHold = false;
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
constexpr bool kUpperBoundsHold = false;
#else
constexpr bool kUpperBoundsHold = true;
#endif
#else
constexpr bool kUpperBoundsHold = true;
#endif

}  // namespace

// On 2 nodes x 2 the ring 0 -> 1 -> 2 -> 3 -> 0 crosses between nodes at 1 -> 2 and 3 -> 0, each
// through NICs nobody else uses; the NIC is the slowest resource, so every step takes one NIC
// message time: ranks 1 and 3 (whose messages cross) end after 2 (n - 1) of them, ranks 0 and 2
// (who receive them) a latency between nodes later.
TEST(LinkNodesRing, TheTimetableOfARingOnTwoNodes) {
  const lab::LinkModelOptions opt = lab::link_model_options(100, 8, 2, 0.8, 500);  // 1e9 B/s; NIC 1e8 B/s
  const size_t chunk = 250000;                                                      // NIC: 2.5 ms, link: 0.25 ms
  const std::vector<double> t = ring_on_timetable(4, chunk, opt);
  const double nic_steps = 6 * (chunk / opt.nic_bytes_per_s);
  EXPECT_NEAR(t[1], nic_steps, 1e-12);
  EXPECT_NEAR(t[3], nic_steps, 1e-12);
  EXPECT_NEAR(t[0], nic_steps + opt.latency_s + opt.nic_latency_s, 1e-12);
  EXPECT_NEAR(t[2], nic_steps + opt.latency_s + opt.nic_latency_s, 1e-12);
  // the same ring on the single switch: one link message time per step (6 x 0.35 ms)
  const std::vector<double> s = ring_on_timetable(4, chunk, lab::link_model_options(100, 8));
  for (double x : s) EXPECT_NEAR(x, 6 * (chunk / 1e9 + 100e-6), 1e-12);
}

// The same ring through LinkModelWorld, as 4 emulated ranks on 2 nodes of 2: every rank's sum is
// right, and no rank finishes before the timetable says (scheduling only adds); the upper bound,
// generous, is asked of one try in three (a loaded machine can stall any one of them).
TEST(LinkNodesRing, ARingAllreduceOverTheWorldTakesAtLeastTheModeledTime) {
  const int n = 4;
  const size_t count = 250000;  // 1 MB: chunks of 250 kB
  const lab::LinkModelOptions opt = lab::link_model_options(100, 8, 2, 0.8, 500);
  const std::vector<double> model = ring_on_timetable(n, count * sizeof(float) / n, opt);  // 15.6 ms at most
  const double slowest = *std::max_element(model.begin(), model.end());
  const double upper = 2 * slowest + 0.1;
  std::vector<double> took(static_cast<size_t>(n));
  for (int attempt = 0; attempt < 3; ++attempt) {
    lab::LinkModelWorld world(std::make_unique<lab::ThreadsWorld>(n), opt);
    std::vector<std::thread> ranks;
    const auto t0 = std::chrono::steady_clock::now();
    for (int r = 0; r < n; ++r)
      ranks.emplace_back([&, r] {
        lab::Communicator comm(world.transport(r), nullptr);
        std::vector<float> data(count, static_cast<float>(r));
        lab::ring_allreduce(comm, data.data(), count, lab::CollectiveInfo{"test", -1});
        took[static_cast<size_t>(r)] = seconds_since(t0);
        EXPECT_EQ(data[0], 6.0f);
        EXPECT_EQ(data[count - 1], 6.0f);
      });
    for (auto& th : ranks) th.join();
    for (int r = 0; r < n; ++r)
      EXPECT_GE(took[static_cast<size_t>(r)], model[static_cast<size_t>(r)] - 1e-9) << "rank " << r << ", try " << attempt;
    if (!kUpperBoundsHold || *std::max_element(took.begin(), took.end()) < upper) break;
  }
  if (kUpperBoundsHold) {
    for (int r = 0; r < n; ++r) EXPECT_LT(took[static_cast<size_t>(r)], upper) << "rank " << r << ", on every try";
  }
}

// The waits LinkModelWorld counts: a recv that finds its message still on the link waits for it and
// is counted, with how late the host woke it (never early); one that finds it arrived is not.
TEST(LinkWaitStats, OnlyAWaitForAMessageStillOnTheLinkCountsAndItIsNeverEarly) {
  const lab::LinkModelOptions opt = lab::link_model_options(2000, 8);  // 2 ms latency, 1e9 B/s
  lab::LinkModelWorld world(std::make_unique<lab::ThreadsWorld>(2), opt);
  float x = 1.0f, y = 0.0f;
  world.transport(0).send(1, &x, sizeof x, 7);
  world.transport(1).recv(0, &y, sizeof y, 7);  // posted at once: waits about 2 ms
  EXPECT_EQ(y, 1.0f);
  lab::LinkModelWorld::WaitStats s = world.wait_stats();
  EXPECT_EQ(s.waits, 1u);
  EXPECT_GE(s.late_total_s, 0.0);
  EXPECT_EQ(s.late_max_s, s.late_total_s);
  EXPECT_EQ(s.late_mean_s(), s.late_total_s);
  world.transport(0).send(1, &x, sizeof x, 8);
  std::this_thread::sleep_for(std::chrono::milliseconds(5));  // the message arrives meanwhile
  world.transport(1).recv(0, &y, sizeof y, 8);
  s = world.wait_stats();
  EXPECT_EQ(s.waits, 1u);
}

// ---- the configuration and the flags ----

namespace {

lab::RunConfig on_nodes() {
  lab::RunConfig c;
  c.world_size = 4;
  c.link_gbps = 100;
  c.link_gpus_per_node = 2;
  c.link_nic_gbps = 25;
  return c;
}

std::string refusal(const lab::RunConfig& c) {
  return config_error([&] { lab::validate(c); });
}

}  // namespace

TEST(LinkNodesConfig, ValidNodesAreAcceptedAndNotWarnedAbout) {
  lab::RunConfig c = on_nodes();
  EXPECT_EQ(refusal(c), "");
  EXPECT_TRUE(lab::ineffective_settings(c).empty()) << lab::ineffective_settings(c).front().message();
  c.link_nic_latency_us = 3;
  c.link_nics_per_node = 2;
  c.link_latency_us = 2;
  EXPECT_EQ(refusal(c), "");
  EXPECT_TRUE(lab::ineffective_settings(c).empty()) << lab::ineffective_settings(c).front().message();
  EXPECT_TRUE(lab::ineffective_settings(lab::RunConfig{}).empty());
}

TEST(LinkNodesConfig, EveryRankOnOneNodeIsAWarningNotARefusal) {
  lab::RunConfig c = on_nodes();
  c.link_gpus_per_node = 4;
  c.link_nic_latency_us = 3;
  EXPECT_EQ(refusal(c), "");
  const auto none = lab::ineffective_settings(c);
  ASSERT_EQ(none.size(), 3u);
  EXPECT_EQ(none[0].setting, "link_gpus_per_node");
  EXPECT_TRUE(has(none[0].message(), "--link-gpus-per-node 4 has no effect: all 4 ranks are on one node")) << none[0].message();
  EXPECT_EQ(none[1].setting, "link_nic_gbps");
  EXPECT_EQ(none[2].setting, "link_nic_latency_us");
  for (const auto& e : none) EXPECT_FALSE(e.refused);
}

TEST(LinkNodesConfig, BadCombinationsAreRefusedNamingTheFlag) {
  lab::RunConfig c = on_nodes();
  c.world_size = 6;
  c.link_gpus_per_node = 4;
  std::string e = refusal(c);
  EXPECT_TRUE(has(e, "--link-gpus-per-node 4")) << e;
  EXPECT_TRUE(has(e, "--world-size 6")) << e;
  c = on_nodes();
  c.link_nic_gbps = 0;
  EXPECT_TRUE(has(refusal(c), "--link-gpus-per-node 2 needs --link-nic-gbps")) << refusal(c);
  c = on_nodes();
  c.link_gbps = 0;  // the link model off
  e = refusal(c);
  EXPECT_TRUE(has(e, "--link-gpus-per-node 2")) << e;
  EXPECT_TRUE(has(e, "--link-gbps")) << e;
  EXPECT_TRUE(has(e, "off")) << e;
  c.link_latency_us = 10;  // on, but without a bandwidth
  EXPECT_TRUE(has(refusal(c), "--link-gbps is 0")) << refusal(c);
  c = lab::RunConfig{};
  c.world_size = 4;
  c.link_nic_latency_us = 5;
  EXPECT_TRUE(has(refusal(c), "--link-nic-latency-us 5")) << refusal(c);
  c.link_gbps = 10;
  EXPECT_TRUE(has(refusal(c), "needs --link-gpus-per-node")) << refusal(c);
  c = on_nodes();
  c.link_nics_per_node = 3;
  EXPECT_TRUE(has(refusal(c), "--link-nics-per-node must be between 1 and 2")) << refusal(c);
  c = on_nodes();
  c.mode = "async";
  EXPECT_TRUE(has(refusal(c), "parameter server")) << refusal(c);
  c = on_nodes();
  c.link_nic_gbps = -1;
  EXPECT_TRUE(has(refusal(c), "--link-nic-gbps")) << refusal(c);
}

TEST(LinkNodesConfig, TomlRoundTripAndOldFilesWithoutTheKeys) {
  lab::RunConfig c = on_nodes();
  c.link_nic_latency_us = 2.5;
  c.link_nics_per_node = 2;
  const std::string toml = lab::to_toml(c, {});
  const lab::RunConfig back = lab::config_from_toml(toml, "config.toml");
  EXPECT_EQ(back.link_gpus_per_node, 2);
  EXPECT_EQ(back.link_nic_gbps, 25);
  EXPECT_EQ(back.link_nic_latency_us, 2.5);
  EXPECT_EQ(back.link_nics_per_node, 2);
  // a file written before the nodes: no such keys, no nodes
  std::string old;
  for (size_t at = 0; at < toml.size();) {
    const size_t nl = toml.find('\n', at);
    const std::string line = toml.substr(at, nl == std::string::npos ? std::string::npos : nl + 1 - at);
    at = nl == std::string::npos ? toml.size() : nl + 1;
    if (line.rfind("link_gpus_per_node", 0) == 0 || line.rfind("link_nic", 0) == 0) continue;
    old += line;
  }
  ASSERT_FALSE(has(old, "link_nic"));
  const lab::RunConfig before = lab::config_from_toml(old, "old.toml");
  EXPECT_EQ(before.link_gpus_per_node, 0);
  EXPECT_EQ(before.link_nic_gbps, 0);
  EXPECT_EQ(before.link_nic_latency_us, 0);
  EXPECT_EQ(before.link_nics_per_node, 1);
  EXPECT_EQ(before.link_gbps, 100);
}

TEST(LinkNodesFlags, RunAndBenchLayoutsTakeTheNodeFlags) {
  const commands::CommandSpec spec = commands::parse_command(
      "run", {"--world-size", "4", "--link-gbps", "100", "--link-gpus-per-node", "2", "--link-nic-gbps", "25",
              "--link-nic-latency-us", "3", "--link-nics-per-node", "2"});
  EXPECT_EQ(spec.run.link_gpus_per_node, 2);
  EXPECT_EQ(spec.run.link_nic_gbps, 25);
  EXPECT_EQ(spec.run.link_nic_latency_us, 3);
  EXPECT_EQ(spec.run.link_nics_per_node, 2);
  const std::string e = config_error(
      [] { commands::parse_command("run", {"--world-size", "4", "--link-gpus-per-node", "2", "--link-nic-gbps", "25"}); });
  EXPECT_TRUE(has(e, "--link-gpus-per-node 2")) << e;
  EXPECT_TRUE(has(e, "--link-gbps")) << e;

  CLI::App app;
  lab::BenchLayoutsOptions o;
  commands::add_bench_layouts_flags(app, o);
  std::vector<std::string> args = {"--link-gpus-per-node", "4", "--link-nic-gbps", "10", "--link-nics-per-node", "1"};
  std::reverse(args.begin(), args.end());  // CLI11 takes a vector from the back
  app.parse(args);
  EXPECT_EQ(o.base.link_gpus_per_node, 4);
  EXPECT_EQ(o.base.link_nic_gbps, 10);
  EXPECT_EQ(o.base.link_nics_per_node, 1);
  const std::string help = app.help();
  for (const char* flag : {"--link-gpus-per-node", "--link-nic-gbps", "--link-nic-latency-us", "--link-nics-per-node"})
    EXPECT_TRUE(has(help, flag)) << flag;
}

// ---- leaves: the nodes on leaf switches, their uplinks shared ----

namespace {

// 4 nodes x 1 GPU (rank = node), 2 nodes a leaf: leaf 0 = nodes 0, 1, leaf 1 = nodes 2, 3. Links
// and NICs as two_by_two (a 1e6-byte message: 1 ms on a link, 2 ms through a NIC); with
// oversubscription 2 each uplink carries 2 x 1 x 0.5e9 / 2 = 0.5e9 B/s, one NIC's rate.
lab::LinkModelOptions leaves(int nodes_per_leaf = 2, double oversubscription = 2) {
  lab::LinkModelOptions o = two_by_two();
  o.gpus_per_node = 1;
  o.nodes_per_leaf = nodes_per_leaf;
  o.oversubscription = oversubscription;
  return o;
}

}  // namespace

// Two messages that leave leaf 0 at once, from its two nodes, share its uplink out (and leaf 1's
// uplink in): the second waits for the first and the pair takes twice as long as one. The same
// two messages within their leaves do not meet, nor do two that cross in opposite directions.
TEST(LinkNodesLeavesTimetable, TwoMessagesCrossingLeavesShareTheUplink) {
  const lab::LinkModelOptions o = leaves();
  EXPECT_EQ(o.uplink_bytes_per_s(), 0.5e9);
  EXPECT_EQ(o.leaf(1), 0);
  EXPECT_EQ(o.leaf(2), 1);
  EXPECT_TRUE(o.crosses_leaves(1, 2));
  EXPECT_FALSE(o.crosses_leaves(2, 3));
  {
    lab::LinkTimetable net(4, o);
    const auto a = net.place(0, 2, 1000000, 0.0);
    const auto b = net.place(1, 3, 1000000, 0.0);
    EXPECT_EQ(a.start, 0.0);
    EXPECT_EQ(a.leave, 2e-3);
    EXPECT_EQ(a.arrival, 2e-3 + (kLatency + kNicLatency)) << "the spine adds no latency";
    EXPECT_EQ(b.start, 2e-3) << "leaf 0's uplink out is full with the first message";
    EXPECT_EQ(b.leave, 4e-3);
    EXPECT_EQ(b.arrival, 4e-3 + (kLatency + kNicLatency));
  }
  {  // within a leaf: NICs only, each message its own
    lab::LinkTimetable net(4, o);
    EXPECT_EQ(net.place(0, 1, 1000000, 0.0).leave, 2e-3);
    EXPECT_EQ(net.place(2, 3, 1000000, 0.0).leave, 2e-3);
    EXPECT_EQ(net.place(1, 0, 1000000, 0.0).leave, 2e-3);
    EXPECT_EQ(net.place(3, 2, 1000000, 0.0).leave, 2e-3);
  }
  {  // opposite directions: leaf 0's out and leaf 1's in, leaf 1's out and leaf 0's in
    lab::LinkTimetable net(4, o);
    EXPECT_EQ(net.place(0, 2, 1000000, 0.0).leave, 2e-3);
    EXPECT_EQ(net.place(3, 1, 1000000, 0.0).leave, 2e-3);
  }
  {  // not oversubscribed: the uplink carries both NICs of its leaf at once
    lab::LinkTimetable net(4, leaves(2, 1));
    EXPECT_EQ(net.place(0, 2, 1000000, 0.0).leave, 2e-3);
    EXPECT_EQ(net.place(1, 3, 1000000, 0.0).leave, 2e-3);
  }
  {  // the mutation link-per-pair has no uplinks (nor NICs)
    lab::LinkTimetable net(4, o, /*per_pair=*/true);
    EXPECT_EQ(net.place(0, 2, 1000000, 0.0).leave, 1e-3);
    EXPECT_EQ(net.place(1, 3, 1000000, 0.0).leave, 1e-3);
  }
}

// What comes into a leaf shares its uplink in, from whichever leaf it comes: 3 leaves of 2 nodes,
// messages from leaves 0 and 1 into leaf 2 meet only there.
TEST(LinkNodesLeavesTimetable, MessagesIntoALeafShareItsUplinkIn) {
  lab::LinkTimetable net(6, leaves());
  EXPECT_EQ(net.place(0, 4, 1000000, 0.0).leave, 2e-3);
  const auto b = net.place(2, 5, 1000000, 0.0);
  EXPECT_EQ(b.start, 2e-3) << "leaf 2's uplink in";
  EXPECT_EQ(b.leave, 4e-3);
  // leaf 1 -> leaf 0 uses neither: it passes at once
  EXPECT_EQ(net.place(3, 1, 1000000, 0.0).leave, 2e-3);
}

// An uplink narrower than a NIC is the slowest resource: it sets the rate of every message that
// crosses it (and LinkModelOptions::seconds says so); within a leaf the NIC's rate stays.
TEST(LinkNodesLeavesTimetable, ANarrowUplinkSetsTheRate) {
  const lab::LinkModelOptions o = leaves(2, 4);  // 0.25e9 B/s: 4 ms for 1e6 bytes
  EXPECT_EQ(o.uplink_bytes_per_s(), 0.25e9);
  EXPECT_EQ(o.seconds(1000000, 0, 2), (kLatency + kNicLatency) + 4e-3);
  EXPECT_EQ(o.seconds(1000000, 0, 1), (kLatency + kNicLatency) + 2e-3);
  lab::LinkTimetable net(4, o);
  EXPECT_EQ(net.place(0, 2, 1000000, 0.0).leave, 4e-3);
  EXPECT_EQ(net.place(1, 3, 1000000, 0.0).leave, 8e-3);
  EXPECT_EQ(net.place(1, 0, 1000000, 0.0).leave, 2e-3) << "within leaf 0: rank 1's link out is free until 4 ms";
  // an empty message between leaves occupies nothing and takes the latency between nodes
  EXPECT_EQ(net.place(0, 3, 0, 1e-3).arrival, 1e-3 + (kLatency + kNicLatency));
}

// An uplink carries several messages at once as long as their rates fit in its bandwidth; one that
// does not fit, for its whole length, waits for the earliest start at which it does, and never
// takes a part of its rate.
TEST(LinkNodesLeavesTimetable, AnUplinkCarriesMessagesUpToItsBandwidth) {
  {  // 3 nodes a leaf, oversubscription 1.5: an uplink of 1e9 B/s, two NICs' rate
    const lab::LinkModelOptions o = leaves(3, 1.5);
    EXPECT_EQ(o.uplink_bytes_per_s(), 1e9);
    lab::LinkTimetable net(6, o);
    EXPECT_EQ(net.place(0, 3, 1000000, 0.0).leave, 2e-3);
    EXPECT_EQ(net.place(1, 4, 1000000, 0.0).leave, 2e-3) << "two fit side by side";
    const auto c = net.place(2, 5, 1000000, 0.0);
    EXPECT_EQ(c.start, 2e-3) << "the third waits for room";
    EXPECT_EQ(c.leave, 4e-3);
  }
  {  // staggered: A on [0, 2 ms), B on [1, 3 ms); C posted at 1.5 ms finds the uplink full until A ends
    lab::LinkTimetable net(6, leaves(3, 1.5));
    EXPECT_EQ(net.place(0, 3, 1000000, 0.0).start, 0.0);
    EXPECT_EQ(net.place(1, 4, 1000000, 1e-3).start, 1e-3);
    const auto c = net.place(2, 5, 1000000, 1.5e-3);
    EXPECT_EQ(c.start, 2e-3) << "beside B alone it fits";
    EXPECT_EQ(c.leave, 4e-3);
  }
  {  // 2 nodes a leaf, oversubscription 1.5: 0.667e9 B/s, more than one NIC and less than two
    lab::LinkTimetable net(4, leaves(2, 1.5));
    EXPECT_EQ(net.place(0, 2, 1000000, 0.0).leave, 2e-3) << "at the NIC's rate, the slowest";
    EXPECT_EQ(net.place(1, 3, 1000000, 0.0).start, 2e-3) << "the whole rate or nothing";
  }
}

// When the leaves do not divide the nodes the last leaf holds fewer; its uplink is as wide as
// every leaf's (M x K x NIC / X), as in the simulator's topologies.
TEST(LinkNodesLeavesTimetable, TheLastLeafMayHoldFewerNodes) {
  const lab::LinkModelOptions o = leaves(2, 2);  // 5 nodes: leaves {0, 1}, {2, 3}, {4}
  EXPECT_EQ(o.leaf(4), 2);
  lab::LinkTimetable net(5, o);
  EXPECT_EQ(net.place(4, 0, 1000000, 0.0).leave, 2e-3) << "leaf 2's uplink: 0.5e9 B/s, not half of it";
  EXPECT_EQ(net.place(2, 1, 1000000, 0.0).start, 2e-3) << "leaf 0's uplink in is taken by the first";
}

namespace {

// The timetable as it was before leaves (link_model.cpp of the commit that gave the network
// nodes: links, and NICs held by one message at a time), to hold the new one to it bit for bit.
class NodesBeforeLeaves {
 public:
  NodesBeforeLeaves(int n, const lab::LinkModelOptions& o) : m_n(static_cast<size_t>(n)), m_o(o), m_pair(m_n * m_n) {
    const size_t nics = m_n / static_cast<size_t>(o.gpus_per_node) * static_cast<size_t>(o.nics_per_node);
    m_rate.assign(2 * m_n, o.bytes_per_s);
    m_rate.resize(2 * m_n + 2 * nics, o.nic_bytes_per_s);
    m_busy.resize(m_rate.size());
  }
  lab::LinkTimetable::Placed place(int src, int dst, size_t bytes, double posted) {
    const size_t s = static_cast<size_t>(src), d = static_cast<size_t>(dst);
    const auto nic = [&](int r) {
      return 2 * m_n + 2 * (static_cast<size_t>(m_o.node(r)) * static_cast<size_t>(m_o.nics_per_node) +
                            static_cast<size_t>(m_o.nic(r)));
    };
    std::vector<size_t> on = {s, m_n + d};
    if (m_o.crosses_nodes(src, dst)) on = {s, nic(src), nic(dst) + 1, m_n + d};
    double rate = std::numeric_limits<double>::infinity();
    for (size_t r : on) {
      auto& b = m_busy[r];
      b.erase(b.begin(), std::find_if(b.begin(), b.end(), [&](const std::pair<double, double>& iv) { return iv.second > posted; }));
      if (m_rate[r] > 0) rate = std::min(rate, m_rate[r]);
    }
    const double len = std::isinf(rate) ? 0.0 : static_cast<double>(bytes) / rate;
    double& pair_leave = m_pair[s * m_n + d];
    double start = std::max(posted, pair_leave);
    for (;;) {
      double next = start;
      for (size_t r : on) next = first_fit(m_busy[r], next, len);
      if (next == start) break;
      start = next;
    }
    for (size_t r : on)
      if (len > 0)
        m_busy[r].insert(std::lower_bound(m_busy[r].begin(), m_busy[r].end(), std::make_pair(start, start + len)),
                         {start, start + len});
    pair_leave = start + len;
    return {start, start + len, start + len + m_o.latency(src, dst)};
  }

 private:
  static double first_fit(const std::vector<std::pair<double, double>>& busy, double t, double d) {
    if (d <= 0) return t;
    for (const auto& [s, e] : busy) {
      if (e <= t) continue;
      if (t + d <= s) return t;
      t = e;
    }
    return t;
  }
  size_t m_n;
  lab::LinkModelOptions m_o;
  std::vector<double> m_pair, m_rate;
  std::vector<std::vector<std::pair<double, double>>> m_busy;
};

}  // namespace

// --link-nodes-per-leaf 0 (the default) is one non-blocking switch between the nodes: the
// timetable of the nodes alone, bit for bit, whatever the oversubscription holds (it is not read).
// So is every node on one leaf, and so are leaves whose uplinks are not oversubscribed (X = 1: an
// uplink carries all its leaf's NICs at once, the last, smaller leaf's too). Oversubscribed
// leaves do change it (the comparison can fail).
TEST(LinkNodesLeavesTimetable, NoLeavesIsTheNodesTimetableBitForBit) {
  const int n = 12;  // 6 nodes of 2 ranks, 2 NICs each
  lab::LinkModelOptions base;
  base.latency_s = 7.5e-6;
  base.bytes_per_s = 1.25e9;
  base.gpus_per_node = 2;
  base.nic_bytes_per_s = 4e8;
  base.nic_latency_s = 3e-6;
  base.nics_per_node = 2;
  const auto with = [&](int nodes_per_leaf, double oversubscription) {
    lab::LinkModelOptions o = base;
    o.nodes_per_leaf = nodes_per_leaf;
    o.oversubscription = oversubscription;
    return o;
  };
  const std::vector<std::pair<int, double>> same = {{0, 1}, {0, 3}, {6, 4}, {10, 2}, {2, 1}, {4, 1}, {1, 1}};
  std::vector<std::unique_ptr<lab::LinkTimetable>> nets;
  for (const auto& [m, x] : same) nets.push_back(std::make_unique<lab::LinkTimetable>(n, with(m, x)));
  lab::LinkTimetable narrow(n, with(2, 2));
  NodesBeforeLeaves before(n, base);
  std::mt19937 rng(2718);
  std::uniform_int_distribution<int> rank(0, n - 1);
  std::uniform_int_distribution<size_t> size(0, 4000000);
  std::uniform_real_distribution<double> gap(0.0, 2e-3);
  double t = 0;
  int narrow_differs = 0;
  for (int i = 0; i < 2000; ++i) {
    if (i % 3 == 0) t += gap(rng);  // several messages posted at the same time, then a gap
    const int src = rank(rng);
    int dst = rank(rng);
    if (dst == src) dst = (dst + 1) % n;
    const size_t bytes = i % 17 == 0 ? 0 : size(rng);
    const auto po = before.place(src, dst, bytes, t);
    for (size_t k = 0; k < nets.size(); ++k) {
      const auto p = nets[k]->place(src, dst, bytes, t);
      ASSERT_EQ(p.start, po.start) << "message " << i << ", nodes_per_leaf " << same[k].first << ", x " << same[k].second;
      ASSERT_EQ(p.leave, po.leave) << "message " << i << ", nodes_per_leaf " << same[k].first;
      ASSERT_EQ(p.arrival, po.arrival) << "message " << i << ", nodes_per_leaf " << same[k].first;
    }
    if (narrow.place(src, dst, bytes, t).leave != po.leave) ++narrow_differs;
  }
  EXPECT_GT(narrow_differs, 100) << "oversubscribed uplinks delay messages between leaves";
}

// ---- leaves: what the model refuses ----

TEST(LinkNodesLeavesOptions, BadLeavesAreRefusedNamingTheFlag) {
  lab::LinkModelOptions o = leaves();
  o.nodes_per_leaf = -1;
  std::string e = config_error([&] { lab::LinkTimetable net(4, o); });
  EXPECT_TRUE(has(e, "--link-nodes-per-leaf must be >= 0")) << e;
  for (double x : {0.5, 0.0, -1.0, std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity()}) {
    o = leaves(2, x);
    e = config_error([&] { lab::LinkTimetable net(4, o); });
    EXPECT_TRUE(has(e, "--link-oversubscription must be >= 1")) << x << ": " << e;
  }
  // the world checks them too, before any message
  o = leaves(2, 0.5);
  e = config_error([&] { lab::LinkModelWorld world(std::make_unique<lab::ThreadsWorld>(4), o); });
  EXPECT_TRUE(has(e, "--link-oversubscription")) << e;
  // unread fields are not checked: the oversubscription without leaves, the leaves without nodes
  o = leaves(0, 0.5);
  EXPECT_EQ(config_error([&] { lab::LinkTimetable net(4, o); }), "");
  o = leaves(-1, 0.5);
  o.gpus_per_node = 0;
  EXPECT_EQ(config_error([&] { lab::LinkTimetable net(4, o); }), "");
  // a node count that is not a multiple of nodes_per_leaf is accepted (the last leaf holds fewer)
  EXPECT_EQ(config_error([&] { lab::LinkTimetable net(7, leaves(3, 2)); }), "");
}

// The flags' units, and the uplink in the simulator's words: the same bandwidth as
// Topology::uplink_bytes_per_s() (lab/sim/topology.h) for the same figures, without rails.
TEST(LinkNodesLeavesOptions, TheUplinkIsTheSimulatorsUplink) {
  const lab::LinkModelOptions f = lab::link_model_options(5, 800, 8, 400, 2, 4, 3, 2.5);
  EXPECT_EQ(f.nodes_per_leaf, 3);
  EXPECT_EQ(f.oversubscription, 2.5);
  lab::Topology t;
  t.nodes = 7;
  t.gpus_per_node = 8;
  t.nics_per_node = 4;
  t.nic_Gbps = 400;
  t.rails = false;
  t.nodes_per_leaf = 3;
  t.oversubscription = 2.5;
  EXPECT_EQ(f.nic_bytes_per_s, t.nic_bytes_per_s());
  EXPECT_EQ(f.uplink_bytes_per_s(), t.uplink_bytes_per_s());
  EXPECT_EQ(f.uplink_bytes_per_s(), 3 * 4 * 50e9 / 2.5);
  // the defaults: no leaves
  const lab::LinkModelOptions d = lab::link_model_options(5, 800, 8, 400, 2, 4);
  EXPECT_EQ(d.nodes_per_leaf, 0);
  EXPECT_EQ(d.oversubscription, 1.0);
  EXPECT_FALSE(d.has_leaves());
}

// ---- leaves: the configuration and the flags ----

namespace {

// 8 ranks on 4 nodes of 2, 2 nodes a leaf, uplinks 2:1
lab::RunConfig on_leaves() {
  lab::RunConfig c = on_nodes();
  c.world_size = 8;
  c.link_nodes_per_leaf = 2;
  c.link_oversubscription = 2;
  return c;
}

}  // namespace

TEST(LinkNodesLeavesConfig, ValidLeavesAreAcceptedAndNotWarnedAbout) {
  lab::RunConfig c = on_leaves();
  EXPECT_EQ(refusal(c), "");
  EXPECT_TRUE(lab::ineffective_settings(c).empty()) << lab::ineffective_settings(c).front().message();
  c.world_size = 6;  // 3 nodes: leaves of 2 and 1
  EXPECT_EQ(refusal(c), "");
  EXPECT_TRUE(lab::ineffective_settings(c).empty()) << lab::ineffective_settings(c).front().message();
  c = on_leaves();
  c.link_nodes_per_leaf = 1;  // every node a leaf of its own
  c.link_nics_per_node = 2;
  EXPECT_EQ(refusal(c), "");
  EXPECT_TRUE(lab::ineffective_settings(c).empty()) << lab::ineffective_settings(c).front().message();
}

TEST(LinkNodesLeavesConfig, EveryNodeOnOneLeafIsAWarningNotARefusal) {
  for (int m : {4, 9}) {
    lab::RunConfig c = on_leaves();
    c.link_nodes_per_leaf = m;
    EXPECT_EQ(refusal(c), "");
    const auto none = lab::ineffective_settings(c);
    ASSERT_EQ(none.size(), 2u) << m;
    EXPECT_EQ(none[0].setting, "link_nodes_per_leaf");
    EXPECT_TRUE(has(none[0].message(), "--link-nodes-per-leaf " + std::to_string(m) +
                                           " has no effect: all 4 nodes are on one leaf"))
        << none[0].message();
    EXPECT_EQ(none[1].setting, "link_oversubscription");
    EXPECT_TRUE(has(none[1].message(), "--link-oversubscription 2 has no effect: all 4 nodes are on one leaf"))
        << none[1].message();
    for (const auto& e : none) EXPECT_FALSE(e.refused);
  }
}

// Leaves whose uplinks are not oversubscribed change no time (the timetable without leaves, bit
// for bit): --link-nodes-per-leaf alone says so, and what would make it matter.
TEST(LinkNodesLeavesConfig, LeavesWithoutOversubscriptionAreAWarning) {
  lab::RunConfig c = on_leaves();
  c.link_oversubscription = 1;
  EXPECT_EQ(refusal(c), "");
  const auto none = lab::ineffective_settings(c);
  ASSERT_EQ(none.size(), 1u);
  EXPECT_EQ(none[0].setting, "link_nodes_per_leaf");
  EXPECT_TRUE(has(none[0].message(), "--link-nodes-per-leaf 2 has no effect: --link-oversubscription is 1"))
      << none[0].message();
  EXPECT_TRUE(has(none[0].hint, "--link-oversubscription")) << none[0].hint;
  EXPECT_FALSE(none[0].refused);
}

TEST(LinkNodesLeavesConfig, BadLeavesAreRefusedNamingTheFlag) {
  lab::RunConfig c = on_leaves();
  c.link_nodes_per_leaf = -1;
  EXPECT_TRUE(has(refusal(c), "--link-nodes-per-leaf must be >= 0")) << refusal(c);
  for (double x : {0.5, 0.0, std::numeric_limits<double>::quiet_NaN()}) {
    c = on_leaves();
    c.link_oversubscription = x;
    EXPECT_TRUE(has(refusal(c), "--link-oversubscription must be >= 1")) << refusal(c);
  }
  c = on_nodes();  // the oversubscription without leaves
  c.link_oversubscription = 2;
  std::string e = refusal(c);
  EXPECT_TRUE(has(e, "--link-oversubscription 2 describes the leaves' uplinks")) << e;
  EXPECT_TRUE(has(e, "--link-nodes-per-leaf")) << e;
  c = lab::RunConfig{};  // the leaves without nodes
  c.world_size = 8;
  c.link_gbps = 100;
  c.link_nodes_per_leaf = 2;
  e = refusal(c);
  EXPECT_TRUE(has(e, "--link-nodes-per-leaf 2 describes the leaf switches")) << e;
  EXPECT_TRUE(has(e, "needs --link-gpus-per-node")) << e;
  c.link_nodes_per_leaf = 0;
  c.link_oversubscription = 3;
  EXPECT_TRUE(has(refusal(c), "--link-oversubscription 3 describes the leaf switches")) << refusal(c);
  c = on_leaves();  // ... without the simulated link
  c.link_gbps = 0;
  EXPECT_TRUE(has(refusal(c), "--link-gbps")) << refusal(c);
  c = on_leaves();
  c.mode = "async";
  EXPECT_TRUE(has(refusal(c), "parameter server")) << refusal(c);
}

TEST(LinkNodesLeavesConfig, TomlRoundTripAndOldFilesWithoutTheKeys) {
  lab::RunConfig c = on_leaves();
  c.link_oversubscription = 2.5;
  const std::string toml = lab::to_toml(c, {});
  const lab::RunConfig back = lab::config_from_toml(toml, "config.toml");
  EXPECT_EQ(back.link_nodes_per_leaf, 2);
  EXPECT_EQ(back.link_oversubscription, 2.5);
  EXPECT_EQ(back.link_gpus_per_node, 2);
  // a file written before the leaves: no such keys, no leaves
  std::string old;
  for (size_t at = 0; at < toml.size();) {
    const size_t nl = toml.find('\n', at);
    const std::string line = toml.substr(at, nl == std::string::npos ? std::string::npos : nl + 1 - at);
    at = nl == std::string::npos ? toml.size() : nl + 1;
    if (line.rfind("link_nodes_per_leaf", 0) == 0 || line.rfind("link_oversubscription", 0) == 0) continue;
    old += line;
  }
  ASSERT_FALSE(has(old, "leaf"));
  ASSERT_FALSE(has(old, "oversubscription"));
  const lab::RunConfig before = lab::config_from_toml(old, "old.toml");
  EXPECT_EQ(before.link_nodes_per_leaf, 0);
  EXPECT_EQ(before.link_oversubscription, 1.0);
  EXPECT_EQ(before.link_gpus_per_node, 2);
  EXPECT_EQ(refusal(before), "");
}

TEST(LinkNodesLeavesFlags, RunAndBenchLayoutsTakeTheLeafFlags) {
  const commands::CommandSpec spec = commands::parse_command(
      "run", {"--world-size", "8", "--link-gbps", "100", "--link-gpus-per-node", "2", "--link-nic-gbps", "25",
              "--link-nodes-per-leaf", "2", "--link-oversubscription", "3"});
  EXPECT_EQ(spec.run.link_nodes_per_leaf, 2);
  EXPECT_EQ(spec.run.link_oversubscription, 3);
  const std::string e = config_error([] {
    commands::parse_command("run", {"--world-size", "8", "--link-gbps", "100", "--link-gpus-per-node", "2",
                                    "--link-nic-gbps", "25", "--link-oversubscription", "3"});
  });
  EXPECT_TRUE(has(e, "--link-oversubscription 3")) << e;
  EXPECT_TRUE(has(e, "--link-nodes-per-leaf")) << e;

  CLI::App app;
  lab::BenchLayoutsOptions o;
  commands::add_bench_layouts_flags(app, o);
  std::vector<std::string> args = {"--link-nodes-per-leaf", "4", "--link-oversubscription", "1.5"};
  std::reverse(args.begin(), args.end());  // CLI11 takes a vector from the back
  app.parse(args);
  EXPECT_EQ(o.base.link_nodes_per_leaf, 4);
  EXPECT_EQ(o.base.link_oversubscription, 1.5);
  const std::string help = app.help();
  for (const char* flag : {"--link-nodes-per-leaf", "--link-oversubscription"}) EXPECT_TRUE(has(help, flag)) << flag;
}

// A run on 4 nodes x 1 rank, 2 nodes a leaf: it trains through the leaves' uplinks, and
// summary.json's communication.link records every link setting.
TEST(LinkNodesLeavesRun, SummaryRecordsTheLeaves) {
  DTLAB_REQUIRE_DATASET();
  testutil::TempDir dir;
  lab::RunConfig c = testutil::small_run("mlp", 4, dir.path(), 2);
  c.link_gbps = 100;
  c.link_gpus_per_node = 1;
  c.link_nic_gbps = 50;
  c.link_nic_latency_us = 2;
  c.link_nodes_per_leaf = 2;
  c.link_oversubscription = 2;
  lab::Run(c, lab::make_world).run();
  const auto sj = nlohmann::json::parse(testutil::read_file(dir.file("summary.json")));
  const auto& link = sj.at("communication").at("link");
  EXPECT_EQ(link.at("gpus_per_node").get<int>(), 1);
  EXPECT_EQ(link.at("nic_gbps").get<double>(), 50.0);
  EXPECT_EQ(link.at("nodes_per_leaf").get<int>(), 2);
  EXPECT_EQ(link.at("oversubscription").get<double>(), 2.0);
  EXPECT_GT(sj.at("communication").at("comm_seconds").get<double>(), 0.0);
}
