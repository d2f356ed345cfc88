// The Scale view's data (viz/data/scale_data.h): its charts are simulate_collective's numbers
// point for point, computed here or on the worker thread alike; the ring / dbtree crossover is the
// first size where ring's time is below dbtree's; an emulated run's link settings become the
// simulator's Topology as `dtlab simulate --validate emulated` builds it; the run's gradient
// allreduces are measured from the last rank's start to the last rank's end, and predicted with the
// wire protocol on that topology. A `dtlab simulate --json` result (a lesson's simulate run) sets
// up the view: its topology (a preset, or its own), collective, protocol, channels, algorithms, and
// the node count and size asked for, or of the run's the nearest the view's default.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <thread>

#include <nlohmann/json.hpp>

#include "collective_sim.h"
#include "errors.h"
#include "lesson.h"
#include "scale_data.h"
#include "test_util.h"
#include "topology.h"

namespace {

lab::SimResult direct(const std::string& preset, int nodes, lab::SimCollective c, lab::SimAlgorithm a,
                      lab::SimProtocol p, uint64_t bytes) {
  lab::Topology t = lab::topology_preset(preset);
  t.nodes = nodes;
  lab::SimOptions o;
  o.collective = c;
  o.algorithm = a;
  o.protocol = p;
  return lab::simulate_collective(t, o, bytes);
}

void expect_same(const lab::SimResult& a, const lab::SimResult& b, const std::string& what) {
  EXPECT_EQ(a.time_s, b.time_s) << what;
  EXPECT_EQ(a.latency_s, b.latency_s) << what;
  EXPECT_EQ(a.bandwidth_s, b.bandwidth_s) << what;
  EXPECT_EQ(a.contention_s, b.contention_s) << what;
  EXPECT_EQ(a.busbw, b.busbw) << what;
  EXPECT_EQ(a.algbw, b.algbw) << what;
}

lab::Event coll(int rank, uint64_t seq, double t0, double t1, uint64_t bytes, const char* what = "grad bucket",
                const char* op = "allreduce", const char* group = "") {
  lab::Event e;
  e.kind = lab::EventKind::Collective;
  e.op = op;
  e.what = what;
  e.group = group;
  e.rank = rank;
  e.op_seq = seq;
  e.train_step = static_cast<int64_t>(seq);
  e.bytes = bytes;
  e.t_start = t0;
  e.t_end = t1;
  return e;
}

}  // namespace

TEST(VizScale, TheAxesArePowersOfTwo) {
  const auto n = viz::scale_node_counts();
  ASSERT_EQ(n.size(), 10u);
  EXPECT_EQ(n.front(), 1);
  EXPECT_EQ(n.back(), 512);
  const auto s = viz::scale_sizes();
  ASSERT_EQ(s.size(), 24u);
  EXPECT_EQ(s.front(), 1024u);
  EXPECT_EQ(s.back(), uint64_t{8} << 30);
  EXPECT_EQ(viz::scale_size_text(1024), "1 KiB");
  EXPECT_EQ(viz::scale_size_text(uint64_t{64} << 20), "64 MiB");
  EXPECT_EQ(viz::scale_size_text(uint64_t{8} << 30), "8 GiB");
}

// Every point of the charts is simulate_collective's result for its topology, algorithm and size.
TEST(VizScale, ChartSeriesAreTheSimulatorsNumbers) {
  viz::ScaleSim sim(false);
  viz::ScaleSettings s;
  s.preset = "dgx-h100";
  s.nodes = 4;
  s.bytes = uint64_t{1} << 20;
  viz::ScaleCharts c = viz::scale_charts(s);
  EXPECT_EQ(c.missing, 4 * (10 + 24));
  EXPECT_EQ(sim.fill(c, true), 0);
  ASSERT_EQ(c.by_nodes.size(), 4u);
  ASSERT_EQ(c.by_size.size(), 4u);
  for (const viz::ScaleSeries& series : c.by_nodes) {
    ASSERT_TRUE(series.supported);
    ASSERT_EQ(series.points.size(), 10u);
    for (const viz::ScalePoint& p : series.points) {
      ASSERT_TRUE(p.ready);
      EXPECT_EQ(p.gpus, 8 * p.nodes);
      EXPECT_EQ(p.bytes, s.bytes);
      expect_same(p.r, direct("dgx-h100", p.nodes, s.collective, series.algo, s.protocol, p.bytes),
                  std::string(lab::sim_algorithm_name(series.algo)) + " on " + std::to_string(p.nodes) + " nodes");
    }
  }
  for (const viz::ScaleSeries& series : c.by_size)
    for (const viz::ScalePoint& p : series.points) {
      ASSERT_TRUE(p.ready);
      EXPECT_EQ(p.nodes, 4);
      expect_same(p.r, direct("dgx-h100", 4, s.collective, series.algo, s.protocol, p.bytes),
                  std::string(lab::sim_algorithm_name(series.algo)) + " at " + std::to_string(p.bytes));
    }
  // the same settings again: every point is kept
  const size_t kept = sim.kept();
  viz::ScaleCharts again = viz::scale_charts(s);
  EXPECT_EQ(sim.fill(again, false), 0);
  EXPECT_EQ(sim.kept(), kept);
}

// The worker thread computes the same numbers; the view asks every frame until none is missing.
TEST(VizScale, TheWorkerFillsTheChartsInTheBackground) {
  viz::ScaleSim sim(true);
  viz::ScaleSettings s;
  s.preset = "pcie-eth";
  s.protocol = lab::SimProtocol::Wire;
  s.collective = lab::SimCollective::ReduceScatter;
  s.nodes = 2;
  s.bytes = uint64_t{64} << 20;
  viz::ScaleCharts c = viz::scale_charts(s);
  // dbtree runs allreduce only: its series is marked, not computed
  const viz::ScaleSeries* tree = c.nodes_series(lab::SimAlgorithm::DbTree);
  ASSERT_NE(tree, nullptr);
  EXPECT_FALSE(tree->supported);
  EXPECT_NE(tree->why.find("allreduce"), std::string::npos) << tree->why;
  EXPECT_EQ(c.missing, 3 * (10 + 24));
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (sim.fill(c, false) > 0 && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ASSERT_EQ(c.missing, 0);
  for (const viz::ScaleSeries& series : c.by_nodes) {
    if (!series.supported) continue;
    for (const viz::ScalePoint& p : series.points)
      expect_same(p.r, direct("pcie-eth", p.nodes, s.collective, series.algo, s.protocol, p.bytes),
                  std::string(lab::sim_algorithm_name(series.algo)) + " on " + std::to_string(p.nodes) + " nodes");
  }
  // new settings replace the queue; destroying the simulator mid-way stops its worker
  s.nodes = 512;
  viz::ScaleCharts big = viz::scale_charts(s);
  sim.fill(big, false);
  EXPECT_GT(big.missing, 0);
}

// The crossover is the first size where ring's time is below dbtree's, and where dbtree wins again.
TEST(VizScale, CrossoverIsTheFirstSizeWhereRingBeatsTheTree) {
  viz::ScaleSim sim(false);
  for (int nodes : {1, 2, 16, 128})
    for (lab::SimProtocol p : {lab::SimProtocol::Simple, lab::SimProtocol::Wire}) {
      viz::ScaleSettings s;
      s.nodes = nodes;
      s.protocol = p;
      viz::ScaleCharts c = viz::scale_charts(s);
      EXPECT_FALSE(viz::ring_tree_crossover(c).known) << "nothing computed yet";
      sim.fill(c, true);
      const viz::ScaleCrossover x = viz::ring_tree_crossover(c);
      ASSERT_TRUE(x.known);
      int first = -1, back = -1;
      const auto sizes = viz::scale_sizes();
      for (size_t i = 0; i < sizes.size(); ++i) {
        const bool ring_faster =
            direct(s.preset, nodes, s.collective, lab::SimAlgorithm::Ring, p, sizes[i]).time_s <
            direct(s.preset, nodes, s.collective, lab::SimAlgorithm::DbTree, p, sizes[i]).time_s;
        if (first < 0 && ring_faster) first = static_cast<int>(i);
        else if (first >= 0 && back < 0 && !ring_faster) back = static_cast<int>(i);
      }
      const std::string what = std::to_string(nodes) + " nodes, " + lab::sim_protocol_name(p);
      EXPECT_EQ(x.index, first) << what;
      EXPECT_EQ(x.bytes, first >= 0 ? sizes[static_cast<size_t>(first)] : 0) << what;
      EXPECT_EQ(x.back, back) << what;
    }
  // NCCL's protocols on 2 DGX H100: the tree for small sizes, the ring from some size up
  viz::ScaleSettings s;
  s.nodes = 2;
  viz::ScaleCharts c = viz::scale_charts(s);
  sim.fill(c, true);
  const viz::ScaleCrossover x = viz::ring_tree_crossover(c);
  EXPECT_GT(x.index, 0);
  // no dbtree, no crossover
  s.collective = lab::SimCollective::Allgather;
  viz::ScaleCharts ag = viz::scale_charts(s);
  sim.fill(ag, true);
  EXPECT_FALSE(viz::ring_tree_crossover(ag).known);
}

TEST(VizScale, AnEmulatedRunsLinkIsATopology) {
  lab::RunConfig c;
  c.world_size = 4;
  lab::Topology t;
  std::string why;
  EXPECT_FALSE(viz::emulated_topology(c, t, &why));
  EXPECT_NE(why.find("no link model"), std::string::npos) << why;

  c.link_gbps = 1;
  c.link_latency_us = 50;
  ASSERT_TRUE(viz::emulated_topology(c, t));
  EXPECT_EQ(t.nodes, 1);
  EXPECT_EQ(t.gpus_per_node, 4);
  EXPECT_DOUBLE_EQ(t.intra_GBps, 1.0 / 8);
  EXPECT_DOUBLE_EQ(t.intra_latency_us, 50);
  EXPECT_NO_THROW(lab::validate_topology(t, "test"));

  c.world_size = 8;
  c.link_gpus_per_node = 4;
  c.link_nic_gbps = 0.5;
  c.link_nic_latency_us = 20;
  c.link_nics_per_node = 2;
  ASSERT_TRUE(viz::emulated_topology(c, t));
  EXPECT_EQ(t.nodes, 2);
  EXPECT_EQ(t.gpus_per_node, 4);
  EXPECT_EQ(t.nics_per_node, 2);
  EXPECT_DOUBLE_EQ(t.nic_Gbps, 0.5);
  EXPECT_DOUBLE_EQ(t.net_latency_us, 70);
  EXPECT_EQ(t.nodes_per_leaf, 0);
  EXPECT_NO_THROW(lab::validate_topology(t, "test"));

  // latency alone: no bandwidth limit
  lab::RunConfig l;
  l.world_size = 2;
  l.link_latency_us = 100;
  ASSERT_TRUE(viz::emulated_topology(l, t));
  EXPECT_GT(t.intra_GBps, 1e5);
  EXPECT_NO_THROW(lab::validate_topology(t, "test"));
}

// A collective's time is from the last rank's start to the last rank's end; only gradient buckets
// over the whole world that every rank recorded count.
TEST(VizScale, MeasuredAllreducesAreLastInToLastOut) {
  std::vector<std::vector<lab::Event>> ev(2);
  ev[0] = {coll(0, 3, 1.0, 1.5, 4000), coll(0, 4, 2.0, 2.2, 800), coll(0, 5, 3.0, 3.1, 4000, "bn stats"),
           coll(0, 6, 4.0, 4.1, 4000, "grad bucket", "broadcast"), coll(0, 7, 5.0, 5.3, 4000, "grad bucket", "allreduce", "dp"),
           coll(0, 8, 6.0, 6.4, 4000)};
  ev[1] = {coll(1, 3, 1.2, 1.45, 4000), coll(1, 4, 2.05, 2.25, 800), coll(1, 5, 3.0, 3.1, 4000, "bn stats"),
           coll(1, 6, 4.0, 4.1, 4000, "grad bucket", "broadcast"), coll(1, 7, 5.0, 5.3, 4000, "grad bucket", "allreduce", "dp")};
  const auto m = viz::measured_bucket_allreduces(ev, 2);
  ASSERT_EQ(m.size(), 2u) << "op 8 is on one rank only; 5, 6, 7 are no world gradient allreduces";
  EXPECT_EQ(m[0].op_seq, 3u);
  EXPECT_EQ(m[0].bytes, 4000u);
  EXPECT_DOUBLE_EQ(m[0].seconds, 1.5 - 1.2);
  EXPECT_EQ(m[1].op_seq, 4u);
  EXPECT_DOUBLE_EQ(m[1].seconds, 2.25 - 2.05);
}

// The run's points: one per bucket size, the median of its allreduces, and the simulator's wire
// prediction on the run's link (ring: ring; --allreduce tree: rhd).
TEST(VizScale, AnEmulatedRunsPointsAndTheirPrediction) {
  viz::RunData d;
  EXPECT_EQ(viz::emulated_run(d).why_not, "no run is open");
  d.phase = viz::RunPhase::Opened;
  d.cfg.world_size = 2;
  EXPECT_NE(viz::emulated_run(d).why_not.find("no link model"), std::string::npos);
  d.cfg.link_gbps = 1;
  d.cfg.link_latency_us = 50;
  EXPECT_NE(viz::emulated_run(d).why_not.find("gradient-bucket allreduce"), std::string::npos);
  d.events.resize(2);
  const double times[] = {0.030, 0.010, 0.020};
  for (int r = 0; r < 2; ++r)
    for (int i = 0; i < 3; ++i) {
      d.events[static_cast<size_t>(r)].push_back(coll(r, 10 + 2 * i, i, i + times[i], 1 << 20));
      d.events[static_cast<size_t>(r)].push_back(coll(r, 11 + 2 * i, i + 0.5, i + 0.5 + times[i] / 8, 1 << 17));
    }
  for (const char* algo : {"ring", "tree"}) {
    d.cfg.allreduce = algo;
    const viz::EmulatedRun er = viz::emulated_run(d);
    ASSERT_TRUE(er.why_not.empty()) << er.why_not;
    EXPECT_EQ(er.ranks, 2);
    ASSERT_EQ(er.points.size(), 2u);
    EXPECT_EQ(er.points[0].bytes, 1u << 17);
    EXPECT_EQ(er.points[1].bytes, 1u << 20);
    EXPECT_NEAR(er.points[1].median_s, 0.020, 1e-12);
    EXPECT_NEAR(er.points[0].median_s, 0.020 / 8, 1e-12);
    ASSERT_EQ(er.points[1].seconds.size(), 3u);
    EXPECT_NEAR(er.points[1].seconds.front(), 0.010, 1e-12);
    lab::Topology t;
    ASSERT_TRUE(viz::emulated_topology(d.cfg, t));
    lab::SimOptions o;
    o.protocol = lab::SimProtocol::Wire;
    o.algorithm = std::string(algo) == "ring" ? lab::SimAlgorithm::Ring : lab::SimAlgorithm::Rhd;
    EXPECT_EQ(er.algo, o.algorithm);
    for (const viz::EmulatedPoint& p : er.points)
      expect_same(p.predicted, lab::simulate_collective(t, o, p.bytes), algo);
  }
  d.cfg.allreduce = "naive";
  EXPECT_NE(viz::emulated_run(d).why_not.find("naive"), std::string::npos);
}

// ---- a simulate run sets up the view ----

// What the lessons' linter allows an observation's nodes and size to be is what the view draws.
TEST(VizScale, TheLessonFormatKnowsTheViewsRange) {
  EXPECT_EQ(lessons::kScaleViewMaxNodes, viz::kScaleMaxNodes);
  EXPECT_EQ(lessons::kScaleViewMinBytes, viz::kScaleMinBytes);
  EXPECT_EQ(lessons::kScaleViewMaxBytes, viz::kScaleMaxBytes);
}

// An observation's nodes and size are checked by `dtlab lesson check`: the scale view's alone, one
// of the run's node counts and sizes, and a power of two the view draws.
TEST(VizScale, AnObservationsNodesAndSizeAreChecked) {
  const std::string lesson = R"TOML(format_version = 1
id = "sim"
version = 1
title = "t"
minutes = 1
budget_s = 1

[question]
text = "q"

[[predict]]
id = "p"
kind = "choice"
prompt = "p"

[[predict.choices]]
key = "a"
text = "a"
correct_if = "bw > 0"

[[predict.choices]]
key = "b"
text = "b"
correct_if = "bw <= 0"

[runs.sweep]
command = "simulate"
args = "--topology dgx-h100 --nodes 2,128 --algorithm ring --sizes 1M..64M"

[quantities]
bw = { run = "sweep", result = "/points", where = { ranks = 16, bytes = 1048576 }, field = "busbw_GBps" }

[[observe]]
run = "sweep"
view = "scale"
NODES_AND_SIZE
say = "x"

[[check]]
id = "c"
that = "bw > 0"
why = "w"

[[hint]]
text = "h"

[explain]
text = "e"
)TOML";
  testutil::TempDir d;
  auto check = [&](const std::string& keys, const std::string& view = "scale") {
    std::string text = lesson;
    text.replace(text.find("NODES_AND_SIZE"), 14, keys);
    text.replace(text.find("view = \"scale\""), 14, "view = \"" + view + "\"");
    testutil::write_file(d.file("sim.toml"), text);
    return testutil::run_cli("lesson check " + d.file("sim.toml"));
  };
  auto r = check("nodes = 128\nsize = \"16M\"");
  EXPECT_EQ(r.exit_code, 0) << r.out;
  r = check("nodes = 2\nsize = 67108864");
  EXPECT_EQ(r.exit_code, 0) << r.out;
  r = check("nodes = 64");
  EXPECT_NE(r.out.find("sim.toml:36:1: [[observe]]: nodes = 64 is not among the node counts run 'sweep' simulates "
                       "(--nodes 2,128)"), std::string::npos) << r.out;
  r = check("size = \"128M\"");
  EXPECT_NE(r.out.find("size = 128 MiB is not among the sizes run 'sweep' simulates (--sizes 1M..64M)"), std::string::npos)
      << r.out;
  r = check("nodes = 3\nsize = \"3M\"");
  EXPECT_NE(r.out.find("nodes = 3: the scale view shows 1, 2, 4, ... 512 nodes"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("the scale view shows 1K, 2K, 4K, ... 8G"), std::string::npos) << r.out;
  r = check("size = \"1M..4M\"");
  EXPECT_NE(r.out.find("names 3 sizes (one size"), std::string::npos) << r.out;
  r = check("nodes = 2", "ring");
  EXPECT_NE(r.out.find("nodes chooses the node count the scale view shows; view 'ring' has none"), std::string::npos)
      << r.out;
  EXPECT_EQ(r.exit_code, 2) << r.out;
}

// A preset's run: the preset, its collective, protocol and algorithms; N and S asked for, or of the
// run's the nearest 128 nodes and 16 MiB; the view's charts then hold the run's own points.
TEST(VizScale, ASimulateRunOnAPresetSetsUpTheView) {
  testutil::TempDir d;
  std::filesystem::create_directories(d.file("gather"));
  const auto r = testutil::run_cli("simulate --topology dgx-h100 --nodes 2,8,128 --collective allgather --algorithm ring "
                                   "--protocol ll128 --sizes 4M..64M --json " + d.file("gather/result.json"));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  ASSERT_TRUE(viz::looks_like_simulate_result(d.file("gather")));
  ASSERT_TRUE(viz::looks_like_simulate_result(d.file("gather/result.json")));
  const viz::SimulateRun run = viz::load_simulate_result(d.file("gather"));
  EXPECT_EQ(run.preset, "dgx-h100");
  EXPECT_EQ(run.collective, lab::SimCollective::Allgather);
  EXPECT_EQ(run.protocol, lab::SimProtocol::LL128);
  EXPECT_EQ(run.channels, 0);
  EXPECT_EQ(run.algorithms, std::vector<lab::SimAlgorithm>{lab::SimAlgorithm::Ring});
  EXPECT_EQ(run.nodes, (std::vector<int>{2, 8, 128}));
  EXPECT_EQ(run.sizes, (std::vector<uint64_t>{4u << 20, 8u << 20, 16u << 20, 32u << 20, 64u << 20}));
  EXPECT_EQ(run.points, 15u);

  const viz::ScaleSetup u = viz::scale_setup(run);  // the defaults: 128 nodes, 16 MiB, both among the run's
  EXPECT_EQ(u.settings.preset, "dgx-h100");
  EXPECT_FALSE(u.settings.custom.has_value());
  EXPECT_EQ(u.settings.collective, lab::SimCollective::Allgather);
  EXPECT_EQ(u.settings.protocol, lab::SimProtocol::LL128);
  EXPECT_EQ(u.settings.nodes, 128);
  EXPECT_EQ(u.settings.bytes, 16u << 20);
  EXPECT_EQ(u.algorithms, run.algorithms);
  EXPECT_EQ(u.source, d.file("gather"));
  EXPECT_NE(u.line.find("the simulate run gather: allgather as ring on dgx-h100, protocol ll128"), std::string::npos)
      << u.line;
  EXPECT_TRUE(u.note.empty()) << u.note;
  const viz::ScaleSetup at = viz::scale_setup(run, 8, 64u << 20);
  EXPECT_EQ(at.settings.nodes, 8);
  EXPECT_EQ(at.settings.bytes, 64u << 20);

  // the charts at those settings: the run's points, number for number
  viz::ScaleCharts c = viz::scale_charts(at.settings);
  viz::ScaleSim sim(false);
  ASSERT_EQ(sim.fill(c, true), 0);
  const viz::ScaleSeries* ring_n = c.nodes_series(lab::SimAlgorithm::Ring);
  const viz::ScaleSeries* ring_s = c.size_series(lab::SimAlgorithm::Ring);
  ASSERT_TRUE(ring_n && ring_s);
  const auto j = nlohmann::json::parse(testutil::read_file(d.file("gather/result.json")));
  int matched = 0;
  for (const auto& p : j["points"]) {
    const int nodes = p["nodes"];
    const uint64_t bytes = p["bytes"];
    const double busbw = p["busbw_GBps"].get<double>() * 1e9, time = p["time_us"].get<double>() * 1e-6;
    for (const viz::ScaleSeries* sr : {ring_n, ring_s})
      for (const viz::ScalePoint& q : sr->points)
        if (q.nodes == nodes && q.bytes == bytes) {
          EXPECT_NEAR(q.r.busbw, busbw, busbw * 1e-9) << nodes << " nodes, " << bytes;
          EXPECT_NEAR(q.r.time_s, time, time * 1e-9) << nodes << " nodes, " << bytes;
          ++matched;
        }
  }
  EXPECT_EQ(matched, 3 + 5) << "64 MiB on 2, 8 and 128 nodes; 4 to 64 MiB on 8 nodes";

  // N and S the view cannot draw go to the nearest it can, and the note says so
  const viz::ScaleSetup odd = viz::scale_setup(run, 3000, 3u << 20);
  EXPECT_EQ(odd.settings.nodes, 512);
  EXPECT_EQ(odd.settings.bytes, 4u << 20);
  EXPECT_NE(odd.note.find("3000 nodes are shown as 512"), std::string::npos) << odd.note;
  EXPECT_NE(odd.note.find("shown as 4 MiB"), std::string::npos) << odd.note;
}

// A topology of the run's own (a file, GPUs per node changed, channels): the view draws that
// machine, not a preset, and simulates with the run's channels.
TEST(VizScale, ASimulateRunOnItsOwnTopologySetsUpTheView) {
  testutil::TempDir d;
  lab::Topology t = lab::topology_preset("hgx-a100");
  t.name = "my-cluster";
  t.about = "a test machine";
  t.nic_Gbps = 100;
  t.nics_per_node = 2;
  testutil::write_file(d.file("cluster.toml"), lab::topology_toml(t));
  const auto r = testutil::run_cli("simulate --topology " + d.file("cluster.toml") + " --gpus-per-node 4 --channels 2 "
                                   "--nodes 1,3,64 --collective allreduce --algorithm dbtree,ring --sizes 1M,1G --json " +
                                   d.file("own.json"));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const viz::SimulateRun run = viz::load_simulate_result(d.file("own.json"));
  EXPECT_TRUE(run.preset.empty());
  EXPECT_EQ(run.topo.name, "my-cluster");
  EXPECT_EQ(run.topo.gpus_per_node, 4);
  EXPECT_EQ(run.topo.nics_per_node, 2);
  EXPECT_EQ(run.topo.nic_Gbps, 100);
  EXPECT_EQ(run.channels, 2);
  EXPECT_EQ(run.algorithms, (std::vector<lab::SimAlgorithm>{lab::SimAlgorithm::DbTree, lab::SimAlgorithm::Ring}));
  const viz::ScaleSetup u = viz::scale_setup(run, 0, 0);
  ASSERT_TRUE(u.settings.custom.has_value());
  EXPECT_EQ(u.settings.preset, "my-cluster");
  EXPECT_EQ(u.settings.channels, 2);
  EXPECT_EQ(u.settings.nodes, 64);                 // of 1, 3 and 64, the nearest 128
  EXPECT_EQ(u.settings.bytes, uint64_t{1} << 20);  // of 1 MiB and 1 GiB, the nearest 16 MiB
  EXPECT_EQ(viz::scale_topology(u.settings, 16).gpus_per_node, 4);
  EXPECT_EQ(viz::scale_topology(u.settings, 16).nodes, 16);
  const viz::ScaleSetup three = viz::scale_setup(run, 3, 0);
  EXPECT_EQ(three.settings.nodes, 4);
  EXPECT_NE(three.note.find("3 nodes are shown as 4"), std::string::npos) << three.note;
  viz::ScaleSettings other = u.settings;
  other.custom->nics_per_node = 1;
  EXPECT_NE(other, u.settings) << "another machine is other settings";

  viz::ScaleCharts c = viz::scale_charts(u.settings);
  viz::ScaleSim sim(false);
  ASSERT_EQ(sim.fill(c, true), 0);
  const viz::ScaleSeries* tree = c.nodes_series(lab::SimAlgorithm::DbTree);
  ASSERT_TRUE(tree);
  const auto j = nlohmann::json::parse(testutil::read_file(d.file("own.json")));
  int matched = 0;
  for (const auto& p : j["points"])
    if (p["algorithm"] == "dbtree" && p["bytes"] == (uint64_t{1} << 20))
      for (const viz::ScalePoint& q : tree->points)
        if (q.nodes == p["nodes"].get<int>()) {
          EXPECT_EQ(q.gpus, 4 * q.nodes);
          EXPECT_NEAR(q.r.time_s, p["time_us"].get<double>() * 1e-6, q.r.time_s * 1e-9) << q.nodes;
          ++matched;
        }
  EXPECT_EQ(matched, 2) << "1 and 64 nodes (3 is no power of two)";
}

// The topology field as commands/simulate.cpp writes it (TOML text), and the two other forms a
// result may hold (a preset's name, an object of the same keys); anything else is refused naming
// the file and the field.
TEST(VizScale, SimulateResultsAreReadOrRefusedByField) {
  testutil::TempDir d;
  const std::string points = R"("points": [{"nodes": 2, "ranks": 16, "bytes": 1024, "algorithm": "ring"}])";
  auto write = [&](const std::string& name, const std::string& topology, const std::string& command = "simulate") {
    testutil::write_file(d.file(name), R"({"command": ")" + command + R"(", "topology": )" + topology +
                                           R"(, "collective": "allreduce", "protocol": "simple", "channels": 0, )" +
                                           points + "}");
    return d.file(name);
  };
  nlohmann::json toml_text = lab::topology_toml(lab::topology_preset("pcie-eth"));
  EXPECT_EQ(viz::load_simulate_result(write("toml.json", toml_text.dump())).preset, "pcie-eth");
  EXPECT_EQ(viz::load_simulate_result(write("name.json", R"("pcie-eth")")).preset, "pcie-eth");
  const viz::SimulateRun obj = viz::load_simulate_result(
      write("obj.json", R"({"name": "box", "gpus_per_node": 2, "intra": {"kind": "pcie", "GBps": 24, "latency_us": 1},
                            "network": {"nic_Gbps": 100, "latency_us": 10}})"));
  EXPECT_TRUE(obj.preset.empty());
  EXPECT_EQ(obj.topo.name, "box");
  EXPECT_EQ(obj.topo.gpus_per_node, 2);
  EXPECT_FALSE(obj.topo.nvlink);

  auto refused = [&](const std::string& file, const std::string& what) {
    try {
      viz::load_simulate_result(file);
      ADD_FAILURE() << file << " was read";
    } catch (const lab::Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  refused(write("bench.json", R"("dgx-h100")", "bench chain"), "bench.json: /command: \"bench chain\"");
  EXPECT_FALSE(viz::looks_like_simulate_result(d.file("bench.json")));
  refused(write("nogpus.json", R"({"name": "box", "intra": {"GBps": 24}, "network": {"nic_Gbps": 100}})"),
          "nogpus.json: /topology/gpus_per_node: missing");
  refused(write("typo.json", R"({"name": "box", "gpus_per_node": 2, "intra": {"GBps": 24, "lat": 1}, "network": {"nic_Gbps": 100}})"),
          "typo.json: /topology/intra/lat: unknown key");
  refused(write("nopreset.json", R"("dgx-z9000")"), "dgx-z9000");
  testutil::write_file(d.file("nopoints.json"), R"({"command": "simulate", "topology": "dgx-h100", "collective": "allreduce", "protocol": "simple"})");
  refused(d.file("nopoints.json"), "nopoints.json: /points: missing");
}
