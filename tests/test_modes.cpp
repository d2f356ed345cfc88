// Parallelism modes of `dtlab run` against PyTorch 1.13:
//   DataParallel  torch.chunk sizes, the seeded DataLoader's order, training steps against the
//                 explicit emulation of tools/fixtures/gen_dp.py, the batch-of-one error on a
//                 short chunk, device 0's share of the traffic (exact byte counts);
//   local SGD     PeriodicModelAverager with the post-localSGD hook (gen_ddp_modes.py, gloo):
//                 losses, drift at each averaging, final models; drift > 0 between averagings and
//                 bitwise equal replicas right after one;
//   no_sync       gradient accumulation cycles (gen_ddp_modes.py, gloo);
//   join          uneven inputs with DDP's join (gen_ddp_modes.py, gloo), and without join the
//                 timeout that names who waited where and who had finished.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>

#include "backends.h"
#include "data_parallel.h"
#include "errors.h"
#include "run.h"
#include "test_util.h"
#include "torch_compare.h"

namespace {

using torchcmp::Compare;

// Losses of metrics.jsonl against a fixture rank's losses, and the rank's final state.
void compare_rank(lab::Run& run, const std::vector<nlohmann::json>& steps, const nlohmann::json& want, int rank,
                  Compare& cmp) {
  const auto& wl = want["losses"];
  ASSERT_EQ(steps.size(), wl.size()) << "rank " << rank;
  for (size_t s = 0; s < wl.size(); ++s)
    cmp.check("rank " + std::to_string(rank) + " loss step " + std::to_string(s), steps[s]["loss"].get<double>(),
              wl[s].get<double>(), 1e-5, 1e-4);
  torchcmp::compare_state(run.replica(rank), want["state"], cmp, "rank " + std::to_string(rank));
}

uint64_t state_bytes(lab::Model& m) {
  uint64_t b = 0;
  for (const auto& e : m.state_dict())
    b += e.param ? e.param->value.data.size() * 4 : e.buffer->is_int64 ? 8 : e.buffer->value.data.size() * 4;
  return b;
}

uint64_t param_bytes(lab::Model& m) {
  uint64_t b = 0;
  for (const lab::Param* p : m.params()) b += p->value.data.size() * 4;
  return b;
}

}  // namespace

// ---- DataParallel ----

TEST(DataParallel, ChunkSizesAreTorchChunks) {
  const auto fx = testutil::load_fixture("dp.json");
  int checked = 0;
  for (const auto& c : fx["chunk_sizes"]) {
    const auto want = c["sizes"].get<std::vector<int64_t>>();
    EXPECT_EQ(lab::torch_chunk_sizes(c["batch"].get<int64_t>(), c["devices"].get<int>()), want)
        << "B=" << c["batch"] << " k=" << c["devices"];
    ++checked;
  }
  EXPECT_EQ(checked, 41 * 8);
  EXPECT_EQ(lab::torch_chunk_sizes(10, 4), (std::vector<int64_t>{3, 3, 3, 1}));
  EXPECT_EQ(lab::torch_chunk_sizes(6, 4), (std::vector<int64_t>{2, 2, 2}));  // device 3 idles
}

TEST(DataParallel, LoaderOrderIsTheSeededDataLoaders) {
  const auto fx = testutil::load_fixture("dp.json");
  for (const auto& c : fx["loader"]) {
    lab::SingleProcessLoader loader(c["length"], c["batch"], c["shuffle"], c["drop_last"], c["seed"]);
    for (size_t e = 0; e < c["epochs"].size(); ++e)
      EXPECT_EQ(loader.next_epoch(), c["epochs"][e].get<std::vector<std::vector<int64_t>>>())
          << "L=" << c["length"] << " B=" << c["batch"] << " epoch " << e;
  }
}

// One test per fixture case (each a second or so); the names are the generators' case names.
class DataParallelCase : public ::testing::TestWithParam<const char*> {};
class LocalSgdCase : public ::testing::TestWithParam<const char*> {};
class NoSyncCase : public ::testing::TestWithParam<const char*> {};
class JoinCase : public ::testing::TestWithParam<const char*> {};
std::string case_name(const ::testing::TestParamInfo<const char*>& info) { return info.param; }

// Losses over the global batch, and the module's final parameters and buffers (replica 0's
// BatchNorm updates only) against PyTorch's DataParallel steps done explicitly.
TEST_P(DataParallelCase, TrainingMatchesPyTorch) {
  DTLAB_REQUIRE_DATASET();
  const auto fx = testutil::load_fixture("dp.json");
  {
    const auto& c = fx["cases"][GetParam()];
    testutil::TempDir tmp;
    lab::RunConfig cfg = torchcmp::config_for(fx, c, tmp.path());
    cfg.mode = "dp";
    lab::Run run(cfg, lab::make_world);
    run.run();
    const auto steps = torchcmp::read_steps(tmp.file("metrics.jsonl"), cfg.world_size);
    Compare cmp;
    ASSERT_EQ(steps[0].size(), c["losses"].size());
    for (size_t s = 0; s < steps[0].size(); ++s) {
      cmp.check("loss step " + std::to_string(s), steps[0][s]["loss"].get<double>(), c["losses"][s].get<double>(),
                1e-5, 1e-4);
      EXPECT_EQ(steps[0][s]["chunks"], c["chunks"][s]) << "step " << s;
      int64_t global = 0;
      for (const auto& n : c["chunks"][s]) global += n.get<int64_t>();
      EXPECT_EQ(steps[0][s]["batch_size"].get<int64_t>(), global);
      for (int d = 1; d < cfg.world_size; ++d) {  // the other devices: their chunk, no loss
        const auto& chunks = c["chunks"][s];
        const int64_t want = static_cast<size_t>(d) < chunks.size() ? chunks[static_cast<size_t>(d)].get<int64_t>() : 0;
        EXPECT_EQ(steps[static_cast<size_t>(d)][s]["batch_size"].get<int64_t>(), want) << "device " << d;
        EXPECT_TRUE(steps[static_cast<size_t>(d)][s]["loss"].is_null());
      }
    }
    torchcmp::compare_state(run.replica(0), c["state"], cmp, "device 0");
    EXPECT_TRUE(cmp.ok());
  }
}
INSTANTIATE_TEST_SUITE_P(DataParallel, DataParallelCase, ::testing::Values("mlp_k4_b30", "cnn_k4_b6", "cnn_k3_b16"),
                         case_name);

// B = 10 on 4 devices: chunks 3, 3, 3, 1; replica 3 raises PyTorch's error and the hint names it.
TEST(DataParallel, AChunkOfOneRaisesOnThatReplica) {
  DTLAB_REQUIRE_DATASET();
  lab::RunConfig cfg;
  cfg.mode = "dp";
  cfg.model = "mlp";
  cfg.world_size = 4;
  cfg.batch_size = 10;
  cfg.limit_train = 40;
  cfg.limit_test = 20;
  cfg.steps = 2;
  cfg.epochs = 0;  // --steps alone: as many epochs as it takes
  cfg.threads = 1;
  cfg.timeout_s = 10;
  try {
    lab::Run(cfg, lab::make_world).run();
    FAIL() << "expected the batch-of-one error";
  } catch (const lab::TrainingError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("Expected more than 1 value per channel when training, got input size torch.Size([1, 256])"),
              std::string::npos)
        << msg;
    EXPECT_EQ(msg.rfind("rank 3 failed", 0), 0u) << msg;
    EXPECT_NE(e.hint().find("in replica 3 on device 3"), std::string::npos) << e.hint();
    EXPECT_NE(e.hint().find("3, 3, 3, 1"), std::string::npos) << e.hint();
  }
  cfg.batch_size = 9;  // 3, 3, 3: device 3 idles, no error
  EXPECT_EQ(lab::Run(cfg, lab::make_world).run().steps, 2);
}

// Every message starts or ends at device 0; the bytes are exactly DataParallel's per iteration:
// inputs and output gradients to the others, replicas (parameters and buffers) to each working
// device, their outputs and gradients back.
TEST(DataParallel, DeviceZeroCarriesEveryByte) {
  DTLAB_REQUIRE_DATASET();
  testutil::TempDir tmp;
  lab::RunConfig cfg;
  cfg.mode = "dp";
  cfg.model = "mlp";
  cfg.world_size = 4;
  cfg.batch_size = 30;  // 8, 8, 8, 6
  cfg.limit_train = 60;
  cfg.limit_test = 20;
  cfg.steps = 2;
  cfg.epochs = 0;  // --steps alone: as many epochs as it takes
  cfg.threads = 1;
  cfg.out_dir = tmp.path();
  lab::Run run(cfg, lab::make_world);
  const lab::RunSummary& s = run.run();
  const uint64_t per_step = (30 - 8) * 784 * 4 + 3 * state_bytes(run.replica(0)) + 2 * (30 - 8) * 10 * 4 +
                            3 * param_bytes(run.replica(0));
  EXPECT_EQ(s.traffic.bytes_moved, 2 * per_step);
  EXPECT_EQ(s.samples, 60);  // two global batches
  EXPECT_DOUBLE_EQ(s.traffic.rank0_share, 1.0);
  EXPECT_EQ(s.traffic.sent[0] + s.traffic.received[0], s.traffic.bytes_moved);
  const auto sj = nlohmann::json::parse(testutil::read_file(tmp.file("summary.json")));
  EXPECT_EQ(sj["mode"], "dp");
  EXPECT_DOUBLE_EQ(sj["data_parallel"]["device0_share_of_bytes"].get<double>(), 1.0);
}

// On the simulated network (link_model.h: one link per device to a switch) device 0's copies of
// the model leave through its one link out one after another, and the N-1 gradients come in
// through its one link in one after another: every iteration takes at least
// (N-1) (state + gradient bytes) / bandwidth, where a link per pair of devices would take one of
// each. A lower bound only: the modeled delays are exact, compute and scheduling add to them.
TEST(DataParallel, OnTheSimulatedNetworkDeviceZerosTransfersGoOneAfterAnother) {
  DTLAB_REQUIRE_DATASET();
  testutil::TempDir tmp;
  lab::RunConfig cfg;
  cfg.mode = "dp";
  cfg.model = "mlp";
  cfg.world_size = 4;
  cfg.batch_size = 32;  // 8 per device
  cfg.limit_train = 96;
  cfg.limit_test = 20;
  cfg.steps = 3;
  cfg.epochs = 0;
  cfg.threads = 1;
  cfg.link_gbps = 0.8;  // 100 MB/s per direction of every device's link
  cfg.out_dir = tmp.path();
  lab::Run run(cfg, lab::make_world);
  run.run();
  const double floor = 3.0 * static_cast<double>(state_bytes(run.replica(0)) + param_bytes(run.replica(0))) / 1e8;
  EXPECT_NEAR(floor, 0.0568, 0.0005);  // 3 x (946,744 + 943,656) bytes at 100 MB/s
  const auto steps = torchcmp::read_steps(tmp.file("metrics.jsonl"), cfg.world_size);
  ASSERT_EQ(steps[0].size(), 3u);
  for (size_t k = 1; k < 3; ++k)
    EXPECT_GE(steps[0][k]["t"].get<double>() - steps[0][k - 1]["t"].get<double>(), floor) << "iteration " << k;
}

// ---- local SGD ----

TEST_P(LocalSgdCase, MatchesPeriodicModelAverager) {
  DTLAB_REQUIRE_DATASET();
  const auto fx = testutil::load_fixture("local_sgd.json");
  {
    const auto& c = fx["cases"][GetParam()];
    testutil::TempDir tmp;
    lab::RunConfig cfg = torchcmp::config_for(fx, c, tmp.path());
    cfg.mode = "local-sgd";
    cfg.average_every = c["period"];
    cfg.warmup_steps = c["warmup"];
    lab::Run run(cfg, lab::make_world);
    const lab::RunSummary& s = run.run();
    const auto steps = torchcmp::read_steps(tmp.file("metrics.jsonl"), cfg.world_size);
    Compare cmp;
    double want_max = 0;
    for (int r = 0; r < cfg.world_size; ++r) {
      const auto& want = c["ranks"][static_cast<size_t>(r)];
      compare_rank(run, steps[static_cast<size_t>(r)], want, r, cmp);
      size_t k = 0;  // drift lines, at the same steps as PyTorch's averagings
      for (const auto& line : steps[static_cast<size_t>(r)]) {
        if (!line.contains("param_drift")) continue;
        ASSERT_LT(k, want["drifts"].size());
        EXPECT_EQ(line["step"], want["drifts"][k][0]);
        cmp.check("rank " + std::to_string(r) + " drift", line["param_drift"].get<double>(),
                  want["drifts"][k][1].get<double>(), 1e-5, 1e-4);
        want_max = std::max(want_max, want["drifts"][k][1].get<double>());
        ++k;
      }
      EXPECT_EQ(k, want["drifts"].size());
    }
    EXPECT_NEAR(s.drift_max, want_max, 1e-4);
    EXPECT_TRUE(cmp.ok());
  }
}
INSTANTIATE_TEST_SUITE_P(LocalSgd, LocalSgdCase,
                         ::testing::Values("mlp_w2_warm2_k3", "mlp_w3_warm1_k2_nobcast", "cnn_w2_warm0_k2"), case_name);

// Between averagings the replicas drift apart; right after one they are bitwise equal.
TEST(LocalSgd, ReplicasDriftBetweenAveragingsAndAgreeRightAfter) {
  DTLAB_REQUIRE_DATASET();
  lab::RunConfig cfg;
  cfg.mode = "local-sgd";
  cfg.model = "mlp";
  cfg.world_size = 3;
  cfg.batch_size = 16;
  cfg.limit_train = 384;
  cfg.limit_test = 30;
  cfg.average_every = 3;
  cfg.warmup_steps = 1;
  cfg.threads = 1;
  auto params_equal = [](lab::Run& run) {
    const auto p0 = run.replica(0).params();
    for (int r = 1; r < 3; ++r) {
      const auto pr = run.replica(r).params();
      for (size_t i = 0; i < p0.size(); ++i)
        if (pr[i]->value.data != p0[i]->value.data) return false;
    }
    return true;
  };
  cfg.steps = 8;  // steps 0..7, averagings after steps 1, 4, 7: the run ends right after one
  lab::Run at(cfg, lab::make_world);
  const lab::RunSummary& s = at.run();
  ASSERT_EQ(s.drift.size(), 3u);
  EXPECT_EQ(s.drift[0].first, 1);
  for (const auto& [step, d] : s.drift) EXPECT_GT(d, 0.0) << "step " << step;
  EXPECT_TRUE(params_equal(at));
  cfg.steps = 7;  // ends one step before the next averaging
  lab::Run between(cfg, lab::make_world);
  between.run();
  EXPECT_FALSE(params_equal(between));
}

// ---- no_sync ----

TEST_P(NoSyncCase, GradientAccumulationMatchesPyTorch) {
  DTLAB_REQUIRE_DATASET();
  const auto fx = testutil::load_fixture("no_sync.json");
  {
    const auto& c = fx["cases"][GetParam()];
    testutil::TempDir tmp;
    lab::RunConfig cfg = torchcmp::config_for(fx, c, tmp.path());
    cfg.no_sync_steps = c["no_sync_steps"];
    lab::Run run(cfg, lab::make_world);
    run.run();
    const auto steps = torchcmp::read_steps(tmp.file("metrics.jsonl"), cfg.world_size);
    Compare cmp;
    for (int r = 0; r < cfg.world_size; ++r) {
      compare_rank(run, steps[static_cast<size_t>(r)], c["ranks"][static_cast<size_t>(r)], r, cmp);
      for (const auto& line : steps[static_cast<size_t>(r)]) {
        const int64_t k = cfg.no_sync_steps;
        EXPECT_EQ(line.value("grad_sync", true), line["step"].get<int64_t>() % (k + 1) == k);
      }
    }
    EXPECT_TRUE(cmp.ok());
  }
}
INSTANTIATE_TEST_SUITE_P(NoSync, NoSyncCase, ::testing::Values("mlp_w2_k2", "mlp_w2_k1_cross_epoch", "cnn_w2_k1"),
                         case_name);

// ---- uneven inputs: join ----

TEST_P(JoinCase, UnevenInputsMatchPyTorchJoin) {
  DTLAB_REQUIRE_DATASET();
  const auto fx = testutil::load_fixture("join.json");
  {
    const auto& c = fx["cases"][GetParam()];
    testutil::TempDir tmp;
    lab::RunConfig cfg = torchcmp::config_for(fx, c, tmp.path());
    cfg.uneven_data = true;
    cfg.join = true;
    lab::Run run(cfg, lab::make_world);
    const lab::RunSummary& s = run.run();
    EXPECT_EQ(s.epochs_completed, cfg.epochs);
    const auto steps = torchcmp::read_steps(tmp.file("metrics.jsonl"), cfg.world_size);
    Compare cmp;
    for (int r = 0; r < cfg.world_size; ++r)
      compare_rank(run, steps[static_cast<size_t>(r)], c["ranks"][static_cast<size_t>(r)], r, cmp);
    EXPECT_TRUE(cmp.ok());
  }
}
INSTANTIATE_TEST_SUITE_P(Join, JoinCase, ::testing::Values("mlp_w3_2epochs", "cnn_w2"), case_name);

TEST(Join, WithoutJoinTheTimeoutSaysWhoWaitedAndWhoHadFinished) {
  DTLAB_REQUIRE_DATASET();
  lab::RunConfig cfg;
  cfg.model = "mlp";
  cfg.world_size = 3;
  cfg.batch_size = 16;
  cfg.limit_train = 192;  // 4 batches per rank: rank 1 keeps 3, rank 2 keeps 2
  cfg.limit_test = 30;
  cfg.uneven_data = true;
  cfg.threads = 1;
  cfg.timeout_s = 1.0;
  const auto t0 = std::chrono::steady_clock::now();
  try {
    lab::Run(cfg, lab::make_world).run();
    FAIL() << "expected a timeout";
  } catch (const lab::CommError& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.rfind("uneven inputs without --join: rank 2 ran out of data while ranks 0, 1 still had batches", 0), 0u)
        << msg;
    EXPECT_NE(msg.find("rank 0: waiting in allreduce #"), std::string::npos) << msg;
    EXPECT_NE(msg.find("(grad bucket 0) at step 2 (it still had batches)"), std::string::npos) << msg;
    EXPECT_NE(msg.find("rank 1: waiting in allreduce #"), std::string::npos) << msg;
    EXPECT_NE(msg.find("rank 2: finished: ran out of data after 2 steps (its 2 batches of epoch 0)"),
              std::string::npos)
        << msg;
    EXPECT_NE(e.hint().find("--join"), std::string::npos) << e.hint();
  }
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 4.0);
}
