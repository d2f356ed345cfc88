// NCCL ranks as processes (`mpirun -np N dtlab run --comm nccl`), in CI without a GPU: every
// process of one mpirun job runs these tests, with the transport over the CPU model of CUDA and
// NCCL compiled in its process mode (nccl_model.cpp, NCCL_MODEL_PROCESSES: what crosses processes
// travels over MPI). MPI is started with the runtime dtlab's main starts for --comm nccl under
// mpirun (MpiRuntime; start_comm_runtime's choice of it is tested with the dtlab executable in
// tests/mpi), so the bootstrap is the product's: the world size and each rank's machine from MPI,
// rank 0's ncclUniqueId broadcast by the runtime, aborts carried between the processes.
// What is checked is the transport's logic across processes, not NCCL (tests/gpu on GPUs).
//
// Tests named NcclProcessesEnd.* end the world and run one per mpirun (tests/gpu/CMakeLists.txt).
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "communicator.h"
#include "device.h"
#include "errors.h"
#include "float_compare.h"
#include "mpi/mpi_runtime.h"
#include "mpi/mpi_test_shutdown.h"
#include "nccl/transport_nccl.h"
#include "rank_threads.h"
#include "threads/transport_threads.h"

namespace {

#define EXPECT_CONTAINS(text, part) EXPECT_NE(std::string(text).find(part), std::string::npos) << (text)

lab::RunConfig g_cfg;  // as dtlab's main leaves it: comm nccl, device cuda, world and machines from MPI
lab::MpiRuntime* g_rt = nullptr;
std::unique_ptr<lab::NcclWorld> g_world;

int rank() { return g_rt->rank(); }
int size() { return g_rt->size(); }

// This process's GPU, as make_world chooses it: the k-th rank of a machine on GPU k.
int my_gpu() { return lab::rank_device_map(g_cfg.compute, g_cfg.world_size, "nccl")[static_cast<size_t>(rank())]; }

// The world, started on first use (the NcclProcessesEnd tests start their own instead).
lab::NcclWorld& world() {
  if (!g_world) g_world = std::make_unique<lab::NcclWorld>(*g_rt, my_gpu(), g_cfg.timeout_s);
  return *g_world;
}
lab::Transport& me() { return world().transport(rank()); }

// What rank r contributes to a collective: reproducible from r alone, so every process can
// compute every rank's input.
std::vector<float> input(int r, size_t count) { return testutil::randn(count, 100 + static_cast<uint32_t>(r)); }

// The same collectives over emulated ranks in this process (threads transport): every rank's result.
std::vector<std::vector<float>> emulated(lab::AllreduceAlgorithm algo, size_t count) {
  lab::ThreadsWorld threads(size());
  std::vector<std::vector<float>> data(static_cast<size_t>(size()));
  for (int r = 0; r < size(); ++r) data[static_cast<size_t>(r)] = input(r, count);
  std::vector<std::thread> ts;
  for (int r = 0; r < size(); ++r)
    ts.emplace_back([&, r] {
      lab::Communicator c(threads.transport(r), nullptr);
      c.set_allreduce_algorithm(algo);
      c.allreduce_sum(data[static_cast<size_t>(r)].data(), count, {"x", 0});
    });
  for (auto& t : ts) t.join();
  return data;
}

TEST(NcclProcesses, EachProcessIsOneRankOnItsMachinesNextGpu) {
  ASSERT_GE(size(), 2) << "run under mpirun -np 2 or more";
  EXPECT_EQ(g_cfg.world_size, size());
  // One machine: every rank's machine is rank 0's, and the k-th rank takes GPU k.
  EXPECT_EQ(g_cfg.compute.rank_nodes, std::vector<int>(static_cast<size_t>(size()), 0));
  EXPECT_EQ(my_gpu(), rank());
  EXPECT_EQ(world().world_size(), size());
  EXPECT_EQ(world().local_ranks(), std::vector<int>{rank()});
  EXPECT_STREQ(me().name(), "nccl");
  EXPECT_EQ(me().rank(), rank());
  try {
    world().transport((rank() + 1) % size());
    ADD_FAILURE() << "another process's rank";
  } catch (const lab::ConfigError& e) {
    EXPECT_CONTAINS(e.what(), "runs in another process: this process is rank " + std::to_string(rank()));
  }
}

// The lab's allreduce algorithms over NCCL processes and over emulated ranks: the same order of
// additions, the same bits; the allgather and broadcast the lab also uses, and NCCL's own
// allreduce (the model sums in rank order).
TEST(NcclProcesses, EveryAlgorithmBitwiseEqualsTheThreadsTransport) {
  lab::Communicator c(me(), nullptr);
  for (auto algo : {lab::AllreduceAlgorithm::Ring, lab::AllreduceAlgorithm::Naive, lab::AllreduceAlgorithm::Tree})
    for (size_t count : {size_t{0}, size_t{3}, size_t{1000}, size_t{300001}}) {
      std::vector<float> mine = input(rank(), count);
      c.set_allreduce_algorithm(algo);
      c.allreduce_sum(mine.data(), count, {"x", 0});
      const auto want = emulated(algo, count);
      EXPECT_EQ(0, std::memcmp(mine.data(), want[static_cast<size_t>(rank())].data(), count * sizeof(float)))
          << lab::allreduce_algorithm_name(algo) << " count " << count;
    }
  std::vector<float> all(static_cast<size_t>(size()) * 5), row(5, static_cast<float>(rank()));
  c.allgather(row.data(), 5, all.data(), {"g", 0});
  for (int k = 0; k < size(); ++k) EXPECT_EQ(all[static_cast<size_t>(k) * 5 + 4], static_cast<float>(k)) << k;
  std::vector<char> b(100000, static_cast<char>(rank()));
  c.broadcast(b.data(), b.size(), size() - 1, {"b", 0});
  EXPECT_EQ(b.front(), static_cast<char>(size() - 1));
  EXPECT_EQ(b.back(), static_cast<char>(size() - 1));

  const size_t count = 1000;
  std::vector<float> mine = input(rank(), count), want = input(0, count);
  for (int r = 1; r < size(); ++r) {
    const std::vector<float> x = input(r, count);
    for (size_t i = 0; i < count; ++i) want[i] = want[i] + x[i];
  }
  c.set_allreduce_algorithm(lab::AllreduceAlgorithm::Native);
  c.allreduce_sum(mine.data(), count, {"native", 0});
  EXPECT_EQ(0, std::memcmp(mine.data(), want.data(), count * sizeof(float)));
}

// Rank 1 fails; the others, waiting in NCCL for it, stop at once with its reason (carried by MPI),
// long before their timeout.
TEST(NcclProcessesEnd, AFailedRankStopsTheOthersWithItsReason) {
  ASSERT_GE(size(), 3);
  lab::Transport& t = me();
  t.set_timeout(60);
  if (rank() == 1) {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the others are waiting by now
    t.abort("injected failure");
    EXPECT_TRUE(t.aborted());
    EXPECT_EQ(t.abort_reason(), "rank 1 failed: injected failure");
    return;
  }
  const auto t0 = std::chrono::steady_clock::now();
  float x = 0;
  try {
    t.recv(1, &x, sizeof x, 7);
    ADD_FAILURE() << "the receive from the failed rank returned";
  } catch (const lab::CommError& e) {
    EXPECT_CONTAINS(e.what(), "rank " + std::to_string(rank()) + ": recv from rank 1 aborted: rank 1 failed: injected failure");
  }
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 20.0);
  EXPECT_TRUE(t.aborted());
}

// Two processes of one machine on one GPU: NCCL's refusal, named, on every rank, and each rank
// tells the others.
TEST(NcclProcessesEnd, TwoProcessesOnOneGpuAreRefusedByNccl) {
  try {
    lab::NcclWorld w(*g_rt, 0, g_cfg.timeout_s);
    ADD_FAILURE() << "every rank on GPU 0 started";
  } catch (const lab::DeviceError& e) {
    EXPECT_CONTAINS(e.what(), "rank " + std::to_string(rank()) + ": NCCL could not start rank " + std::to_string(rank()) +
                                  " of " + std::to_string(size()) + " on GPU 0: ncclCommInitRankConfig for rank " +
                                  std::to_string(rank()) + " on GPU 0 failed: invalid usage");
    EXPECT_CONTAINS(e.what(), "Duplicate GPU detected");
  } catch (const lab::CommError& e) {
    ADD_FAILURE() << "every rank should see NCCL's own error first: " << e.what();
  }
  EXPECT_TRUE(g_rt->aborted());
}

}  // namespace

// MPI up as dtlab's main does it for `mpirun ... dtlab run --comm nccl --device cuda`, the tests,
// an orderly shutdown. A process whose tests fail exits non-zero, and its shutdown tells the others.
int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  g_cfg.comm = "nccl";
  g_cfg.compute.device = "cuda";
  g_cfg.timeout_s = 30;
  std::unique_ptr<lab::MpiRuntime> rt;
  int code = 0;
  std::string error;
  try {
    rt = std::make_unique<lab::MpiRuntime>(g_cfg.timeout_s, "nccl");
    g_rt = rt.get();
    rt->resolve_world(g_cfg, false);
    code = RUN_ALL_TESTS();
    if (code) error = "a test failed on rank " + std::to_string(g_rt->rank());
  } catch (const lab::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    code = 1;
    error = e.what();
  }
  g_world.reset();
  return mpitest::shutdown(rt.get(), code, error);
}
