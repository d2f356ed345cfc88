// --device: parsing and validation, the clear error where there is no GPU (or no GPU backend), and
// the device seam itself (lab/nn/executor.h). The seam is tested on the CPU with the simulated GPU
// (--device sim, backends/sim), an executor that follows the GPU's protocols exactly as the GPU's
// does (host-staged: parameters copied to its own "device" modules at every forward, BatchNorm split
// at its statistics and gradient sums, gradients copied back and added, on_param_ready in
// Model::backward's order; resident: parameters and momentum stepped on the device, the host's
// copies poisoned mirrors) but computes with the CPU's ops: a whole lab::Run through it must give the
// CPU run's bits. The GPU's executor is tested against the CPU on a GPU (tests/gpu).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <sstream>

#include "backends.h"
#include "bn_stats.h"
#include "batchnorm.h"
#include "config.h"
#include "elementwise.h"
#include "errors.h"
#include "executor.h"
#include "model.h"
#include "run.h"
#include "run_data.h"
#include "safetensors.h"
#include "sim_backend.h"
#include "test_util.h"

namespace {

using testutil::g_sim;
using testutil::SimBackend;

bool no_gpu_here() {
  const std::vector<std::string> r = lab::gpu_backend_report();
  return r[0].find("not built") != std::string::npos || (r.size() > 1 && r[1].rfind("GPU devices: none", 0) == 0);
}

}  // namespace

// ---- parsing and validation ----

TEST(Device, ParsesCpuCudaCudaNAndSim) {
  EXPECT_TRUE(lab::parse_device("cpu").is_cpu());
  EXPECT_EQ(lab::parse_device("cuda").str(), "cuda:0");
  EXPECT_EQ(lab::parse_device("cuda:3").index, 3);
  EXPECT_EQ(lab::parse_device("sim").str(), "sim");
  EXPECT_FALSE(lab::parse_device("sim").is_cuda());
  for (const char* bad : {"gpu", "cuda:", "cuda:x", "cuda0", "CUDA", "cuda:-1", "cuda:99999", "", "sim:0", "SIM"}) {
    try {
      lab::parse_device(bad);
      ADD_FAILURE() << bad << " was accepted";
    } catch (const lab::ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(std::string("--device '") + bad + "'"), std::string::npos) << e.what();
    }
  }
}

TEST(Device, GpuSwitchesAreRefusedOnTheCpuAndRoundTripInConfig) {
  lab::ComputeOptions o;
  o.cudnn_deterministic = true;
  EXPECT_THROW(lab::validate_compute_options(o), lab::ConfigError);
  o.device = "cuda:1";
  EXPECT_NO_THROW(lab::validate_compute_options(o));

  lab::RunConfig c;
  c.compute = o;
  c.compute.allow_tf32 = true;
  c.compute.rank_devices = {1};
  const lab::RunConfig back = lab::config_from_toml(lab::to_toml(c, {}), "config.toml");
  EXPECT_EQ(back.compute.device, "cuda:1");
  EXPECT_TRUE(back.compute.allow_tf32);
  EXPECT_TRUE(back.compute.cudnn_deterministic);
  EXPECT_FALSE(back.compute.cudnn_benchmark);
  EXPECT_EQ(back.compute.rank_devices, std::vector<int>{1});
  c.nondeterministic = true;  // the CPU's emulation of atomics
  EXPECT_THROW(lab::validate(c), lab::ConfigError);
}

TEST(Device, RankDeviceMapAndOneNcclRankPerGpu) {
  lab::ComputeOptions o;
  EXPECT_TRUE(lab::rank_device_map(o, 4, "threads").empty());  // the CPU
  o.device = "cuda:1";
  EXPECT_EQ(lab::rank_device_map(o, 3, "threads"), (std::vector<int>{1, 1, 1}));  // emulated ranks share it
  EXPECT_EQ(lab::rank_device_map(o, 3, "nccl"), (std::vector<int>{1, 2, 3}));     // a GPU per NCCL rank
  o.rank_devices = {3, 0};
  EXPECT_EQ(lab::rank_device_map(o, 2, "nccl"), (std::vector<int>{3, 0}));
  EXPECT_THROW(lab::rank_device_map(o, 3, "nccl"), lab::ConfigError);  // one per rank
  EXPECT_NO_THROW(lab::check_one_rank_per_gpu({3, 0}));
  try {
    lab::check_one_rank_per_gpu({0, 1, 0});
    ADD_FAILURE() << "two ranks on cuda:0 were accepted";
  } catch (const lab::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("ranks 0 and 2 would both run on cuda:0"), std::string::npos) << e.what();
  }
}

// NCCL ranks as processes on several machines (MpiRuntime fills rank_nodes: the lowest rank on
// each rank's machine): the k-th rank of a machine takes GPU device + k, and only two ranks of one
// machine on one GPU are refused.
TEST(Device, NcclRanksAsProcessesTakeTheirMachinesGpusInTurn) {
  lab::ComputeOptions o;
  o.device = "cuda";
  o.rank_nodes = {0, 0, 2, 2, 0};  // ranks 0, 1, 4 on one machine, 2 and 3 on another
  EXPECT_EQ(lab::rank_device_map(o, 5, "nccl"), (std::vector<int>{0, 1, 0, 1, 2}));
  EXPECT_EQ(lab::rank_device_map(o, 5, "threads"), (std::vector<int>(5, 0)));  // --comm mpi shares --device's
  o.device = "cuda:1";
  EXPECT_EQ(lab::rank_device_map(o, 5, "nccl"), (std::vector<int>{1, 2, 1, 2, 3}));
  EXPECT_NO_THROW(lab::check_one_rank_per_gpu({0, 1, 0, 1, 2}, o.rank_nodes));
  try {
    lab::check_one_rank_per_gpu({0, 1, 0, 1, 1}, o.rank_nodes);
    ADD_FAILURE() << "ranks 1 and 4 on cuda:1 of one machine were accepted";
  } catch (const lab::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("ranks 1 and 4 would both run on cuda:1 of one machine"), std::string::npos)
        << e.what();
  }
  lab::RunConfig c;  // validate() checks the map with the machines
  c.comm = "nccl";
  c.world_size = 4;
  c.compute.device = "cuda";
  c.compute.rank_devices = {0, 1, 0, 1};
  EXPECT_THROW(lab::validate(c), lab::ConfigError);  // one machine: ranks 0 and 2 share cuda:0
  c.compute.rank_nodes = {0, 0, 2, 2};
  EXPECT_NO_THROW(lab::validate(c));
}

TEST(DeviceCli, NcclSettingsAreCheckedBeforeAnyGpuIsAsked) {
  struct Case {
    const char* args;
    const char* says;
  };
  for (const Case k : {Case{"--comm nccl", "--comm nccl: NCCL moves GPU memory between GPUs: it needs --device cuda"},
                       Case{"--comm nccl --device cuda --world-size 2 --rank-devices 0,0",
                            "ranks 0 and 1 would both run on cuda:0, and NCCL refuses two ranks on one GPU"},
                       Case{"--device cuda --world-size 2 --rank-devices 0", "--rank-devices gives 1 GPUs for 2 ranks"},
                       Case{"--rank-devices 0", "--rank-devices places ranks on GPUs"},
                       Case{"--comm nccl --device sim", "it needs --device cuda (got --device sim)"},
                       Case{"--device sim --rank-devices 0", "it has no effect with --device sim"},
                       Case{"--device sim --allow-tf32", "--allow-tf32 applies to GPU computation (cuBLAS, cuDNN): it has "
                                                         "no effect with --device sim"},
                       Case{"--device sim --nondeterministic", "not with --device sim"},
                       Case{"--allreduce nccl", "--allreduce nccl needs --comm nccl"}}) {
    const testutil::CliResult r = testutil::run_cli(std::string("run --steps 1 ") + k.args);
    EXPECT_EQ(r.exit_code, lab::kExitUsage) << k.args << ": " << r.out;
    EXPECT_NE(r.out.find(k.says), std::string::npos) << k.args << ": " << r.out;
  }
}

// ---- no GPU: a clear error at once ----

TEST(DeviceCli, CudaWithoutAGpuFailsAtOnceWithItsExitCode) {
  if (!no_gpu_here()) GTEST_SKIP() << "this machine has a GPU: tests/gpu run --device cuda";
  DTLAB_REQUIRE_DATASET();
  testutil::TempDir d;
  const std::string out = d.file("run");
  const testutil::CliResult r = testutil::run_cli("run --device cuda --steps 1 --limit-train 64 --out " + out);
  EXPECT_EQ(r.exit_code, lab::kExitDevice) << r.out;
  EXPECT_NE(r.out.find("dtlab: error: --device cuda: "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("hint: "), std::string::npos) << r.out;
  EXPECT_FALSE(std::filesystem::exists(out)) << "nothing is written before the device is checked";

  const testutil::CliResult b = testutil::run_cli("bench train --device cuda:0 --rounds 1 --seconds 0.01");
  EXPECT_EQ(b.exit_code, lab::kExitDevice) << b.out;
  EXPECT_NE(b.out.find("--device cuda:0: "), std::string::npos) << b.out;
  EXPECT_EQ(b.out.find("train_flops_per_sample"), std::string::npos) << "fails before any figure: " << b.out;

  const testutil::CliResult n = testutil::run_cli("run --comm nccl --device cuda --steps 1 --limit-train 64");
  EXPECT_EQ(n.exit_code, lab::kExitDevice) << n.out;
  EXPECT_NE(n.out.find("--comm nccl"), std::string::npos) << n.out;

  const std::string run = d.file("cpu-run");
  ASSERT_EQ(testutil::run_cli("run --model mlp --steps 1 --limit-train 64 --limit-test 64 --out " + run).exit_code, 0);
  const testutil::CliResult e = testutil::run_cli("eval --run " + run + " --device cuda");
  EXPECT_EQ(e.exit_code, lab::kExitDevice) << e.out;
  EXPECT_NE(e.out.find("--device cuda: "), std::string::npos) << e.out;
  EXPECT_EQ(e.out.find("accuracy"), std::string::npos) << "fails before any figure: " << e.out;
  const testutil::CliResult a = testutil::run_cli("eval --run " + run + " --device cuda --autocast bf16");
  EXPECT_EQ(a.exit_code, lab::kExitUsage) << a.out;
}

// --device sim through the dtlab executable (backends/devices.h's factory, the resident protocol):
// the mlp trains to the CPU's bits, the summary names the device and counts its copies, eval and
// bench train run on it too.
// --cuda-graphs from the command line: kept in config.toml, so a --resume continues with it and
// still gives the CPU run's bits; bench train says it in its header; a refusal names the flag.
TEST(DeviceCli, CudaGraphsResumeAndBenchOnTheSimulatedGpu) {
  DTLAB_REQUIRE_DATASET();
  testutil::TempDir d;
  const std::string common = "run --model mlp --world-size 1 --batch-size 16 --steps 6 --limit-train 256 "
                             "--limit-test 64 --checkpoint-every 2 --out ";
  ASSERT_EQ(testutil::run_cli(common + d.file("cpu")).exit_code, 0);
  const testutil::CliResult r = testutil::run_cli(common + d.file("sim") + " --device sim --cuda-graphs");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_EQ(testutil::read_file(d.file("cpu") + "/final.safetensors"), testutil::read_file(d.file("sim") + "/final.safetensors"));
  EXPECT_NE(testutil::read_file(d.file("sim") + "/config.toml").find("cuda_graphs = true"), std::string::npos);
  const testutil::CliResult re = testutil::run_cli("run --resume " + d.file("sim") + " --out " + d.file("resumed"));
  ASSERT_EQ(re.exit_code, 0) << re.out;
  EXPECT_EQ(testutil::read_file(d.file("cpu") + "/final.safetensors"), testutil::read_file(d.file("resumed") + "/final.safetensors"));
  EXPECT_NE(testutil::read_file(d.file("resumed") + "/config.toml").find("cuda_graphs = true"), std::string::npos);
  const testutil::CliResult b =
      testutil::run_cli("bench train --device sim --cuda-graphs --batch-size 8 --seconds 0.01 --rounds 1");
  EXPECT_EQ(b.exit_code, 0) << b.out;
  EXPECT_NE(b.out.find("cuda_graphs=on"), std::string::npos) << b.out;
  const testutil::CliResult no = testutil::run_cli(common + d.file("no") + " --device sim --cuda-graphs --bn sync");
  EXPECT_EQ(no.exit_code, 2) << no.out;
  EXPECT_NE(no.out.find("--cuda-graphs with --bn sync"), std::string::npos) << no.out;
}

TEST(DeviceCli, SimTrainsToTheCpusBitsAndSaysWhatItCopied) {
  DTLAB_REQUIRE_DATASET();
  testutil::TempDir d;
  const std::string common = "run --model mlp --world-size 2 --bn sync --batch-size 16 --steps 4 --limit-train 256 "
                             "--limit-test 64 --checkpoint-every 2 --out ";
  ASSERT_EQ(testutil::run_cli(common + d.file("cpu")).exit_code, 0);
  const testutil::CliResult r = testutil::run_cli(common + d.file("sim") + " --device sim");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_EQ(testutil::read_file(d.file("cpu") + "/final.safetensors"), testutil::read_file(d.file("sim") + "/final.safetensors"));
  const nlohmann::json s = nlohmann::json::parse(testutil::read_file(d.file("sim") + "/summary.json"));
  EXPECT_EQ(s["device"]["device"], "sim") << s["device"].dump();
  EXPECT_EQ(s["device"]["rank0"]["resident"], true) << s["device"].dump();
  // the ten parameters (3 Linear, 2 BatchNorm1d) stepped on the device at each of the 4 steps
  EXPECT_EQ(s["device"]["rank0"]["protocol"]["device_steps"], 40) << s["device"].dump();
  EXPECT_GT(s["device"]["staging"]["device_to_host_bytes"].get<uint64_t>(), 0u) << s["device"].dump();
  // DDP's buckets in the device's memory: no gradient came to the host
  EXPECT_EQ(s["device"]["rank0"]["protocol"]["grad_bytes_to_host"], 0) << s["device"].dump();
  // resumed from its checkpoint before step 2 (the momentum buffers read back from the device's
  // mirrors, then taken up again): still the CPU's bits
  ASSERT_TRUE(std::filesystem::exists(d.file("sim") + "/checkpoints/step-00000002"));
  const testutil::CliResult re = testutil::run_cli("run --resume " + d.file("sim") + " --out " + d.file("resumed"));
  ASSERT_EQ(re.exit_code, 0) << re.out;
  EXPECT_EQ(testutil::read_file(d.file("cpu") + "/final.safetensors"), testutil::read_file(d.file("resumed") + "/final.safetensors"));
  EXPECT_EQ(nlohmann::json::parse(testutil::read_file(d.file("resumed") + "/summary.json"))["device"]["device"], "sim");

  const testutil::CliResult e = testutil::run_cli("eval --run " + d.file("sim") + " --device sim");
  EXPECT_EQ(e.exit_code, 0) << e.out;
  const testutil::CliResult c = testutil::run_cli("eval --run " + d.file("sim"));
  EXPECT_EQ(c.exit_code, 0) << c.out;
  EXPECT_NE(e.out.find("accuracy"), std::string::npos) << e.out;
  // the same figures on the simulated device as on the CPU: the same ops (the speed apart)
  const auto figures = [](const std::string& out) {
    std::string kept;
    std::istringstream in(out);
    for (std::string line; std::getline(in, line);)
      if (line.rfind("accuracy", 0) == 0) kept += line.substr(0, line.find(" |")) + "\n";
      else if (line.rfind("  test sample", 0) == 0) kept += line + "\n";
    return kept;
  };
  EXPECT_NE(figures(e.out).find("test sample 2"), std::string::npos) << e.out;
  EXPECT_EQ(figures(e.out), figures(c.out)) << e.out << "\n---\n" << c.out;
  const testutil::CliResult b = testutil::run_cli("bench train --model mlp --device sim --rounds 1 --seconds 0.01");
  EXPECT_EQ(b.exit_code, 0) << b.out;
}

TEST(DeviceCli, BadDeviceAndCpuWithGpuSwitchesAreUsageErrors) {
  const testutil::CliResult bad = testutil::run_cli("run --device tpu --steps 1");
  EXPECT_EQ(bad.exit_code, lab::kExitUsage) << bad.out;
  EXPECT_NE(bad.out.find("--device 'tpu'"), std::string::npos) << bad.out;
  const testutil::CliResult sw = testutil::run_cli("run --cudnn-benchmark --steps 1");
  EXPECT_EQ(sw.exit_code, lab::kExitUsage) << sw.out;
  EXPECT_NE(sw.out.find("--cudnn-benchmark"), std::string::npos) << sw.out;
  const testutil::CliResult help = testutil::run_cli("run --help");
  for (const char* flag : {"--device", "--allow-tf32", "--cudnn-benchmark", "--cudnn-deterministic"})
    EXPECT_NE(help.out.find(flag), std::string::npos) << flag;
}

TEST(Device, RunWithoutADeviceBackendIsADeviceError) {
  DTLAB_REQUIRE_DATASET();
  lab::set_executor_factory({});
  lab::RunConfig c = testutil::small_run("mlp", 1, "", 1);
  c.compute.device = "cuda";
  EXPECT_THROW(lab::Run(c, lab::make_world), lab::DeviceError);
}

// ---- the seam: a whole run through a host-staged executor gives the CPU's bits ----

TEST(DeviceSeam, RunThroughAStagedExecutorEqualsTheCpuRun) {
  DTLAB_REQUIRE_DATASET();
  struct Case {
    const char* model;
    const char* bn;
    const char* mode;
  };
  for (const Case k : {Case{"cnn", "sync", "ddp"}, Case{"mlp", "local", "ddp"}, Case{"mlp", "sync", "local-sgd"},
                       Case{"cnn", "local", "dp"}}) {
    const std::string what = std::string(k.model) + " bn=" + k.bn + " mode=" + k.mode;
    testutil::TempDir cpu_dir, dev_dir;
    lab::RunConfig c = testutil::small_run(k.model, 2, cpu_dir.path(), 4);
    c.bn = k.bn;
    c.mode = k.mode;
    c.average_every = 2;
    c.eval_every = 2;
    c.eval_samples = 64;
    lab::Run(c, lab::make_world).run();

    SimBackend backend;
    lab::RunConfig d = c;
    d.out_dir = dev_dir.path();
    d.compute.device = "sim";
    lab::Run run(d, lab::make_world);
    run.run();
    // two replicas, the periodic-evaluation copy, the final train-mode evaluation's copy
    EXPECT_EQ(g_sim.size(), 4u) << what;
    const nlohmann::json s = nlohmann::json::parse(testutil::read_file(dev_dir.file("summary.json")));
    const nlohmann::json cs = nlohmann::json::parse(testutil::read_file(cpu_dir.file("summary.json")));
    if (std::string(k.model) == "mlp") {  // every layer is the CPU's own: the same bits
      EXPECT_EQ(testutil::read_file(cpu_dir.file("final.safetensors")), testutil::read_file(dev_dir.file("final.safetensors")))
          << what;
      EXPECT_EQ(testutil::without_wall_clock(testutil::read_file(cpu_dir.file("metrics.jsonl"))),
                testutil::without_wall_clock(testutil::read_file(dev_dir.file("metrics.jsonl"))))
          << what;
      EXPECT_EQ(s["test_eval_mode"], cs["test_eval_mode"]) << what;
    } else {
      // The CPU's cnn fuses BatchNorm2d -> ReLU -> MaxPool2d, whose backward adds BatchNorm's
      // gradient sums in another order than the separate layers the executor runs
      // (bn_relu_pool.h): equal to float rounding, which 4 steps of SGD carry into the weights.
      const std::vector<lab::SafeTensor> a = lab::read_safetensors(cpu_dir.file("final.safetensors"));
      const std::vector<lab::SafeTensor> b = lab::read_safetensors(dev_dir.file("final.safetensors"));
      ASSERT_EQ(a.size(), b.size()) << what;
      for (size_t t = 0; t < a.size(); ++t) {
        ASSERT_EQ(a[t].name, b[t].name);
        ASSERT_EQ(a[t].bytes.size(), b[t].bytes.size()) << a[t].name;
        if (a[t].dtype != "F32") {
          EXPECT_EQ(a[t].bytes, b[t].bytes) << what << " " << a[t].name;
          continue;
        }
        std::vector<float> fa(a[t].bytes.size() / 4), fb(fa.size());
        std::memcpy(fa.data(), a[t].bytes.data(), a[t].bytes.size());
        std::memcpy(fb.data(), b[t].bytes.data(), b[t].bytes.size());
        float scale = 0.0f, worst = 0.0f;
        for (size_t e = 0; e < fa.size(); ++e) {
          scale = std::max(scale, std::abs(fa[e]));
          worst = std::max(worst, std::abs(fa[e] - fb[e]));
        }
        EXPECT_LE(worst, 1e-5f * std::max(scale, 1.0f)) << what << " " << a[t].name;
      }
      EXPECT_NEAR(s["test_eval_mode"]["loss"].get<double>(), cs["test_eval_mode"]["loss"].get<double>(), 1e-5) << what;
    }
    const std::string sim_name = "sim (a simulated GPU)";
    EXPECT_EQ(s["device"]["name"], sim_name) << what;
    EXPECT_GT(s["device"]["staging"]["host_to_device_bytes"].get<uint64_t>(), 0u) << what;
    EXPECT_EQ(cs["device"]["device"], "cpu") << what;
    EXPECT_NE(testutil::read_file(dev_dir.file("config.toml")).find("device = \"sim\""), std::string::npos) << what;
    // the app shows which device computed and what cuDNN chose (the controls panel's "device")
    const viz::RunData v = viz::load_run_dir(dev_dir.path());
    EXPECT_EQ(v.cfg.compute.device, "sim") << what;
    EXPECT_EQ(v.summary.device_name, sim_name) << what;
    EXPECT_EQ(v.summary.staged_bytes, s["device"]["staging"]["host_to_device_bytes"].get<uint64_t>() +
                                          s["device"]["staging"]["device_to_host_bytes"].get<uint64_t>())
        << what;
    // the cnn's two convolutions, each pass: the CPU's im2col + sgemm
    if (std::string(k.model) == "cnn") {
      ASSERT_EQ(v.summary.conv_algorithms.size(), 6u) << what;
      EXPECT_EQ(v.summary.conv_algorithms[0], "forward conv k3 p1: im2col + sgemm (the CPU's, FMA)") << what;
    } else {
      EXPECT_TRUE(v.summary.conv_algorithms.empty()) << what;
    }
    EXPECT_TRUE(viz::load_run_dir(cpu_dir.path()).summary.device_name.empty()) << what;

    // The device's own timeline (EventKind::Device, trace.json's "device" track): every layer's
    // work of every training forward and backward, inside the host's span of the same phase and
    // step of its rank. A CPU run has none.
    const std::string trace = testutil::read_file(dev_dir.file("trace.json"));
    EXPECT_NE(trace.find(R"("args":{"name":"device"},"name":"thread_name")"), std::string::npos) << what;
    EXPECT_EQ(testutil::read_file(cpu_dir.file("trace.json")).find(R"({"name":"device"})"), std::string::npos) << what;
    for (const auto& log : viz::load_run_dir(cpu_dir.path()).events)
      for (const lab::Event& e : log) EXPECT_NE(e.kind, lab::EventKind::Device) << what;
    if (std::string(k.mode) == "dp") continue;  // one process computes for every device: rank 0's log
    for (int r = 0; r < 2; ++r) {
      const std::vector<lab::Event>& log = v.events[static_cast<size_t>(r)];
      for (int64_t step = 0; step < 4; ++step)
        for (const lab::Phase phase : {lab::Phase::Forward, lab::Phase::Backward}) {
          const auto host = std::find_if(log.begin(), log.end(), [&](const lab::Event& e) {
            return e.kind == lab::EventKind::Compute && e.phase == phase && e.train_step == step;
          });
          ASSERT_NE(host, log.end()) << what << " rank " << r << " step " << step;
          int layers = 0, linear = 0, copies = 0, losses = 0;
          for (const lab::Event& e : log) {
            if (e.kind != lab::EventKind::Device || e.train_step != step || e.phase != phase) continue;
            EXPECT_GE(e.t_start, host->t_start) << what << " " << e.op << " " << e.tag;
            EXPECT_LE(e.t_end, host->t_end) << what << " " << e.op << " " << e.tag;
            if (std::string(e.what) == "copy") {  // the input or labels up, the loss or a gradient down
              ++copies;
              EXPECT_GT(e.bytes, 0u) << what << " " << e.op;
              continue;
            }
            if (std::string(e.op) == "cross-entropy") {  // the loss, on the device (no module)
              ++losses;
              EXPECT_EQ(e.tag, -1) << what;
              continue;
            }
            ++layers;
            linear += std::string(e.op) == "linear";
            EXPECT_EQ(e.rank, r);
            EXPECT_STREQ(e.what, "kernels");
          }
          lab::ModelOptions mo;
          mo.name = k.model;
          const std::unique_ptr<lab::Model> m = lab::build_model(mo, 0);
          int want = 0;  // every module that does device work (Flatten, a reshape, does none)
          for (size_t i = phase == lab::Phase::Forward ? 0 : m->param_layout().first_with_params; i < m->size(); ++i)
            want += lab::device_timeline_op(m->module(i).kind()) != nullptr;
          EXPECT_EQ(layers, want) << what << " rank " << r << " step " << step << " " << lab::phase_name(phase);
          EXPECT_EQ(losses, phase == lab::Phase::Forward ? 1 : 0) << what << " step " << step;
          int want_linear = 0;
          for (size_t i = 0; i < m->size(); ++i) want_linear += m->module(i).kind() == "Linear";
          EXPECT_EQ(linear, want_linear) << what;
          EXPECT_GE(copies, 2) << what << " rank " << r << " step " << step << " " << lab::phase_name(phase);
        }
    }
  }
}

// ---- residency (executor.h) ----

namespace {

// Every file of `a` the same bytes in `b`: the weights, the metrics without their clocks, the
// checkpoints (model, momentum buffers, counters).
void expect_same_files(const std::string& a, const std::string& b, const std::string& what) {
  const auto same = [&](const std::string& f) { return testutil::read_file(a + "/" + f) == testutil::read_file(b + "/" + f); };
  EXPECT_TRUE(same("final.safetensors")) << what;
  EXPECT_TRUE(same("init.safetensors")) << what;
  EXPECT_TRUE(testutil::without_wall_clock(testutil::read_file(a + "/metrics.jsonl")) ==
              testutil::without_wall_clock(testutil::read_file(b + "/metrics.jsonl")))
      << what;
  namespace fs = std::filesystem;
  if (!fs::exists(a + "/checkpoints")) return;
  int compared = 0;
  for (const auto& step : fs::directory_iterator(a + "/checkpoints"))
    for (const auto& f : fs::directory_iterator(step.path())) {
      if (f.path().extension() != ".safetensors") continue;
      const std::string rel = step.path().filename().string() + "/" + f.path().filename().string();
      EXPECT_TRUE(testutil::read_file(f.path().string()) == testutil::read_file(b + "/checkpoints/" + rel)) << what << " " << rel;
      ++compared;
    }
  EXPECT_GT(compared, 0) << what;
}

// Runs c (its out_dir the CPU's) on the CPU, then on the resident simulated GPU (SimBackend, set
// up by the caller) into dev_dir, and checks every file against the CPU run's. Returns the device
// run, alive: its models own the executors g_sim lists.
std::unique_ptr<lab::Run> cpu_then_sim(const lab::RunConfig& c, const std::string& dev_dir, const std::string& what,
                                       bool cuda_graphs = false) {
  lab::Run(c, lab::make_world).run();
  lab::RunConfig d = c;
  d.out_dir = dev_dir;
  d.compute.device = "sim";
  d.compute.cuda_graphs = cuda_graphs;
  auto run = std::make_unique<lab::Run>(d, lab::make_world);
  run->run();
  expect_same_files(c.out_dir, dev_dir, what);
  return run;
}

}  // namespace

// The residency protocol through the staged executor in its resident mode: the Linear weights and
// biases and their momentum buffers live on the "device" between steps and SGD steps them there;
// the host's copies are poisoned (NaN) until someone asks for them, so every reader that forgets
// to (a broadcast, local SGD's average, DataParallel's replicate, a checkpoint, the final weights,
// an evaluation copy) would show in these bits. Every mode gives the CPU run's bits (the mlp: every
// layer is the CPU's own), and the device takes the parameters up only after the host wrote them.
TEST(DeviceResidency, ParametersOnTheDeviceGiveTheCpuRunsBits) {
  DTLAB_REQUIRE_DATASET();
  struct Case {
    const char* name;
    std::function<void(lab::RunConfig&)> set;
  };
  const std::vector<Case> cases = {
      {"ddp, momentum, checkpoints, periodic eval",
       [](lab::RunConfig& c) {
         c.checkpoint_every = 2;
         c.eval_every = 3;
         c.eval_samples = 32;
       }},
      {"ddp, SyncBN, nesterov, weight decay, no_sync",
       [](lab::RunConfig& c) {
         c.bn = "sync";
         c.nesterov = true;
         c.weight_decay = 1e-3;
         c.no_sync_steps = 1;
       }},
      {"ddp, no momentum", [](lab::RunConfig& c) { c.momentum = 0.0; }},
      {"ddp, Adam (its moments on the device), checkpoints",
       [](lab::RunConfig& c) {
         c.optimizer = "adam";
         c.lr = 1e-3;
         c.weight_decay = 1e-4;
         c.checkpoint_every = 2;
       }},
      {"dp, AdamW", [](lab::RunConfig& c) {
         c.mode = "dp";
         c.optimizer = "adamw";
         c.lr = 1e-3;
         c.weight_decay = 0.01;
       }},
      {"local-sgd, 3 ranks (the hook divides the bucket by 3 on the device: not a multiplication by 1/3)",
       [](lab::RunConfig& c) {
         c.world_size = 3;
         c.mode = "local-sgd";
         c.warmup_steps = 3;  // gradients allreduced (through the hook) for the first 3 steps
         c.average_every = 2;
         c.checkpoint_every = 3;
       }},
      {"dp", [](lab::RunConfig& c) { c.mode = "dp"; }},
      {"ddp, no overlap, tree allreduce (buckets staged through the host)",
       [](lab::RunConfig& c) {
         c.overlap = false;
         c.allreduce = "tree";
       }},
      {"ddp, uneven data, join (zero buckets on the device)",
       [](lab::RunConfig& c) {
         c.uneven_data = true;
         c.join = true;
         c.limit_train = 96;
         c.steps = 0;
         c.epochs = 1;
       }},
      {"ddp, naive allreduce (staged buckets)", [](lab::RunConfig& c) { c.allreduce = "naive"; }},
      {"ddp, skip non-finite steps (the device's finiteness test)",
       [](lab::RunConfig& c) {
         c.on_nonfinite = "skip-step";
         c.lr = 1e30;
       }},
      {"ddp, a NaN into rank 1's loss gradient on the device at step 2 (--fail-at nan), skipped",
       [](lab::RunConfig& c) {
         c.on_nonfinite = "skip-step";
         c.fail_rank = 1;
         c.fail_step = 2;
         c.fail_at = "nan";
       }},
      {"async (seeded: the free schedule is the arrival order)",
       [](lab::RunConfig& c) {
         c.mode = "async";
         c.async_schedule = "seeded";
       }},
  };
  for (const Case& k : cases) {
    testutil::TempDir cpu_dir, dev_dir;
    lab::RunConfig c = testutil::small_run("mlp", 2, cpu_dir.path(), 6);
    k.set(c);
    SimBackend backend(/*resident=*/true);
    const std::unique_ptr<lab::Run> run = cpu_then_sim(c, dev_dir.path(), k.name);  // alive below: g_sim

    const nlohmann::json s = nlohmann::json::parse(testutil::read_file(dev_dir.file("summary.json")));
    const int64_t steps = s["steps"].get<int64_t>();
    if (c.on_nonfinite == "skip-step") {  // the same steps skipped, the same sources named
      const nlohmann::json cs = nlohmann::json::parse(testutil::read_file(cpu_dir.file("summary.json")));
      ASSERT_TRUE(s.contains("nonfinite")) << k.name;
      EXPECT_GT(s["nonfinite"]["skipped"].size(), 0u) << k.name;
      EXPECT_EQ(s["nonfinite"], cs["nonfinite"]) << k.name;
    }
    int stepped = 0;
    for (const testutil::TrackedSim* e : g_sim)
      if (e) stepped += e->counters().device_steps;
    // the loss on the device (Model::forward_loss): every training forward of DDP, local SGD and
    // async; DataParallel gathers the logits on device 0 and computes the loss there, on the host
    for (size_t r = 0; r < 2; ++r) {
      ASSERT_NE(g_sim[r], nullptr) << k.name;
      if (c.mode == "dp")
        EXPECT_EQ(g_sim[r]->counters().device_losses, 0) << k.name;
      else
        EXPECT_GE(g_sim[r]->counters().device_losses, c.uneven_data ? 1 : steps) << k.name << " rank " << r;
    }
    // the mlp's three Linear and two BatchNorm1d layers: ten parameters stepped on the device per
    // optimizer step
    const int64_t per_step = 10;
    // The gradients: kept on the device where DDP's buckets live there (the ring on the threads
    // transport), brought to the host otherwise (staged buckets, the other modes).
    uint64_t grad_bytes = 0;
    for (const testutil::TrackedSim* e : g_sim)
      if (e) grad_bytes += e->counters().grad_bytes_to_host;
    const bool device_buckets = (c.mode == "ddp" || c.mode == "local-sgd") && c.allreduce == "ring";
    if (device_buckets) {
      EXPECT_EQ(grad_bytes, 0u) << k.name;
    } else if (c.mode != "async") {
      EXPECT_GT(grad_bytes, 0u) << k.name;
    }
    if (std::string(k.name).rfind("ddp", 0) == 0 && c.no_sync_steps == 0 && !c.join && c.on_nonfinite == "stop") {
      EXPECT_EQ(stepped, 2 * steps * per_step) << k.name;
      // the ten taken up once, after DDP's initial broadcast; never again: the device is their home
      for (size_t r = 0; r < 2; ++r) {
        ASSERT_NE(g_sim[r], nullptr);
        EXPECT_EQ(g_sim[r]->counters().params_uploaded, 10) << k.name << " rank " << r;
      }
    } else if (c.mode == "async") {
      EXPECT_EQ(stepped, 0) << k.name;  // the server steps (on the host); a worker only computes gradients
    } else {
      EXPECT_GT(stepped, 0) << k.name;
    }
  }
}

// BatchNorm whole on the device (executor.h: residency): its running statistics and
// num_batches_tracked live there from the first forward, its weight and bias are stepped there, and
// SyncBN gathers the statistics and reduces the gradient sums in the device's memory (the ring on
// the threads transport; staged through the host by the tree). The host's BatchNorm holds poisoned
// mirrors, brought down only for what reads them: bn_stats.bin's recorded steps, checkpoints, the
// final weights, DDP's buffer broadcast on rank 0. Every file is the CPU run's.
// --cuda-graphs on the simulated GPU: DDP's step of one rank goes through Model::graph_step, which
// the simulated GPU answers call by call (it captures nothing), so what runs here is the host's
// side of the graphed step: the optimizer's counting, the non-finite check after backward and the
// skip, the residency flags. Every file is the CPU run's (which has no --cuda-graphs), including
// a run whose gradients turn infinite (--on-nonfinite skip-step) and one with a --fail-at nan step
// (a step with a failure planned runs step by step).
TEST(DeviceResidency, TheGraphedStepGivesTheCpuRunsBits) {
  DTLAB_REQUIRE_DATASET();
  struct Case {
    const char* name;
    std::function<void(lab::RunConfig&)> set;
  };
  const std::vector<Case> cases = {
      {"momentum, weight decay, checkpoints, periodic eval",
       [](lab::RunConfig& c) {
         c.weight_decay = 1e-3;
         c.checkpoint_every = 3;
         c.eval_every = 4;
         c.eval_samples = 32;
       }},
      {"gradients that overflow, skipped", [](lab::RunConfig& c) {
         c.lr = 1e30;
         c.on_nonfinite = "skip-step";
       }},
      {"a NaN put into step 3's backward, skipped", [](lab::RunConfig& c) {
         c.fail_rank = 0;
         c.fail_at = "nan";
         c.fail_step = 3;
         c.on_nonfinite = "skip-step";
       }},
  };
  for (const Case& k : cases) {
    testutil::TempDir cpu_dir, dev_dir;
    lab::RunConfig c = testutil::small_run("mlp", 1, cpu_dir.path(), 9);
    k.set(c);
    SimBackend backend(/*resident=*/true);
    const std::unique_ptr<lab::Run> run = cpu_then_sim(c, dev_dir.path(), k.name, /*cuda_graphs=*/true);
    if (c.on_nonfinite == "skip-step") {
      EXPECT_NE(testutil::read_file(cpu_dir.file("metrics.jsonl")).find("\"skipped\":true"), std::string::npos) << k.name;
    }
  }
}

// How often a step waits for the device to say whether its gradients are finite: once per step
// where nothing is allreduced (one rank; the graphed step too), checked in one piece after
// backward; once per parameter where DDP's hook must check each gradient before its bucket's
// allreduce can spread it. (On a GPU each answer is a synchronizing download.)
TEST(DeviceResidency, GradientsAreCheckedInOnePieceWhereNothingIsAllreduced) {
  DTLAB_REQUIRE_DATASET();
  struct Case {
    int world;
    bool graphs;
    uint64_t answers_per_step;
  };
  for (const Case& k : {Case{1, false, 1}, Case{1, true, 1}, Case{2, false, 10}}) {
    testutil::TempDir cpu_dir, dev_dir;
    const int64_t steps = 6;
    lab::RunConfig c = testutil::small_run("mlp", k.world, cpu_dir.path(), steps);
    SimBackend backend(/*resident=*/true);
    const std::unique_ptr<lab::Run> run = cpu_then_sim(c, dev_dir.path(), "world " + std::to_string(k.world), k.graphs);
    for (int r = 0; r < k.world; ++r) {
      ASSERT_NE(g_sim[static_cast<size_t>(r)], nullptr);
      auto* mem = dynamic_cast<lab::SimDeviceMemory*>(g_sim[static_cast<size_t>(r)]->device_memory());
      ASSERT_NE(mem, nullptr);
      EXPECT_EQ(mem->finite_answers(), k.answers_per_step * steps)
          << "world " << k.world << (k.graphs ? ", graphs" : "") << ", rank " << r;
    }
  }
}

TEST(DeviceResidency, BatchNormLivesOnTheDeviceAndComesDownOnlyWhenRead) {
  DTLAB_REQUIRE_DATASET();
  struct Case {
    const char* name;
    std::function<void(lab::RunConfig&)> set;
  };
  const std::vector<Case> cases = {
      {"SyncBN, no buffer broadcast, every 3rd step recorded",
       [](lab::RunConfig& c) {
         c.bn = "sync";
         c.broadcast_buffers = false;
         c.record_bn = "3";
       }},
      {"SyncBN through the tree (staged), momentum=None, checkpoints",
       [](lab::RunConfig& c) {
         c.bn = "sync";
         c.allreduce = "tree";
         c.bn_momentum = std::nullopt;  // cumulative average: 1 / num_batches_tracked
         c.checkpoint_every = 4;
         c.record_bn = "all";
       }},
      {"local BatchNorm, DDP's buffer broadcast, nothing recorded",
       [](lab::RunConfig& c) {
         c.bn = "local";
         c.record_bn = "off";
       }},
  };
  for (const Case& k : cases) {
    testutil::TempDir cpu_dir, dev_dir;
    lab::RunConfig c = testutil::small_run("mlp", 2, cpu_dir.path(), 8);
    k.set(c);
    SimBackend backend(/*resident=*/true);
    const std::unique_ptr<lab::Run> run = cpu_then_sim(c, dev_dir.path(), k.name);  // alive below: g_sim
    const bool recorded = c.record_bn != "off";
    EXPECT_EQ(std::filesystem::exists(cpu_dir.file("bn_stats.bin")), recorded) << k.name;
    if (recorded) {
      EXPECT_TRUE(testutil::read_file(cpu_dir.file("bn_stats.bin")) == testutil::read_file(dev_dir.file("bn_stats.bin")))
          << k.name;
    }

    const int64_t steps = 8;
    int64_t recorded_steps = 0;
    for (int64_t s = 0; s < steps; ++s) recorded_steps += c.record_bn != "off" && lab::bn_recorded(c.record_bn, s, 0);
    for (size_t r = 0; r < 2; ++r) {
      ASSERT_NE(g_sim[r], nullptr) << k.name;
      const lab::SimCounters& n = g_sim[r]->counters();
      // the buckets in the device's memory (the ring): BatchNorm's gradients stay there too
      if (c.allreduce == "ring") {
        EXPECT_EQ(n.grad_bytes_to_host, 0u) << k.name << " rank " << r;
      }
      // the two layers' buffers taken up once (the first forward), or, where DDP broadcasts rank
      // 0's buffers, on rank 1 after each time the host wrote them: before each of its 8 training
      // forwards and before the first evaluation forward after training
      if (c.broadcast_buffers && r == 1) {
        EXPECT_EQ(n.buffers_uploaded, 2 * (steps + 1)) << k.name << " rank " << r;
      } else {
        EXPECT_EQ(n.buffers_uploaded, 2) << k.name << " rank " << r;
      }
      // brought down (two layers at a time) for the recorded steps, the checkpoints and the end (the
      // final weights, the buffers the summary compares): per step only where something reads them
      const int64_t reads = n.buffers_to_host / 2;
      if (c.broadcast_buffers && r == 0) {
        EXPECT_GE(reads, steps) << k.name;  // rank 0's buffers broadcast before every forward
      } else {
        EXPECT_GE(reads, recorded_steps) << k.name << " rank " << r;
        EXPECT_LE(reads, recorded_steps + 2 + (c.checkpoint_every > 0 ? steps / c.checkpoint_every : 0))
            << k.name << " rank " << r;
      }
    }
  }
}
