// dtlab under mpirun (--comm mpi, one process per rank) against emulated ranks (--comm threads):
// the same configuration and seed give the same bytes, because the reduction order is the
// algorithm's, not the transport's. And failures end the job quickly, naming the rank.
// Each test starts `mpirun ... dtlab run --comm mpi` as a child process.
#include <algorithm>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <set>
#include <string>
#include <tuple>

#include "test_util.h"

namespace {

// mpirun's own limit (--timeout) is only the safety net: the lab's --timeout must fire first.
constexpr int kMpirunTimeoutSeconds = 120;

std::string mpirun(int np) {
  return std::string(DTLAB_MPIEXEC) + " --allow-run-as-root --oversubscribe --bind-to none --timeout " +
         std::to_string(kMpirunTimeoutSeconds) + " -np " + std::to_string(np) + " ";
}

struct Result {
  int exit_code = -1;
  std::string out;  // stdout and stderr together
  double seconds = 0;
};

Result run_shell(const std::string& cmd) {
  testutil::TempDir tmp;
  const std::string out = tmp.file("out.txt");
  const auto t0 = std::chrono::steady_clock::now();
  const int status = std::system((cmd + " > " + out + " 2>&1").c_str());
  Result r;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = testutil::read_file(out);
  return r;
}

// A line per JSON line, wall-clock fields removed ("t", "seconds", "samples_per_s").
std::string without_wall_clock(const std::string& jsonl) {
  std::stringstream in(jsonl), out;
  std::string line;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line);
    j.erase("t");
    j.erase("seconds");
    j.erase("samples_per_s");
    out << j.dump() << "\n";
  }
  return out.str();
}

// trace.json's events without their times: which events, with which fields. Sorted, because a
// rank's compute thread and its communication thread (overlap) record in whatever order they
// happen to finish.
std::string trace_without_times(const std::string& text) {
  auto j = nlohmann::json::parse(text);
  std::vector<std::string> events;
  for (auto& e : j["traceEvents"]) {
    e.erase("ts");
    e.erase("dur");
    events.push_back(e.dump());
  }
  std::sort(events.begin(), events.end());
  std::string out;
  for (const auto& e : events) out += e + "\n";
  return out;
}

std::string summary_without_wall_clock(const std::string& text) {
  auto j = nlohmann::json::parse(text);
  j.erase("train_seconds");
  j.erase("samples_per_s");
  for (auto& e : j["per_epoch"]) e.erase("seconds");
  j.erase("compute");  // seconds of computation: wall clock
  if (j.contains("pipeline")) {  // the measured bubble and the blocks' seconds (the recorded order stays)
    auto& p = j["pipeline"];
    p.erase("forward_seconds");
    p.erase("backward_seconds");
    for (const char* k : {"measured_median", "measured_per_step", "schedule_measured_costs"}) p["bubble"].erase(k);
  }
  // Communication times are wall clock too; keep only the settings of that section.
  if (j.contains("communication")) {
    auto& c = j["communication"];
    c = nlohmann::json{{"overlap", c["overlap"]}, {"link", c["link"]}};
  }
  return j.dump(1);
}

std::set<std::string> files_in(const std::string& dir) {
  std::set<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir)) names.insert(e.path().filename().string());
  return names;
}

// Small runs that cross epoch boundaries: 192 samples, batches of 16 per rank.
std::string common_flags(const std::string& model, const std::string& bn, int timeout_s = 60) {
  return "--model " + model + " --bn " + bn +
         " --limit-train 192 --limit-test 64 --batch-size 16 --steps 8 --threads 1 --timeout " +
         std::to_string(timeout_s);
}

using Case = std::tuple<int, std::string, std::string, std::string>;  // np, model, bn, extra flags

class MpiRunMatchesEmulated : public ::testing::TestWithParam<Case> {};

TEST_P(MpiRunMatchesEmulated, SameWeightsMetricsTraceAndSummary) {
  DTLAB_REQUIRE_DATASET();
  const auto& [np, model, bn, extra] = GetParam();
  testutil::TempDir mpi_dir, emu_dir;
  const std::string flags = common_flags(model, bn) + " " + extra;
  const Result m = run_shell(mpirun(np) + DTLAB_BINARY + " run --comm mpi " + flags + " --out " + mpi_dir.path());
  ASSERT_EQ(m.exit_code, 0) << m.out;
  EXPECT_NE(m.out.find("ranks: " + std::to_string(np) + " processes via Open MPI (OMPI_COMM_WORLD_RANK/SIZE)"),
            std::string::npos)
      << m.out;
  const Result e = run_shell(std::string(DTLAB_BINARY) + " run --world-size " + std::to_string(np) + " " + flags +
                             " --out " + emu_dir.path());
  ASSERT_EQ(e.exit_code, 0) << e.out;

  // The same files, and the same bytes where bytes must agree.
  ASSERT_EQ(files_in(mpi_dir.path()), files_in(emu_dir.path()));
  for (const std::string& f : files_in(emu_dir.path())) {
    const std::string a = testutil::read_file(mpi_dir.file(f)), b = testutil::read_file(emu_dir.file(f));
    if (f.size() > 12 && f.substr(f.size() - 12) == ".safetensors") {
      EXPECT_TRUE(a == b) << f << " differs";
    } else if (f == "metrics.jsonl") {
      EXPECT_EQ(without_wall_clock(a), without_wall_clock(b));
    } else if (f == "trace.json") {
      EXPECT_EQ(trace_without_times(a), trace_without_times(b));
    } else if (f == "summary.json") {
      EXPECT_EQ(summary_without_wall_clock(a), summary_without_wall_clock(b));
    }
  }
  // Every rank's steps are there: 8 steps x np ranks.
  int steps = 0;
  std::stringstream lines(testutil::read_file(mpi_dir.file("metrics.jsonl")));
  for (std::string line; std::getline(lines, line);) steps += nlohmann::json::parse(line)["kind"] == "step";
  EXPECT_EQ(steps, 8 * np);
}

INSTANTIATE_TEST_SUITE_P(
    Models, MpiRunMatchesEmulated,
    ::testing::Values(Case{2, "mlp", "local", ""}, Case{2, "mlp", "sync", ""}, Case{4, "mlp", "local", ""},
                      Case{4, "mlp", "sync", ""}, Case{2, "cnn", "local", ""}, Case{2, "cnn", "sync", ""},
                      Case{4, "cnn", "local", ""}, Case{4, "cnn", "sync", ""},
                      // ranks keep their own running statistics: final.rank<R>.buffers.safetensors
                      Case{4, "mlp", "local", "--no-broadcast-buffers"},
                      // grids: process groups over MPI's point-to-point messages (group_transport.h), the
                      // pipeline's sends and sendrecvs, the tensor-parallel allreduces inside replicas
                      Case{4, "mlp", "local", "--mode pipeline --stages 2 --dp 2 --microbatches 2 --schedule 1f1b"},
                      Case{4, "cnn", "local", "--mode tensor --tp 2 --dp 2"},
                      Case{8, "mlp", "local", "--mode pipeline --pp 2 --tp 2 --dp 2 --microbatches 2"}),
    [](const ::testing::TestParamInfo<Case>& i) {
      const std::string& extra = std::get<3>(i.param);
      const std::string tail = extra.empty()                              ? ""
                               : extra == "--no-broadcast-buffers"        ? "_own_buffers"
                               : extra.find("--tp") != std::string::npos && extra.find("pipeline") != std::string::npos
                                   ? "_pipeline_tp2_dp2"
                               : extra.find("pipeline") != std::string::npos ? "_pipeline_dp2"
                                                                          : "_tensor_dp2";
      return std::get<1>(i.param) + "_" + std::get<2>(i.param) + "_np" + std::to_string(std::get<0>(i.param)) + tail;
    });

// The simulated GPU under mpirun: SyncBatchNorm runs whole on the "device", and its collectives
// on device buffers are staged through the host (Open MPI here is not CUDA-aware), where the
// emulated ranks' threads transport keeps them on the device. The same bits either way, and the
// CPU's: the weights, the running statistics, every recorded step's BatchNorm statistics.
TEST(MpiRun, SimulatedGpuWithSyncBatchNormGivesTheCpusBits) {
  DTLAB_REQUIRE_DATASET();
  testutil::TempDir mpi_dir, emu_dir, cpu_dir;
  const std::string flags = common_flags("mlp", "sync") + " --record-bn 3";
  const Result m = run_shell(mpirun(2) + DTLAB_BINARY + " run --comm mpi --device sim " + flags + " --out " + mpi_dir.path());
  ASSERT_EQ(m.exit_code, 0) << m.out;
  const Result e = run_shell(std::string(DTLAB_BINARY) + " run --world-size 2 --device sim " + flags + " --out " + emu_dir.path());
  ASSERT_EQ(e.exit_code, 0) << e.out;
  const Result c = run_shell(std::string(DTLAB_BINARY) + " run --world-size 2 " + flags + " --out " + cpu_dir.path());
  ASSERT_EQ(c.exit_code, 0) << c.out;
  for (const char* f : {"final.safetensors", "bn_stats.bin"}) {
    const std::string want = testutil::read_file(cpu_dir.file(f));
    EXPECT_FALSE(want.empty()) << f;
    EXPECT_TRUE(testutil::read_file(mpi_dir.file(f)) == want) << f << ": mpirun";
    EXPECT_TRUE(testutil::read_file(emu_dir.file(f)) == want) << f << ": threads";
  }
  EXPECT_EQ(nlohmann::json::parse(testutil::read_file(mpi_dir.file("summary.json")))["device"]["device"], "sim");
}

TEST(MpiRun, AFailingRankEndsTheJobNamingIt) {
  DTLAB_REQUIRE_DATASET();
  const Result r = run_shell(mpirun(4) + DTLAB_BINARY + " run --comm mpi " + common_flags("mlp", "local", 30) +
                             " --fail-rank 1 --fail-step 1 --fail-at allreduce");
  EXPECT_NE(r.exit_code, 0) << r.out;
  // The failing rank's process prints its own error; rank 0's process prints it as the cause.
  EXPECT_NE(r.out.find("dtlab: error: rank 1 failed: injected failure in allreduce"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("dtlab: error: rank 0: allreduce #"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("aborted: rank 1 failed: injected failure"), std::string::npos) << r.out;
  EXPECT_LT(r.seconds, 20.0) << "the abort must reach every rank at once, far below the 30 s timeout";
}

TEST(MpiRun, AHungRankIsNamedWithinTheLabTimeout) {
  DTLAB_REQUIRE_DATASET();
  const Result r = run_shell(mpirun(4) + DTLAB_BINARY + " run --comm mpi " + common_flags("mlp", "local", 3) +
                             " --fail-rank 1 --fail-step 2 --fail-at hang");
  EXPECT_EQ(r.exit_code, 6) << r.out;  // a communication failure
  EXPECT_NE(r.out.find("timed out after 3 s waiting for rank"), std::string::npos) << r.out;
  // Whichever rank timed out first, its wait chain ends at the hung rank.
  EXPECT_NE(r.out.find("rank 1 is not waiting in any transport call"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("rank 1: stopped because another rank failed"), std::string::npos) << r.out;
  EXPECT_LT(r.seconds, kMpirunTimeoutSeconds / 4.0) << "the lab's timeout, not mpirun's, must end the job";
}

// Checkpoints under mpirun: each process writes its own rank's files into the one run
// directory; a resumed job (or an emulated run's checkpoint resumed under mpirun, and back) ends
// where the uninterrupted emulated run does.
TEST(MpiRun, ResumedFromACheckpointEqualsTheUninterruptedRun) {
  DTLAB_REQUIRE_DATASET();
  testutil::TempDir emu, mpi, mpi_copy, emu_ck, emu_to_mpi, other;
  const std::string flags = common_flags("cnn", "sync") + " --momentum 0.9";
  const std::string emulated = std::string(DTLAB_BINARY) + " run --world-size 2 " + flags;
  ASSERT_EQ(run_shell(emulated + " --out " + emu.path()).exit_code, 0);
  // the job writes checkpoints before iterations 3 and 6 and completes; resumed from 6 (in place
  // and into a copy) it computes iterations 6 and 7 again
  Result r = run_shell(mpirun(2) + DTLAB_BINARY + " run --comm mpi " + flags + " --checkpoint-every 3 --out " + mpi.path());
  ASSERT_EQ(r.exit_code, 0) << r.out;
  r = run_shell(mpirun(2) + DTLAB_BINARY + " run --comm mpi --resume " + mpi.path() + " --out " + mpi_copy.path());
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("resuming at iteration 6 of 8"), std::string::npos) << r.out;
  r = run_shell(mpirun(2) + DTLAB_BINARY + " run --comm mpi --resume " + mpi.path());
  ASSERT_EQ(r.exit_code, 0) << r.out;
  // an emulated run's checkpoint, resumed by an MPI job
  ASSERT_EQ(run_shell(emulated + " --checkpoint-every 3 --out " + emu_ck.path()).exit_code, 0);
  r = run_shell(mpirun(2) + DTLAB_BINARY + " run --comm mpi --resume " + emu_ck.path() + " --out " + emu_to_mpi.path());
  ASSERT_EQ(r.exit_code, 0) << r.out;
  for (const std::string& d : {mpi.path(), mpi_copy.path(), emu_to_mpi.path()}) {
    EXPECT_TRUE(testutil::read_file(emu.file("final.safetensors")) == testutil::read_file(d + "/final.safetensors")) << d;
    EXPECT_EQ(without_wall_clock(testutil::read_file(emu.file("metrics.jsonl"))),
              without_wall_clock(testutil::read_file(d + "/metrics.jsonl")))
        << d;
    EXPECT_EQ(testutil::read_file(emu.file("bn_stats.bin")), testutil::read_file(d + "/bn_stats.bin")) << d;
    auto traffic = [](const std::string& f) { return nlohmann::json::parse(testutil::read_file(f))["traffic"]; };
    EXPECT_EQ(traffic(emu.file("summary.json")), traffic(d + "/summary.json")) << d;
  }
  // a job of another size is refused, naming both sizes
  r = run_shell(mpirun(3) + DTLAB_BINARY + " run --comm mpi --resume " + mpi.path() + " --out " + other.path());
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("was written by 2 ranks, this run has 3"), std::string::npos) << r.out;
}

TEST(MpiRun, WorldSizeMustMatchMpirun) {
  const Result r = run_shell(mpirun(2) + DTLAB_BINARY + " run --comm mpi --world-size 3 --steps 1");
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("--world-size 3 does not match the MPI world: mpirun started 2 processes"), std::string::npos)
      << r.out;
}

TEST(MpiRun, TorchrunStyleRankMustAgreeWithMpi) {
  const Result r = run_shell(mpirun(2) + "-x RANK=7 -x WORLD_SIZE=2 " + DTLAB_BINARY + " run --comm mpi --steps 1");
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("but RANK=7 WORLD_SIZE=2"), std::string::npos) << r.out;
}

// NCCL ranks as processes (mpirun -np N dtlab run --comm nccl): MPI starts them and gives the
// world and each rank's machine; rank 0 says so. Without two GPUs here each process then fails at
// the GPU check (exit 9), naming --comm nccl. (The transport across processes is tested against
// the CPU model of NCCL in tests/gpu/test_nccl_processes.cpp; a real two-GPU run on GPUs only.)
TEST(MpiRun, NcclRanksAsProcessesTakeTheWorldFromMpi) {
  const Result v = run_shell(std::string(DTLAB_BINARY) + " version");
  if (v.out.find("GPU devices: none") == std::string::npos && v.out.find("GPU backend: not built") == std::string::npos)
    GTEST_SKIP() << "this machine has GPUs: tools/gpu_check.sh runs NCCL on them";
  const Result r = run_shell(mpirun(2) + DTLAB_BINARY + " run --comm nccl --device cuda --steps 1 --limit-train 64");
  EXPECT_EQ(r.exit_code, 9) << r.out;
  EXPECT_NE(r.out.find("ranks: 2 processes via Open MPI (OMPI_COMM_WORLD_RANK/SIZE); this process is rank 0 (1 machine); "
                       "NCCL carries the collectives"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("dtlab: error: --comm nccl: "), std::string::npos) << r.out;
  EXPECT_LT(r.seconds, 30) << "fails at once, not at a timeout: " << r.out;

  const Result w = run_shell(mpirun(2) + DTLAB_BINARY + " run --comm nccl --device cuda --world-size 3 --steps 1");
  EXPECT_EQ(w.exit_code, 2) << w.out;
  EXPECT_NE(w.out.find("--world-size 3 does not match the MPI world: mpirun started 2 processes"), std::string::npos)
      << w.out;
  EXPECT_NE(w.out.find("with --comm nccl under mpirun every rank is a process"), std::string::npos) << w.out;
}

}  // namespace
