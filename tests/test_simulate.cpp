// The simulator (lab/sim, dtlab simulate): its schedules send exactly what dtlab's collectives send
// (bytes and messages per rank, uneven chunks, N not a power of two), its times equal the closed
// forms on uniform links, contention appears where links are shared and nowhere else, NCCL's
// protocols give NCCL's latencies, topologies read back what they wrote and refuse bad files by
// name, and the validation tables hold.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "collective_sim.h"
#include "errors.h"
#include "nccl_model.h"
#include "rank_threads.h"
#include "ring_allreduce.h"
#include "sharded_collectives.h"
#include "simulate.h"
#include "simulate_validate.h"
#include "test_util.h"
#include "topology.h"
#include "tree_allreduce.h"

namespace {

using lab::SimAlgorithm;
using lab::SimCollective;
using lab::SimProtocol;

// N ranks on one switch: every rank's link to it `gbps`, `latency_us` per message (the emulated
// link model's network).
lab::Topology flat(int n, double GBps = 1.0, double latency_us = 10) {
  return lab::link_model_topology(n, lab::link_model_options(latency_us, GBps * 8));
}

struct Sent {
  std::vector<double> bytes;
  std::vector<int64_t> messages;
};

// What dtlab's own collective sends, per rank, from its Chunk events (recorded by the sender).
Sent dtlab_sends(int n, const std::function<void(int, lab::Communicator&)>& body) {
  labtest::RankWorld w(n);
  auto errors = w.run(body);
  for (auto& e : errors) EXPECT_EQ(labtest::message_of(e), "");
  Sent s{std::vector<double>(n, 0), std::vector<int64_t>(n, 0)};
  for (int r = 0; r < n; ++r)
    for (const auto& e : w.events(r))
      if (e.kind == lab::EventKind::Chunk) {
        EXPECT_EQ(e.src, r);
        s.bytes[r] += static_cast<double>(e.bytes);
        s.messages[r] += 1;
      }
  return s;
}

void expect_same(const Sent& dtlab, const lab::SimTraffic& sim, const std::string& what) {
  ASSERT_EQ(dtlab.bytes.size(), sim.sent.size()) << what;
  for (size_t r = 0; r < sim.sent.size(); ++r) {
    EXPECT_EQ(dtlab.bytes[r], sim.sent[r]) << what << ", rank " << r;
    EXPECT_EQ(dtlab.messages[r], sim.messages[r]) << what << ", rank " << r;
  }
}

lab::SimTraffic sim_sends(int n, SimAlgorithm a, SimCollective c, uint64_t bytes) {
  lab::SimOptions o;
  o.algorithm = a;
  o.collective = c;
  o.protocol = SimProtocol::Wire;
  o.exact = true;
  return lab::sim_traffic(lab::sim_schedule(flat(n), o, bytes), n);
}

// ---- exact: the schedules send what dtlab sends ----

TEST(SimulateExact, AllreduceBytesAndMessagesPerRankAreDtlabs) {
  for (int n : {2, 3, 4, 5, 7, 8, 16}) {
    // empty, fewer floats than ranks, uneven chunks, the tree's doubling path (<= 64 KiB) and its
    // halving path, and chunks over the ring's 512 KiB segment (several segments)
    for (size_t count : {size_t{0}, size_t{1}, static_cast<size_t>(n + 1), size_t{997}, size_t{16384} + 3,
                         size_t{300007}}) {
      for (auto algo : {lab::AllreduceAlgorithm::Ring, lab::AllreduceAlgorithm::Tree}) {
        std::vector<std::vector<float>> data(n, std::vector<float>(count, 1.0f));
        const Sent d = dtlab_sends(n, [&](int r, lab::Communicator& comm) {
          comm.set_allreduce_algorithm(algo);
          comm.allreduce_sum(data[r].data(), count, {});
        });
        const auto a = algo == lab::AllreduceAlgorithm::Ring ? SimAlgorithm::Ring : SimAlgorithm::Rhd;
        expect_same(d, sim_sends(n, a, SimCollective::Allreduce, count * 4),
                    std::string(lab::sim_algorithm_name(a)) + " N=" + std::to_string(n) + " count=" + std::to_string(count));
      }
    }
  }
}

TEST(SimulateExact, ReduceScatterAllgatherAndBroadcastAreDtlabs) {
  for (int n : {2, 3, 4, 6, 8}) {
    for (size_t block : {size_t{0}, size_t{1}, size_t{1001}, size_t{200003}}) {
      std::vector<std::vector<float>> data(n, std::vector<float>(block * n, 1.0f));
      for (bool gather : {false, true}) {
        for (auto algo : {lab::AllreduceAlgorithm::Ring, lab::AllreduceAlgorithm::Tree}) {
          if (algo == lab::AllreduceAlgorithm::Tree && !lab::tree_collectives_fit(n)) continue;
          const Sent d = dtlab_sends(n, [&](int r, lab::Communicator& comm) {
            comm.set_allreduce_algorithm(algo);
            if (gather)
              comm.allgather_in_place(data[r].data(), block, {});
            else
              comm.reduce_scatter_sum(data[r].data(), block, {});
          });
          const auto a = algo == lab::AllreduceAlgorithm::Ring ? SimAlgorithm::Ring : SimAlgorithm::Rhd;
          expect_same(d, sim_sends(n, a, gather ? SimCollective::Allgather : SimCollective::ReduceScatter, block * n * 4),
                      std::string(gather ? "allgather " : "reduce_scatter ") + lab::sim_algorithm_name(a) +
                          " N=" + std::to_string(n) + " block=" + std::to_string(block));
        }
      }
      const size_t bytes = block * n * 4;
      const Sent d = dtlab_sends(n, [&](int r, lab::Communicator& comm) { comm.broadcast(data[r].data(), bytes, 0, {}); });
      expect_same(d, sim_sends(n, SimAlgorithm::Ring, SimCollective::Broadcast, bytes),
                  "broadcast N=" + std::to_string(n) + " bytes=" + std::to_string(bytes));
    }
  }
}

// ---- closed forms on uniform links ----

TEST(SimulateClosedForm, RingAndRhdOnOneSwitchAreTheTextbookFormulas) {
  const double a = 10e-6, B = 1e9;
  for (int n : {2, 4, 8, 16}) {
    const uint64_t S = uint64_t{1} << 20;  // N divides the count; chunks up to 512 KiB: one segment
    lab::SimOptions o;
    o.protocol = SimProtocol::Wire;
    o.algorithm = SimAlgorithm::Ring;
    const auto ring = lab::simulate_collective(flat(n, B / 1e9, a * 1e6), o, S);
    EXPECT_NEAR(ring.time_s, 2 * (n - 1) * (a + double(S) / n / B), 1e-12) << n;
    EXPECT_NEAR(ring.latency_s, 2 * (n - 1) * a, 1e-12);
    EXPECT_NEAR(ring.bandwidth_s, 2.0 * (n - 1) / n * double(S) / B, 1e-12);
    EXPECT_EQ(ring.contention_s, 0.0);
    o.algorithm = SimAlgorithm::Rhd;
    const auto rhd = lab::simulate_collective(flat(n, B / 1e9, a * 1e6), o, S);
    const double L = std::log2(n);
    EXPECT_NEAR(rhd.time_s, 2 * L * a + 2.0 * (n - 1) / n * double(S) / B, 1e-12) << n;
    EXPECT_NEAR(ring.busbw, double(S) / ring.time_s * 2 * (n - 1) / n, 1e-3);
  }
  // the compressed schedule (every step as the largest segment, repeated) times what the exact
  // one does, up to one float per step where segments are uneven
  for (int n : {3, 5, 16})
    for (uint64_t S : {uint64_t{4096}, uint64_t{3} << 20, uint64_t{40000004}}) {
      lab::SimOptions o;
      o.protocol = SimProtocol::Wire;
      const auto fast = lab::simulate_collective(flat(n), o, S);
      o.exact = true;
      const auto exact = lab::simulate_collective(flat(n), o, S);
      EXPECT_EQ(fast.steps, exact.steps);
      EXPECT_GE(fast.time_s, exact.time_s - 1e-12) << n << " " << S;
      EXPECT_LE(fast.time_s, exact.time_s + double(exact.steps) * 4 / 1e9 + 1e-12) << n << " " << S;
    }
}

// ---- contention: shared NICs and uplinks ----

TEST(SimulateContention, SharedNicsCostTimeWhereTheyAreSharedOnly) {
  lab::Topology t = flat(4, 10, 1);
  t.nodes = 2;  // 2 nodes x 4
  t.nic_Gbps = 8;  // 1 GB/s per NIC, slower than the GPUs' 10 GB/s
  t.net_latency_us = 5;
  lab::SimOptions o;
  o.protocol = SimProtocol::Wire;
  o.algorithm = SimAlgorithm::Rhd;
  const uint64_t S = uint64_t{64} << 20;
  // rhd's first step pairs rank r with r ^ 4: all 4 GPUs of a node send through its one NIC
  const auto one_nic = lab::simulate_collective(t, o, S);
  EXPECT_GT(one_nic.contention_s, 0.5 * one_nic.time_s);
  t.nics_per_node = 4;  // a NIC per GPU: the same step shares nothing
  const auto four = lab::simulate_collective(t, o, S);
  EXPECT_NEAR(four.contention_s, 0.0, 1e-12);
  EXPECT_LT(four.time_s, one_nic.time_s / 2);
  // the ring crosses between nodes once per node per step: one NIC is not shared
  o.algorithm = SimAlgorithm::Ring;
  t.nics_per_node = 1;
  EXPECT_NEAR(lab::simulate_collective(t, o, S).contention_s, 0.0, 1e-12);
  // an oversubscribed spine: 4 nodes on 2 leaves, 4:1, rhd's cross-leaf step is slower
  t.nodes = 4;
  t.nics_per_node = 4;
  t.nodes_per_leaf = 2;
  o.algorithm = SimAlgorithm::Rhd;
  const auto blocking_free = lab::simulate_collective(t, o, S);
  t.oversubscription = 4;
  const auto oversubscribed = lab::simulate_collective(t, o, S);
  EXPECT_GT(oversubscribed.time_s, blocking_free.time_s * 1.5);
  EXPECT_GT(oversubscribed.contention_s, blocking_free.contention_s);
}

TEST(SimulateContention, TwoNodeTreeExceedsTheNicThreeNodesDoNot) {
  const lab::Topology pcie = lab::topology_preset("pcie-eth");
  const double nic = pcie.nics_per_node * pcie.nic_bytes_per_s();
  lab::SimOptions o;
  o.algorithm = SimAlgorithm::DbTree;
  o.protocol = SimProtocol::Simple;
  auto at = [&](int nodes, SimAlgorithm a) {
    lab::Topology t = pcie;
    t.nodes = nodes;
    o.algorithm = a;
    return lab::simulate_collective(t, o, uint64_t{1} << 30).busbw;
  };
  EXPECT_GT(at(2, SimAlgorithm::DbTree), 1.3 * nic);
  EXPECT_LE(at(2, SimAlgorithm::Ring), nic);
  for (int nodes : {4, 5, 8, 16}) EXPECT_LE(at(nodes, SimAlgorithm::DbTree), nic) << nodes;
  // 3 nodes: NCCL's trees of 3 members are chains; a node's NIC carries 1.5 S each way (S/2 up
  // and S/2 down in the tree where it is the middle, S/2 in the other), so busbw is about
  // 2(N-1)/N / 1.5 = 1.28 of the NIC's (x the tree protocol's 0.92)
  EXPECT_NEAR(at(3, SimAlgorithm::DbTree), nic * 0.92 * 2 * 23.0 / 24 / 1.5, 0.01 * nic);
}

TEST(SimulateTrees, DoubleBinaryTreeIsNcclsShape) {
  // NCCL's trees.cc illustration, 14 members: 0 -> 8 -> 4 -> 2 -> 1, 12 -> 8, 13 -> 12
  EXPECT_EQ(lab::dbtree_parent(14, 0, 0), -1);
  EXPECT_EQ(lab::dbtree_parent(14, 8, 0), 0);
  EXPECT_EQ(lab::dbtree_parent(14, 4, 0), 8);
  EXPECT_EQ(lab::dbtree_parent(14, 12, 0), 8);
  EXPECT_EQ(lab::dbtree_parent(14, 13, 0), 12);
  EXPECT_EQ(lab::dbtree_parent(14, 1, 0), 2);
  // the second tree mirrors the first (even count): 13 is its root, 3's parent is 11's mirror
  EXPECT_EQ(lab::dbtree_parent(14, 13, 1), -1);
  EXPECT_EQ(lab::dbtree_parent(14, 5, 1), 13);      // 13 - 5 = 8 is the first tree's child of its root
  EXPECT_EQ(lab::dbtree_parent(14, 9, 1), 5);       // 13 - 9 = 4, whose parent is 8 = 13 - 5
  // every member but the roots has a parent; a leaf in one tree is interior in the other
  for (int n : {2, 3, 5, 8, 13, 64}) {
    for (int tr = 0; tr < 2; ++tr) {
      int roots = 0;
      for (int r = 0; r < n; ++r) {
        const int p = lab::dbtree_parent(n, r, tr);
        if (p < 0) ++roots;
        else EXPECT_TRUE(p >= 0 && p < n && p != r);
      }
      EXPECT_EQ(roots, 1) << n;
    }
  }
}

// ---- NCCL's protocols: NCCL's latencies ----

TEST(SimulateNccl, RingAndTreeLatenciesAreNcclsModel) {
  const lab::Topology h100 = lab::topology_preset("dgx-h100");
  for (int nodes : {2, 8, 128, 512}) {
    lab::Topology t = h100;
    t.nodes = nodes;
    const lab::NcclModelInputs in = lab::sim_nccl_inputs(t, 16);
    const auto tuned = lab::nccl_tune_model(in, lab::NcclColl::AllReduce);
    for (auto proto : {SimProtocol::Simple, SimProtocol::LL128, SimProtocol::LL}) {
      for (auto algo : {SimAlgorithm::Ring, SimAlgorithm::DbTree}) {
        lab::SimOptions o;
        o.protocol = proto;
        o.algorithm = algo;
        const auto r = lab::simulate_collective(t, o, 4096);
        const int idx = (algo == SimAlgorithm::Ring ? 3 : 0) + (proto == SimProtocol::LL ? 0 : proto == SimProtocol::LL128 ? 1 : 2);
        EXPECT_NEAR(r.latency_s * 1e6, tuned[idx].latency_us, 1e-3 * tuned[idx].latency_us)
            << nodes << " nodes, " << lab::sim_algorithm_name(algo) << "/" << lab::sim_protocol_name(proto);
      }
    }
  }
}

// ---- topologies ----

TEST(SimulateTopology, FilesReadBackWhatTheyWroteAndRefuseBadOnesByName) {
  testutil::TempDir dir;
  for (const auto& name : lab::topology_presets()) {
    lab::Topology t = lab::topology_preset(name);
    t.nodes = 12;
    const std::string path = dir.path() + "/" + name + ".toml";
    std::ofstream(path) << lab::topology_toml(t);
    const lab::Topology back = lab::read_topology_file(path);
    EXPECT_EQ(lab::topology_toml(back), lab::topology_toml(t)) << name;
    EXPECT_EQ(lab::topology_line(lab::topology_from_arg(path)), lab::topology_line(t));
  }
  auto refused = [&](const std::string& text, const std::string& part) {
    const std::string path = dir.path() + "/bad.toml";
    std::ofstream(path) << text;
    try {
      lab::read_topology_file(path);
      ADD_FAILURE() << "accepted: " << text;
    } catch (const lab::ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
    }
  };
  const std::string ok = "gpus_per_node = 8\n[intra]\nGBps = 100\n[network]\nnic_Gbps = 100\n";
  refused(ok + "nodez = 3\n", "nodez");
  refused("gpus_per_node = 8\nnodes = -1\n[intra]\nGBps = 100\n[network]\nnic_Gbps = 100\n", "nodes = -1");
  refused("gpus_per_node = 8\n[intra]\nGBps = \"fast\"\n[network]\nnic_Gbps = 100\n", "intra.GBps");
  refused("gpus_per_node = 8\n[network]\nnic_Gbps = 100\n", "GBps is missing");
  refused("gpus_per_node = 8\n[intra]\nGBps = 100\n[network]\nnic_Gbps = 100\noversubscription = 0.5\n",
          "oversubscription");
  refused("gpus_per_node = 8\n[intra]\nGBps = 100\nkind = \"infiniband\"\n[network]\nnic_Gbps = 100\n", "intra.kind");
  refused("gpus_per_node = [8\n", "bad.toml:1");
  EXPECT_THROW(lab::topology_from_arg("dgx-h9000"), lab::ConfigError);
}

// ---- the command's lists ----

TEST(SimulateCommand, ListsAndRangesAndTheirErrors) {
  EXPECT_EQ(lab::parse_int_list("1,2,4,...,512", "--nodes"),
            (std::vector<int>{1, 2, 4, 8, 16, 32, 64, 128, 256, 512}));
  EXPECT_EQ(lab::parse_int_list("3,9,...,81", "--nodes"), (std::vector<int>{3, 9, 27, 81}));
  EXPECT_EQ(lab::parse_int_list("5", "--nodes"), (std::vector<int>{5}));
  for (const char* bad : {"1,2,...", "...,4", "1,3,...,10", "2,4,...,12", "0", "x", "1,,2"}) {
    try {
      lab::parse_int_list(bad, "--nodes");
      ADD_FAILURE() << bad;
    } catch (const lab::ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("--nodes"), std::string::npos) << e.what();
    }
  }
  const auto sizes = lab::parse_size_list("1K..8G", 2, "--sizes");
  ASSERT_EQ(sizes.size(), 24u);
  EXPECT_EQ(sizes.front(), 1024u);
  EXPECT_EQ(sizes.back(), uint64_t{8} << 30);
  EXPECT_EQ(lab::parse_size_list("1M,6,16MiB", 2, "--sizes"), (std::vector<uint64_t>{1u << 20, 4, 16u << 20}));
  EXPECT_EQ(lab::parse_size_list("1K..1M", 4, "--sizes").size(), 6u);
  for (const char* bad : {"1Q", "..4K", "8G..1K", "", "K"})
    EXPECT_THROW(lab::parse_size_list(bad, 2, "--sizes"), lab::ConfigError) << bad;
  EXPECT_EQ(lab::size_text(uint64_t{8} << 30), "8 GiB");
  EXPECT_EQ(lab::size_text(1536), "1536 B");
  EXPECT_EQ(lab::size_text(3u << 20), "3 MiB");
}

TEST(SimulateCommand, ASweepTo4096RanksPrintsEveryRow) {
  lab::SimulateOptions o;
  o.nodes = "1,2,4,...,512";
  o.sizes = "1K..8G";
  o.step_factor = 8;
  o.algorithms = "ring,dbtree";
  testutil::TempDir dir;
  o.json_out = dir.path() + "/sim.json";
  std::FILE* f = std::tmpfile();
  o.out = f;
  EXPECT_EQ(lab::simulate(o, "dtlab"), 0);
  std::rewind(f);
  std::string text;
  char buf[4096];
  while (size_t k = std::fread(buf, 1, sizeof buf, f)) text.append(buf, k);
  std::fclose(f);
  EXPECT_NE(text.find("4096 ranks"), std::string::npos);
  EXPECT_NE(text.find("busbw(GB/s)"), std::string::npos);
  std::ifstream j(o.json_out);
  const auto js = nlohmann::json::parse(j);
  EXPECT_EQ(js["points"].size(), 10u * 8u * 2u);  // 10 node counts x 8 sizes (1 KiB x 8^k to 2 GiB) x 2 algorithms
  // the ring's latency grows linearly with N, the tree's with log N
  double ring_small_4096 = 0, tree_small_4096 = 0;
  for (const auto& p : js["points"])
    if (p["ranks"] == 4096 && p["bytes"] == 1024) {
      (p["algorithm"] == "ring" ? ring_small_4096 : tree_small_4096) = p["time_us"].get<double>();
    }
  EXPECT_GT(ring_small_4096, 20 * tree_small_4096);
}

// ---- the validation tables ----

TEST(SimulateValidation, PublishedMeasurementsHold) {
  for (const auto& r : lab::validate_published())
    EXPECT_TRUE(r.pass) << r.what << ": reference " << r.reference << ", simulated " << r.simulated << " (" << r.source << ")";
}

TEST(SimulateValidation, NcclModelAgrees) {
  for (const auto& r : lab::validate_nccl(nullptr))
    EXPECT_TRUE(r.pass) << r.what << ": " << r.simulated;
}

// (Serial*: run alone, tests/CMakeLists.txt)
TEST(SerialSimulateValidation, EmulatedRanksTakeThePredictedTime) {
  for (const auto& r : lab::validate_emulated(true))
    EXPECT_TRUE(r.pass) << r.what << ": emulated " << r.reference << " ms, simulated " << r.simulated << " ms; "
                        << r.note;
}

}  // namespace
