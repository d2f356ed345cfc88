// Group collectives and training steps at scale (lab/sim/collective_sim.h's groups, lab/sim/step_sim.h,
// dtlab simulate --step): a group of every rank is the whole world, message for message; a
// tensor-parallel group inside a node never touches a NIC, a data-parallel group of one GPU per node
// does; a step's layers add up to dtlab's FLOPs and parameters; DDP's simulated bytes per rank are
// exactly what a real dtlab run's summary.json counts; tensor parallelism's bytes are dtlab's; the
// pipeline's bubble is (P-1)/(M+P-1); ZeRO moves DDP's bytes, FSDP 1.5 times them; a run's measured
// compute is read from its summary.json; the command prints a table per layout and the crossover
// last. LongSimulateStep (label long): the simulated communication of a step against a real run on
// the emulated link.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "collective_sim.h"
#include "errors.h"
#include "model.h"
#include "step_sim.h"
#include "test_util.h"
#include "topology.h"

namespace {

using lab::SimAlgorithm;
using lab::SimCollective;
using lab::SimProtocol;

// N ranks on one switch, as the emulated link model: every rank's link `GBps` each way, `latency_us`
// per message.
lab::Topology flat(int n, double GBps = 1.0, double latency_us = 10) {
  return lab::link_model_topology(n, lab::link_model_options(latency_us, GBps * 8));
}

lab::Topology preset(const std::string& name, int nodes) {
  lab::Topology t = lab::topology_preset(name);
  t.nodes = nodes;
  return t;
}

std::vector<int> range(int first, int count, int stride = 1) {
  std::vector<int> v;
  for (int i = 0; i < count; ++i) v.push_back(first + i * stride);
  return v;
}

bool same_schedule(const lab::SimSchedule& a, const lab::SimSchedule& b) {
  if (a.phases.size() != b.phases.size()) return false;
  for (size_t k = 0; k < a.phases.size(); ++k) {
    const lab::SimPhase &p = a.phases[k], &q = b.phases[k];
    if (p.pipelined != q.pipelined || p.repeat != q.repeat || p.intra_hops != q.intra_hops ||
        p.net_hops != q.net_hops || p.fill_bytes != q.fill_bytes || p.messages.size() != q.messages.size())
      return false;
    for (size_t i = 0; i < p.messages.size(); ++i) {
      const lab::SimMessage &m = p.messages[i], &n = q.messages[i];
      if (m.src != n.src || m.dst != n.dst || m.bytes != n.bytes || m.nic != n.nic) return false;
    }
  }
  return true;
}

lab::SimOptions opts(SimCollective c, SimAlgorithm a, SimProtocol p, bool exact = false, int channels = 0) {
  lab::SimOptions o;
  o.collective = c;
  o.algorithm = a;
  o.protocol = p;
  o.exact = exact;
  o.channels = channels;
  return o;
}

lab::StepConfig tflops_config(double tflops, SimProtocol p = SimProtocol::Simple) {
  lab::StepConfig c;
  c.compute.tflops = tflops;
  c.protocol = p;
  return c;
}

}  // namespace

// ---- group collectives ----

// The whole-world API is the group of every rank in order: the same messages, phase by phase, and
// the same times, for every algorithm, collective and protocol, on one switch and across nodes.
TEST(SimulateGroups, AGroupOfEveryRankIsTheWholeWorld) {
  int compared = 0;
  for (const lab::Topology& t : {flat(5), preset("dgx-h100", 2), preset("pcie-eth", 3), preset("hgx-a100", 4)}) {
    const std::vector<int> all = range(0, t.ranks());
    for (auto a : {SimAlgorithm::Ring, SimAlgorithm::Rhd, SimAlgorithm::DbTree, SimAlgorithm::Hier})
      for (auto c : {SimCollective::Allreduce, SimCollective::ReduceScatter, SimCollective::Allgather, SimCollective::Broadcast})
        for (auto p : {SimProtocol::Wire, SimProtocol::Simple, SimProtocol::LL})
          for (uint64_t bytes : {uint64_t{4096}, uint64_t{(1 << 20) + 12}, uint64_t{64} << 20}) {
            if (!lab::sim_supports(a, c, t.ranks())) continue;
            const lab::SimOptions o = opts(c, a, p, p == SimProtocol::Wire && bytes < (uint64_t{2} << 20));
            const std::string what = t.name + " " + lab::sim_algorithm_name(a) + " " + lab::sim_collective_name(c) + " " +
                                     lab::sim_protocol_name(p) + " " + std::to_string(bytes);
            EXPECT_TRUE(same_schedule(lab::sim_schedule(t, o, bytes), lab::sim_schedule_group(t, o, bytes, all))) << what;
            const lab::SimResult w = lab::simulate_collective(t, o, bytes);
            const lab::SimResult g = lab::simulate_group_collective(t, o, bytes, all);
            EXPECT_EQ(w.time_s, g.time_s) << what;
            EXPECT_EQ(w.latency_s, g.latency_s) << what;
            EXPECT_EQ(w.contention_s, g.contention_s) << what;
            EXPECT_EQ(w.busbw, g.busbw) << what;
            ++compared;
          }
  }
  // (algorithm, collective) pairs that run: 11 on 16 and 32 ranks, 9 on 5 and 24 (rhd's reduce-scatter
  // and allgather need a power of two); x 3 protocols x 3 sizes
  EXPECT_EQ(compared, (9 + 11 + 9 + 11) * 3 * 3);
}

// A tensor-parallel group of 8 inside one node of a 4-node DGX: no byte crosses a NIC, and it takes
// exactly what the same collective takes on a machine of that one node. The 4 nodes' groups at once
// share nothing: the same time again.
TEST(SimulateGroups, ATensorGroupInsideANodeNeverTouchesANic) {
  const lab::Topology t = preset("dgx-h100", 4), one = preset("dgx-h100", 1);
  const std::vector<int> node1 = range(8, 8);
  std::vector<std::vector<int>> every_node;
  for (int n = 0; n < 4; ++n) every_node.push_back(range(8 * n, 8));
  for (auto a : {SimAlgorithm::Ring, SimAlgorithm::DbTree, SimAlgorithm::Hier, SimAlgorithm::Rhd})
    for (auto p : {SimProtocol::Simple, SimProtocol::Wire})
      for (uint64_t bytes : {uint64_t{65536}, uint64_t{256} << 20}) {
        const lab::SimOptions o = opts(SimCollective::Allreduce, a, p);
        const std::string what = std::string(lab::sim_algorithm_name(a)) + " " + lab::sim_protocol_name(p);
        EXPECT_EQ(lab::sim_network_bytes(t, lab::sim_schedule_group(t, o, bytes, node1)), 0.0) << what;
        EXPECT_EQ(lab::sim_network_bytes(t, lab::sim_schedule_groups(t, o, bytes, every_node)), 0.0) << what;
        const double alone = lab::simulate_group_collective(t, o, bytes, node1).time_s;
        EXPECT_DOUBLE_EQ(alone, lab::simulate_collective(one, o, bytes).time_s) << what;
        EXPECT_DOUBLE_EQ(alone, lab::simulate_groups_collective(t, o, bytes, every_node).time_s) << what;
      }
}

// A data-parallel group of one GPU per node (rank 3 of each of 4 nodes, a stride of 8): every byte of
// its ring crosses the network, 2(n-1)/n of S from each member. Alone, its 16 channels spread over
// the node's 8 NICs; the 8 such groups of a tp 8 layout at once share them, and are slower. With one
// channel each group uses its own GPU's NIC (its rail): the 8 groups at once take what one takes.
TEST(SimulateGroups, ADataGroupOfOneGpuPerNodeUsesTheNics) {
  const lab::Topology t = preset("dgx-h100", 4);
  const uint64_t S = uint64_t{256} << 20;
  const std::vector<int> dp3 = range(3, 4, 8);
  std::vector<std::vector<int>> all_dp;
  for (int l = 0; l < 8; ++l) all_dp.push_back(range(l, 4, 8));
  const lab::SimOptions ring = opts(SimCollective::Allreduce, SimAlgorithm::Ring, SimProtocol::Simple);
  EXPECT_DOUBLE_EQ(lab::sim_network_bytes(t, lab::sim_schedule_group(t, ring, S, dp3)), 4 * 2.0 * 3 / 4 * S);
  const double alone = lab::simulate_group_collective(t, ring, S, dp3).time_s;
  const lab::SimResult together = lab::simulate_groups_collective(t, ring, S, all_dp);
  EXPECT_GT(together.time_s, 1.5 * alone);
  EXPECT_GT(together.contention_s, 0.0);
  const lab::SimOptions one_channel = opts(SimCollective::Allreduce, SimAlgorithm::Ring, SimProtocol::Simple, false, 1);
  EXPECT_DOUBLE_EQ(lab::simulate_group_collective(t, one_channel, S, dp3).time_s,
                   lab::simulate_groups_collective(t, one_channel, S, all_dp).time_s);
  // NCCL's model prices the group as a communicator of 4 nodes x 1 GPU: its busbw factor is 2(4-1)/4
  EXPECT_DOUBLE_EQ(together.busbw / together.algbw, 2.0 * 3 / 4);
  // the double binary tree over the members' nodes crosses the network too
  const lab::SimOptions tree = opts(SimCollective::Allreduce, SimAlgorithm::DbTree, SimProtocol::Simple);
  EXPECT_GT(lab::sim_network_bytes(t, lab::sim_schedule_group(t, tree, S, dp3)), 0.0);
}

// A group's exact wire schedule is the schedule of a world of its size with the ranks renamed:
// dtlab's ring over a process group sends what it sends over a world of that size.
TEST(SimulateGroups, AGroupsExactScheduleIsASmallerWorldRenamed) {
  const lab::Topology t = flat(7);
  const std::vector<int> members = {5, 1, 3};
  for (auto c : {SimCollective::Allreduce, SimCollective::Allgather, SimCollective::Broadcast})
    for (auto a : {SimAlgorithm::Ring, SimAlgorithm::Rhd}) {
      if (!lab::sim_supports(a, c, 3)) continue;
      const lab::SimOptions o = opts(c, a, SimProtocol::Wire, true);
      const lab::SimSchedule g = lab::sim_schedule_group(t, o, 3000 * 4 + 8, members);
      const lab::SimSchedule w = lab::sim_schedule(flat(3), o, 3000 * 4 + 8);
      ASSERT_EQ(g.phases.size(), w.phases.size());
      for (size_t k = 0; k < g.phases.size(); ++k) {
        ASSERT_EQ(g.phases[k].messages.size(), w.phases[k].messages.size());
        for (size_t i = 0; i < g.phases[k].messages.size(); ++i) {
          EXPECT_EQ(g.phases[k].messages[i].src, members[static_cast<size_t>(w.phases[k].messages[i].src)]);
          EXPECT_EQ(g.phases[k].messages[i].dst, members[static_cast<size_t>(w.phases[k].messages[i].dst)]);
          EXPECT_EQ(g.phases[k].messages[i].bytes, w.phases[k].messages[i].bytes);
        }
      }
    }
}

TEST(SimulateGroups, BadGroupsAreRefusedByName) {
  const lab::Topology t = preset("dgx-h100", 2);
  const lab::SimOptions ring = opts(SimCollective::Allreduce, SimAlgorithm::Ring, SimProtocol::Simple);
  EXPECT_THROW(lab::sim_schedule_group(t, ring, 1024, {0, 16}), lab::ConfigError);
  EXPECT_THROW(lab::sim_schedule_group(t, ring, 1024, {0, 1, 0}), lab::ConfigError);
  EXPECT_THROW(lab::sim_schedule_groups(t, ring, 1024, {{0, 1}, {1, 2}}), lab::ConfigError);
  try {
    lab::sim_schedule_group(t, opts(SimCollective::Allreduce, SimAlgorithm::DbTree, SimProtocol::Simple), 1024, {0, 1, 8});
    FAIL() << "dbtree over 2 + 1 members per node";
  } catch (const lab::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("as many on every node"), std::string::npos) << e.what();
  }
}

// ---- the step model ----

// dtlab's models, layer by layer, add up to Model::train_flops_per_sample and to their parameters
// (235,914 and 421,738); the buffers are BatchNorm's running statistics (num_batches_tracked: 8 bytes).
TEST(SimulateStep, DtlabsModelsAddUpToTheirFlopsAndParameters) {
  for (const std::string name : {"mlp", "cnn"}) {
    const lab::StepModel m = lab::step_model_dtlab(name);
    lab::ModelOptions mo;
    mo.name = name;
    auto model = lab::build_model(mo, 0);
    EXPECT_DOUBLE_EQ(m.flops_per_sample(), static_cast<double>(model->train_flops_per_sample({1, 28, 28}))) << name;
    double buffers = 0;
    for (const lab::StateEntry& e : model->state_dict())
      if (e.buffer) buffers += e.buffer->is_int64 ? 8 : 4.0 * static_cast<double>(e.buffer->value.numel());
    EXPECT_EQ(m.buffer_bytes, buffers) << name;
  }
  EXPECT_EQ(lab::step_model_dtlab("mlp").parameters(), 235914);
  EXPECT_EQ(lab::step_model_dtlab("cnn").parameters(), 421738);
  EXPECT_THROW(lab::step_model_dtlab("resnet"), lab::ConfigError);
  lab::GenericModelSpec g;
  g.parameters = 7e9;
  g.flops_per_sample = 8.6e13;
  g.layers = 32;
  g.activation_bytes = 16.8e6;
  const lab::StepModel gm = lab::step_model_generic(g);
  EXPECT_NEAR(static_cast<double>(gm.parameters()), 7e9, 128);
  EXPECT_DOUBLE_EQ(gm.flops_per_sample(), 8.6e13);
  g.layers = 0;
  EXPECT_THROW(lab::step_model_generic(g), lab::ConfigError);
}

// DDP's simulated bytes per rank per step are exactly what a real dtlab run counts in summary.json's
// traffic.sent_per_rank: its first iteration's one bucket, then the rebuilt buckets, dtlab's ring
// with its uneven chunks, and the buffers' broadcast before every forward. The total is
// 2 (N - 1) x the parameters' bytes + (N - 1) x the buffers' per step, as bench layouts asserts.
TEST(SimulateStep, DdpBytesPerRankAreARealRunsSummary) {
  DTLAB_REQUIRE_DATASET();
  for (const std::string model : {"mlp", "cnn"})
    for (int n : {3, 4}) {
      testutil::TempDir d;
      const int steps = 3;
      const auto run = testutil::run_cli("run --model " + model + " --world-size " + std::to_string(n) +
                                         " --batch-size 8 --limit-train 256 --limit-test 32 --steps " +
                                         std::to_string(steps) + " --threads 1 --out " + d.file("run"));
      ASSERT_EQ(run.exit_code, 0) << run.out;
      const auto summary = nlohmann::json::parse(testutil::read_file(d.file("run/summary.json")));
      const auto sent = summary.at("traffic").at("sent_per_rank");
      ASSERT_EQ(static_cast<int>(sent.size()), n);

      const lab::StepModel m = lab::step_model_dtlab(model);
      lab::StepConfig c = tflops_config(1, SimProtocol::Wire);
      c.exact = true;
      c.global_batch = 8 * n;
      const lab::Topology t = flat(n);
      c.first_iteration = true;
      const lab::StepResult first = lab::simulate_step(t, m, c, {n, 1, 1});
      c.first_iteration = false;
      const lab::StepResult later = lab::simulate_step(t, m, c, {n, 1, 1});
      ASSERT_EQ(first.refused, "");
      double total = 0;
      for (int r = 0; r < n; ++r) {
        const double simulated = first.sent_per_rank[static_cast<size_t>(r)] + (steps - 1) * later.sent_per_rank[static_cast<size_t>(r)];
        EXPECT_EQ(simulated, sent[static_cast<size_t>(r)].get<double>()) << model << " N=" << n << " rank " << r;
        total += later.sent_per_rank[static_cast<size_t>(r)];
      }
      EXPECT_DOUBLE_EQ(total, 2.0 * (n - 1) * 4 * static_cast<double>(m.parameters()) + (n - 1) * m.buffer_bytes);
      EXPECT_EQ(later.dp.algorithms, "ring");
    }
}

// Tensor parallelism's allreduces are dtlab's (tensor_parallel.h's plan): the mlp over 4 ranks on a
// batch of 32 runs g's allreduce of fc2's output (32 x 128 floats) in forward and none in backward
// (fc1's input is data): 2 (4 - 1) x its bytes over every rank, bench layouts' figure from a real
// run. The cnn has f's backward allreduce before fc1 as well; a --tp the cnn's 32 channels refuse is
// refused in the plan's words.
TEST(SimulateStep, TensorParallelBytesAreDtlabsPlan) {
  const lab::StepModel mlp = lab::step_model_dtlab("mlp");
  lab::StepConfig c = tflops_config(1, SimProtocol::Wire);
  c.exact = true;
  c.global_batch = 32;
  const lab::StepResult r = lab::simulate_step(flat(4), mlp, c, {1, 1, 4});
  ASSERT_EQ(r.refused, "");
  double tp_total = 0;
  for (double b : r.sent_per_rank) tp_total += b;
  EXPECT_DOUBLE_EQ(tp_total, 2.0 * 3 * 32 * 128 * 4);
  EXPECT_EQ(r.tp.collectives, 1);
  EXPECT_EQ(r.mode, "tensor");
  const lab::StepResult cnn = lab::simulate_step(flat(2), lab::step_model_dtlab("cnn"), c, {1, 1, 2});
  EXPECT_EQ(cnn.tp.collectives, 3);  // g after conv2 and fc2, f before fc1
  lab::Topology t64 = preset("dgx-h100", 8);
  const lab::StepResult refused = lab::simulate_step(t64, lab::step_model_dtlab("cnn"), c, {1, 1, 64});
  EXPECT_NE(refused.refused.find("--tp"), std::string::npos) << refused.refused;
  const lab::StepResult stages = lab::simulate_step(flat(4), mlp, c, {1, 4, 1});
  EXPECT_NE(stages.refused.find("3 layers with matrix products"), std::string::npos) << stages.refused;
  const lab::StepResult batch = lab::simulate_step(flat(3), mlp, c, {3, 1, 1});
  EXPECT_EQ(batch.refused, "--global-batch 32 is not a multiple of 3 data-parallel replicas");
}

// The pipeline's bubble, with equal stages and nothing to send: (P - 1) / (M + P - 1) of the step,
// for 1F1B and GPipe alike, and the step is compute + bubble.
TEST(SimulateStep, ThePipelineBubbleIsTheFormula) {
  lab::GenericModelSpec g;
  g.parameters = 8e6;
  g.flops_per_sample = 3e9;
  g.layers = 8;
  g.activation_bytes = 0;
  const lab::StepModel m = lab::step_model_generic(g);
  for (const std::string schedule : {"1f1b", "gpipe"})
    for (int P : {2, 4, 8})
      for (int M : {1, 4, 8, 32}) {
        lab::StepConfig c = tflops_config(1, SimProtocol::Wire);
        c.global_batch = 64;
        c.microbatches = M;
        c.schedule = schedule;
        const lab::StepResult r = lab::simulate_step(flat(P, 1.0, 0), m, c, {1, P, 1});
        ASSERT_EQ(r.refused, "");
        EXPECT_EQ(r.microbatches, M);
        EXPECT_NEAR(r.bubble_s / (r.compute_s + r.bubble_s), (P - 1.0) / (M + P - 1.0), 1e-12) << P << " " << M;
        EXPECT_NEAR(r.bubble_s / (r.compute_s + r.bubble_s), lab::step_bubble_fraction(P, M), 1e-12);
        EXPECT_NEAR(r.step_s, r.compute_s + r.bubble_s, 1e-12 * r.step_s);
        EXPECT_NEAR(r.compute_s, 64.0 * 3e9 / P / 1e12, 1e-15);
      }
  // with activations to send, every micro-batch's forward and backward pay their send: the step grows
  g.activation_bytes = 1e6;
  lab::StepConfig c = tflops_config(1, SimProtocol::Wire);
  c.global_batch = 64;
  c.microbatches = 8;
  const lab::StepResult r = lab::simulate_step(flat(4), lab::step_model_generic(g), c, {1, 4, 1});
  const double send = 8e6 / 1e9;  // a micro-batch of 8 samples x 1 MB over 1 GB/s
  EXPECT_NEAR(r.pp.seconds, 2 * 8 * (send + 10e-6), 1e-9);  // a middle stage: 8 sends each way
  EXPECT_GT(r.exposed_s, 2 * 3 * send);                     // at least the fill and the drain
  EXPECT_DOUBLE_EQ(r.pp.bytes, 2 * 8 * 8e6);
}

// DDP's buckets overlap the backward: with a long backward only the last bucket (the first layer's
// gradients, ready when backward ends) is exposed; --no-overlap exposes every bucket.
TEST(SimulateStep, DdpOverlapExposesOnlyWhatIsLeftAfterBackward) {
  lab::GenericModelSpec g;
  g.parameters = 4 * 8 * 2.5e6;  // 8 layers of 4 tensors of 10 MB: a bucket of 3 tensors (25 MiB) ...
  g.flops_per_sample = 1e12;
  g.layers = 8;
  const lab::StepModel m = lab::step_model_generic(g);
  lab::StepConfig c = tflops_config(1, SimProtocol::Wire);
  c.global_batch = 64;
  const lab::Topology t = flat(4, 10.0, 10);
  const lab::StepResult on = lab::simulate_step(t, m, c, {4, 1, 1});
  c.overlap = false;
  const lab::StepResult off = lab::simulate_step(t, m, c, {4, 1, 1});
  EXPECT_EQ(on.dp.seconds, off.dp.seconds);
  EXPECT_NEAR(off.exposed_s, off.dp.seconds, 1e-12);
  EXPECT_LT(on.exposed_s, off.exposed_s / 4);
  EXPECT_GT(on.exposed_s, 0.0);
  EXPECT_DOUBLE_EQ(on.compute_s, 16 * 1e12 / 1e12);  // 16 samples per replica x 1 TFLOP at 1 TFLOP/s
}

// ZeRO-2 moves DDP's bytes (reduce-scatter + all-gather = allreduce); FSDP FULL_SHARD 1.5 times
// them (the parameters gathered again for backward): 3 (N-1)/N against 2 (N-1)/N.
TEST(SimulateStep, ZeroMovesDdpsBytesAndFsdpOneAndAHalfTimes) {
  lab::GenericModelSpec g;
  g.parameters = 1e9;
  g.flops_per_sample = 6e12;
  g.layers = 16;
  const lab::StepModel m = lab::step_model_generic(g);
  const lab::Topology t = preset("dgx-h100", 4);
  lab::StepConfig c = tflops_config(400);
  c.global_batch = 256;
  c.algorithms = {SimAlgorithm::Ring};
  const lab::StepResult ddp = lab::simulate_step(t, m, c, {32, 1, 1});
  c.sync = lab::DpSync::Zero;
  const lab::StepResult zero = lab::simulate_step(t, m, c, {32, 1, 1});
  c.sync = lab::DpSync::Fsdp;
  const lab::StepResult fsdp = lab::simulate_step(t, m, c, {32, 1, 1});
  EXPECT_NEAR(zero.dp.bytes / ddp.dp.bytes, 1.0, 1e-6);
  EXPECT_NEAR(fsdp.dp.bytes / ddp.dp.bytes, 1.5, 1e-6);
  EXPECT_NEAR(ddp.dp.bytes, 2.0 * 31 / 32 * 4 * static_cast<double>(m.parameters()), 1e-3 * ddp.dp.bytes);
  EXPECT_EQ(zero.mode, "zero");
  EXPECT_EQ(fsdp.mode, "fsdp");
  EXPECT_EQ(fsdp.dp.collectives, 3 * 16);  // per unit: all-gather, all-gather again, reduce-scatter
  EXPECT_EQ(ddp.dp.collectives, 64);       // a bucket per tensor: each is over 25 MiB
  c.sync = lab::DpSync::Fsdp;
  EXPECT_NE(lab::simulate_step(t, m, c, {8, 4, 1}).refused, "");  // fsdp with a pipeline: not modelled
}

// --compute-from: a run's summary.json, its fields named in what the step prints.
TEST(SimulateStep, ComputeFromARunReadsItsSummary) {
  testutil::TempDir d;
  {
    std::ofstream f(d.file("summary.json"));
    f << R"({"mode": "ddp", "model": {"name": "cnn"}, "device": {"device": "cpu"}, "samples": 640, "steps": 10,
             "compute": {"forward_seconds": 0.32, "backward_seconds": 0.64, "optimizer_seconds": 0.05,
                         "per_rank": [{}, {}]}})";
  }
  const lab::StepCompute c = lab::step_compute_from_run(d.path());
  EXPECT_DOUBLE_EQ(c.fwd_s_per_sample, 0.32 / 320);
  EXPECT_DOUBLE_EQ(c.bwd_s_per_sample, 0.64 / 320);
  EXPECT_DOUBLE_EQ(c.optimizer_s_per_step, 0.005);
  EXPECT_EQ(c.run_model, "cnn");
  EXPECT_EQ(c.run_world_size, 2);
  EXPECT_EQ(c.run_batch_per_rank, 32);
  EXPECT_NE(c.source.find("compute.forward_seconds"), std::string::npos) << c.source;
  // the measured seconds become the step's compute: 32 samples per rank, and the optimizer
  lab::StepConfig sc;
  sc.compute = c;
  sc.global_batch = 64;
  const lab::StepResult r = lab::simulate_step(flat(2), lab::step_model_dtlab("cnn"), sc, {2, 1, 1});
  EXPECT_NEAR(r.compute_s, 32 * (0.32 + 0.64) / 320, 1e-12);
  EXPECT_NEAR(r.optimizer_s, 0.005, 1e-12);
  EXPECT_THROW(lab::step_compute_from_run(d.file("nowhere")), lab::IoError);
  {
    std::ofstream f(d.file("summary.json"));
    f << R"({"mode": "pipeline", "samples": 64, "steps": 1, "compute": {"forward_seconds": 1, "backward_seconds": 1,
             "optimizer_seconds": 0, "per_rank": [{}]}})";
  }
  EXPECT_THROW(lab::step_compute_from_run(d.path()), lab::ConfigError);
}

// Every layout of N: the factorizations dp x pp x tp.
TEST(SimulateStep, AllLayoutsAreTheFactorizations) {
  const auto v = lab::all_layouts(8);
  EXPECT_EQ(v.size(), 10u);
  for (const auto& l : v) EXPECT_EQ(l.size(), 8);
  EXPECT_EQ(lab::layout_text(v.front()), "8 x 1 x 1");
}

// The command: a table per layout, the crossover last, the same figures in --json.
TEST(SimulateStep, TheCommandPrintsATablePerLayoutAndTheCrossoverLast) {
  testutil::TempDir d;
  const auto r = testutil::run_cli("simulate --step --model cnn --gpu-tflops 100 --nodes 1,2,4 --json " + d.file("s.json"));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("# layout dp x 1 x 1 (ddp)"), std::string::npos) << r.out;
  const std::string last = r.out.substr(r.out.rfind("communication overtakes compute"));
  EXPECT_EQ(last.find('\n'), last.size() - 1) << "the crossover must be the last line:\n" << r.out;
  const auto j = nlohmann::json::parse(testutil::read_file(d.file("s.json")));
  ASSERT_EQ(j.at("layouts").size(), 1u);
  const auto& lay = j.at("layouts")[0];
  ASSERT_EQ(lay.at("points").size(), 3u);
  int first = 0;
  for (const auto& p : lay.at("points"))
    if (!first && p.at("exposed_exceeds_compute").get<bool>()) first = p.at("ranks").get<int>();
  if (first) {
    EXPECT_EQ(lay.at("overtakes_at_ranks").get<int>(), first);
    EXPECT_NE(last.find("at N = " + std::to_string(first)), std::string::npos) << last;
  } else {
    EXPECT_TRUE(lay.at("overtakes_at_ranks").is_null());
  }
  // every layout of each N, and a generic model
  const auto all = testutil::run_cli("simulate --step --params 1e9 --flops-per-sample 6e12 --layers 8 "
                                     "--activation-bytes 4e6 --grad-bytes 2 --global-batch 256 --layouts all "
                                     "--gpu-tflops 300 --nodes 1,2");
  ASSERT_EQ(all.exit_code, 0) << all.out;
  for (const char* l : {"# layout dp x 1 x 1 (ddp)", "# layout dp x 1 x 8 (tensor)", "# layout dp x 2 x 4 (pipeline)",
                        "# layout dp x 16 x 1 (pipeline)"})
    EXPECT_NE(all.out.find(l), std::string::npos) << l << "\n" << all.out;
  // no compute: refused, naming the flags
  const auto none = testutil::run_cli("simulate --step --model mlp");
  EXPECT_EQ(none.exit_code, 2) << none.out;
  EXPECT_NE(none.out.find("--gpu-tflops"), std::string::npos) << none.out;
  const auto stray = testutil::run_cli("simulate --gpu-tflops 10");  // a --step flag without --step
  EXPECT_EQ(stray.exit_code, 2) << stray.out;
  EXPECT_NE(stray.out.find("add --step"), std::string::npos) << stray.out;
  const auto pipe = testutil::run_cli("simulate --step --model mlp --mode pipeline --gpu-tflops 10");
  EXPECT_EQ(pipe.exit_code, 2) << pipe.out;
  EXPECT_NE(pipe.out.find("--pp"), std::string::npos) << pipe.out;
}

// Label long: the simulated communication of a DDP step on the emulated link (0.25 Gbit/s, 50 us per
// message, 4 ranks on one switch: the wire protocol on a flat topology) against a real dtlab run on
// that link, --no-overlap so that the collectives run after the backward. Measured from the run's
// trace.json: per step, each collective's shortest duration over the ranks (the last rank to arrive
// waits least), added up; the best step of 8 (the link model cannot run faster than its link, and a
// busy machine only slows it). At most 10% faster and 60% slower than simulated: within 2% on an idle
// machine, up to 45% slower with two busy loops on its two cores. The bytes are exact
// (DdpBytesPerRankAreARealRunsSummary).
TEST(LongSimulateStep, DdpCommunicationOnTheEmulatedLinkIsARealRuns) {
  DTLAB_REQUIRE_DATASET();
  const int n = 4, steps = 8;
  testutil::TempDir d;
  const auto run = testutil::run_cli("run --model mlp --world-size 4 --batch-size 16 --limit-train 1024 --limit-test 32 "
                                     "--steps " + std::to_string(steps) + " --threads 1 --no-overlap --link-gbps 0.25 "
                                     "--link-latency-us 50 --out " + d.file("run"));
  ASSERT_EQ(run.exit_code, 0) << run.out;
  const auto trace = nlohmann::json::parse(testutil::read_file(d.file("run/trace.json")));
  std::map<std::pair<int64_t, int64_t>, double> shortest;  // (step, op_seq) -> the shortest over ranks (s)
  for (const auto& e : trace.at("traceEvents")) {
    if (e.value("cat", std::string()) != "collective") continue;
    const int64_t step = e.at("args").at("step").get<int64_t>();
    if (step < 0) continue;
    const auto key = std::make_pair(step, e.at("args").at("op_seq").get<int64_t>());
    const double dur = e.at("dur").get<double>() * 1e-6;
    auto it = shortest.find(key);
    if (it == shortest.end() || dur < it->second) shortest[key] = dur;
  }
  std::map<int64_t, double> per_step;
  for (const auto& [key, dur] : shortest) per_step[key.first] += dur;
  ASSERT_EQ(per_step.size(), static_cast<size_t>(steps));
  double measured = 1e300;
  for (const auto& [step, secs] : per_step) measured = std::min(measured, secs);
  lab::StepConfig c = tflops_config(1, SimProtocol::Wire);
  c.global_batch = 16 * n;
  c.overlap = false;
  const lab::StepResult r = lab::simulate_step(flat(n, 0.25 / 8, 50), lab::step_model_dtlab("mlp"), c, {n, 1, 1});
  EXPECT_EQ(r.dp.collectives, 2);  // the buffers' broadcast and the one bucket's allreduce
  std::printf("DDP step's communication on the emulated link: simulated %.3f ms, measured %.3f ms\n",
              r.dp.seconds * 1e3, measured * 1e3);
  // the run may be slower (a busy machine wakes the link's sleepers late), hardly faster
  EXPECT_GE(measured, 0.9 * r.dp.seconds) << "simulated " << r.dp.seconds * 1e3 << " ms, measured " << measured * 1e3;
  EXPECT_LE(measured, 1.6 * r.dp.seconds) << "simulated " << r.dp.seconds * 1e3 << " ms, measured " << measured * 1e3;
}
