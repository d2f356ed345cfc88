// The NCCL transport (backends/nccl) on real GPUs, one rank per GPU, ranks as threads. Label
// "gpu". Without a GPU every test reports SKIPPED with the probe's reason. With one GPU, the
// world-1 tests run (ncclAllReduce of one rank, a sendrecv with itself, the lab's ring over it)
// and so does NCCL's own refusal of two ranks on one GPU; the two-rank tests report SKIPPED,
// saying they need two GPUs. The same file also runs in CI against a CPU model of CUDA and NCCL
// (nccl_model.cpp, label nccl-model), which checks the transport's logic without a GPU.
//
// Yardsticks: every comparison is bitwise. One rank's allreduce is a copy; two ranks' is one IEEE
// addition per element (a + b == b + a, whatever NCCL's algorithm); the lab's ring over NCCL
// adds the same operands in the same order as over the threads transport (the base class's
// sendrecv_reduce adds in index order, as transport_threads does).
//
// Sections: helpers | one rank | two ranks on one GPU | two GPUs
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "communicator.h"
#include "device_memory.h"
#include "cuda_device.h"
#include "gpu_test_util.h"
#include "errors.h"
#include "events.h"
#include "nccl/transport_nccl.h"
#include "ring_allreduce.h"
#include "threads/transport_threads.h"

namespace {

// ---- helpers ----

using gputest::message_of;
using gputest::probe;
using gputest::run_ranks;
using gputest::randn;
using testutil::same_bits;

#define SKIP_WITHOUT_TWO_GPUS()                                                                          \
  if (!probe().ok()) GTEST_SKIP() << probe().reason;                                                     \
  if (probe().devices.size() < 2)                                                                        \
  GTEST_SKIP() << "needs 2 GPUs (NCCL refuses two ranks on one GPU); this machine has " << probe().devices.size()

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

std::vector<unsigned char> random_bytes(size_t n, uint32_t seed) {
  std::mt19937 g(seed);
  std::vector<unsigned char> v(n);
  for (unsigned char& b : v) b = static_cast<unsigned char>(g());
  return v;
}

template <class E>
bool throws_a(const std::exception_ptr& p) {
  if (!p) return false;
  try {
    std::rethrow_exception(p);
  } catch (const E&) {
    return true;
  } catch (...) {
    return false;
  }
}

void expect_no_errors(const std::vector<std::exception_ptr>& errors) {
  for (size_t r = 0; r < errors.size(); ++r) EXPECT_FALSE(errors[r]) << "rank " << r << ": " << message_of(errors[r]);
}

// The lab's rings over `world`: each rank's inputs[r] (count floats) reduced in place by
// ring_allreduce, then by ring_allreduce_pipelined with 4 KB segments (many steps per chunk).
std::vector<std::vector<float>> ring_over(lab::World& world, std::vector<std::vector<float>> data, bool pipelined) {
  const int n = world.world_size();
  std::vector<lab::EventLog> logs(static_cast<size_t>(n));
  expect_no_errors(run_ranks(n, [&](int r) {
    lab::Communicator comm(world.transport(r), &logs[static_cast<size_t>(r)]);
    std::vector<float>& d = data[static_cast<size_t>(r)];
    if (pipelined)
      lab::ring_allreduce_pipelined(comm, d.data(), d.size(), {"test", 1}, 4096);
    else
      lab::ring_allreduce(comm, d.data(), d.size(), {"test", 0});
  }));
  return data;
}

const std::vector<size_t> kCounts = {0, 1, 3, 1000, (size_t{1} << 20) + 3};

// Device memory for the transport's device-buffer calls, with nothing but the CUDA runtime calls
// the transport itself makes (so that it also runs against the CPU model of CUDA and NCCL): its
// copies are cudaMemcpyAsync on a stream of its own, waited for; its add brings both operands to
// the host, adds in index order and puts the sum back (the bits of the CPU's add).
class RuntimeOnlyMemory final : public lab::DeviceMemory {
 public:
  explicit RuntimeOnlyMemory(int device) : m_device(device) {
    cudaSetDevice(device);
    cudaStreamCreateWithFlags(&m_stream, cudaStreamNonBlocking);
  }
  ~RuntimeOnlyMemory() override { cudaStreamDestroy(m_stream); }
  std::string name() const override { return "cuda:" + std::to_string(m_device); }
  void copy(void* dst, const void* src, size_t bytes) override { memcpy(dst, src, bytes, cudaMemcpyDeviceToDevice); }
  void download(void* host, const void* device, size_t bytes) override { memcpy(host, device, bytes, cudaMemcpyDeviceToHost); }
  void upload(void* device, const void* host, size_t bytes) override { memcpy(device, host, bytes, cudaMemcpyHostToDevice); }
  void add(float* acc, const float* in, size_t count) override {
    std::vector<float> a(count), b(count);
    download(a.data(), acc, count * 4);
    download(b.data(), in, count * 4);
    for (size_t i = 0; i < count; ++i) a[i] += b[i];
    upload(acc, a.data(), count * 4);
    ++adds;
  }
  void scale(float*, float, size_t) override { ADD_FAILURE() << "not used by the collectives"; }
  void divide(float*, float, size_t) override { ADD_FAILURE() << "not used by the collectives"; }
  bool all_finite(const float*, size_t) override { return true; }
  void* allocate(size_t bytes) override {
    cudaSetDevice(m_device);
    void* p = nullptr;
    cudaMalloc(&p, bytes ? bytes : 1);
    return p;
  }
  void release(void* p) override { cudaFree(p); }
  int adds = 0;

 private:
  void memcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
    if (bytes == 0) return;
    cudaSetDevice(m_device);
    ASSERT_EQ(cudaMemcpyAsync(dst, src, bytes, kind, m_stream), cudaSuccess);
    while (cudaStreamQuery(m_stream) == cudaErrorNotReady) std::this_thread::yield();
  }
  int m_device;
  cudaStream_t m_stream = nullptr;
};

// The lab's pipelined ring (and, native, NCCL's own allreduce) through the Communicator on buffers
// in device memory, one rank per GPU: each rank's inputs[r] uploaded, reduced where it is, brought
// back. counts[r]: the adds rank r's device memory made (0 for NCCL's own).
std::vector<std::vector<float>> on_device_over(lab::World& world, const std::vector<std::vector<float>>& inputs,
                                               bool native, std::vector<int>* adds = nullptr) {
  const int n = world.world_size();
  std::vector<std::vector<float>> out(static_cast<size_t>(n));
  std::vector<lab::EventLog> logs(static_cast<size_t>(n));
  if (adds) adds->assign(static_cast<size_t>(n), 0);
  expect_no_errors(run_ranks(n, [&](int r) {
    RuntimeOnlyMemory mem(r);
    lab::Communicator comm(world.transport(r), &logs[static_cast<size_t>(r)]);
    comm.set_allreduce_algorithm(native ? lab::AllreduceAlgorithm::Native : lab::AllreduceAlgorithm::Ring);
    EXPECT_TRUE(comm.allreduce_on_device());
    const std::vector<float>& in = inputs[static_cast<size_t>(r)];
    float* dev = static_cast<float*>(mem.allocate(in.size() * 4));
    mem.upload(dev, in.data(), in.size() * 4);
    comm.allreduce_sum(dev, in.size(), {"test", 3}, &mem);
    out[static_cast<size_t>(r)].resize(in.size());
    mem.download(out[static_cast<size_t>(r)].data(), dev, in.size() * 4);
    mem.release(dev);
    if (adds) (*adds)[static_cast<size_t>(r)] = mem.adds;
  }));
  return out;
}

// ---- one rank ----

TEST(NcclOneRank, WorldAndNativeAllreduceIsACopy) {
  SKIP_WITHOUT_GPU();
  lab::NcclWorld world({0}, 30.0);
  EXPECT_EQ(world.world_size(), 1);
  EXPECT_EQ(world.local_ranks(), std::vector<int>{0});
  EXPECT_THROW(world.transport(1), lab::ConfigError);
  lab::Transport& t = world.transport(0);
  EXPECT_STREQ(t.name(), "nccl");
  EXPECT_EQ(t.rank(), 0);
  EXPECT_EQ(t.world_size(), 1);
  EXPECT_DOUBLE_EQ(t.timeout(), 30.0);
  for (size_t count : kCounts) {
    const std::vector<float> in = randn(count, 11 + static_cast<uint32_t>(count));
    std::vector<float> data = in;
    t.native_allreduce_sum(data.data(), count);
    EXPECT_TRUE(same_bits(data, in)) << "count " << count;
  }
  unsigned char byte = 0;
  EXPECT_THROW(t.recv_any({0}, &byte, 1, 0), lab::ConfigError);
  EXPECT_FALSE(t.aborted());
}

// A sendrecv with itself: NCCL runs the send and the receive of one group to its own rank.
// Sizes go up and down, so the staging buffers grow and are reused.
TEST(NcclOneRank, SendrecvWithItselfRoundtripsBytes) {
  SKIP_WITHOUT_GPU();
  lab::NcclWorld world({0}, 30.0);
  lab::Transport& t = world.transport(0);
  const std::vector<size_t> sizes = {0, 1, 7, 4096, (size_t{1} << 20) + 5, size_t{3} << 20, 100};
  for (size_t i = 0; i < sizes.size(); ++i) {
    const std::vector<unsigned char> in = random_bytes(sizes[i], 100 + static_cast<uint32_t>(i));
    std::vector<unsigned char> out(in.size());
    for (size_t k = 0; k < out.size(); ++k) out[k] = static_cast<unsigned char>(~in[k]);  // poison: every byte wrong
    t.sendrecv(0, in.data(), in.size(), 0, out.data(), out.size(), i);
    EXPECT_TRUE(out == in) << sizes[i] << " bytes";
  }
}

// World 1: the ring sends nothing, and the Communicator's algorithms leave the data as it was.
TEST(NcclOneRank, LabRingAndNativeThroughTheCommunicatorLeaveTheInput) {
  SKIP_WITHOUT_GPU();
  lab::NcclWorld world({0}, 30.0);
  for (size_t count : kCounts) {
    const std::vector<float> in = randn(count, 7 + static_cast<uint32_t>(count));
    EXPECT_TRUE(same_bits(ring_over(world, {in}, false)[0], in)) << "ring, count " << count;
    EXPECT_TRUE(same_bits(ring_over(world, {in}, true)[0], in)) << "pipelined ring, count " << count;
    lab::EventLog log;
    lab::Communicator comm(world.transport(0), &log);
    comm.set_allreduce_algorithm(lab::AllreduceAlgorithm::Native);
    std::vector<float> data = in;
    comm.allreduce_sum(data.data(), count, {"test", 2});
    EXPECT_TRUE(same_bits(data, in)) << "native through the Communicator, count " << count;
  }
}

// World 1 on device memory: NCCL's own allreduce in place (a copy of the input), no staging.
TEST(NcclOneRank, NativeAllreduceOnDeviceBuffersLeavesTheInput) {
  SKIP_WITHOUT_GPU();
  lab::NcclWorld world({0}, 30.0);
  for (size_t count : kCounts) {
    const std::vector<float> in = randn(count, 41 + static_cast<uint32_t>(count));
    EXPECT_TRUE(same_bits(on_device_over(world, {in}, true)[0], in)) << "native, count " << count;
    EXPECT_TRUE(same_bits(on_device_over(world, {in}, false)[0], in)) << "ring, count " << count;
  }
}

// ---- two ranks on one GPU ----

// NCCL 2.28 refuses two ranks of one communicator on one GPU: the world must say so (DeviceError
// with NCCL's "invalid usage"), not hang. The caller normally refuses such a map itself first.
TEST(NcclTwoRanksOneGpu, RefusedWithDeviceError) {
  SKIP_WITHOUT_GPU();
  const auto t0 = std::chrono::steady_clock::now();
  try {
    lab::NcclWorld world({0, 0}, 10.0);
    FAIL() << "NCCL started two ranks on GPU 0";
  } catch (const lab::DeviceError& e) {
    const std::string msg = e.what();
    std::printf("# two ranks on GPU 0: %s\n#   hint: %s\n", msg.c_str(), e.hint().c_str());
    EXPECT_NE(msg.find("NCCL could not start 2 ranks on GPUs 0, 0"), std::string::npos) << msg;
    EXPECT_NE(msg.find("invalid usage"), std::string::npos) << "not NCCL's own refusal: " << msg;
    EXPECT_FALSE(e.hint().empty());
  }
  EXPECT_LT(seconds_since(t0), 12.0);
}

// ---- two GPUs ----

TEST(NcclTwoRanks, SendrecvAndSendRecvRoundtripBytes) {
  SKIP_WITHOUT_TWO_GPUS();
  lab::NcclWorld world({0, 1}, 30.0);
  const std::vector<size_t> sizes = {0, 1, 4096, (size_t{1} << 20) + 5};
  std::vector<std::vector<std::vector<unsigned char>>> got(2);  // got[rank][i]: from sendrecv, then send/recv
  expect_no_errors(run_ranks(2, [&](int r) {
    lab::Transport& t = world.transport(r);
    const int peer = 1 - r;
    for (size_t i = 0; i < sizes.size(); ++i) {
      const std::vector<unsigned char> in = random_bytes(sizes[i], 10 * static_cast<uint32_t>(r) + i);
      std::vector<unsigned char> out(sizes[i], 0);
      t.sendrecv(peer, in.data(), in.size(), peer, out.data(), out.size(), i);
      got[static_cast<size_t>(r)].push_back(out);
      if (r == 0) t.send(1, in.data(), in.size(), 100 + i);
      if (r == 1) t.recv(0, out.data(), out.size(), 100 + i);
      got[static_cast<size_t>(r)].push_back(out);
    }
  }));
  for (size_t i = 0; i < sizes.size(); ++i) {
    const std::vector<unsigned char> from0 = random_bytes(sizes[i], static_cast<uint32_t>(i));
    const std::vector<unsigned char> from1 = random_bytes(sizes[i], 10 + static_cast<uint32_t>(i));
    EXPECT_TRUE(got[0][2 * i] == from1) << "rank 0 sendrecv, " << sizes[i] << " bytes";
    EXPECT_TRUE(got[1][2 * i] == from0) << "rank 1 sendrecv, " << sizes[i] << " bytes";
    EXPECT_TRUE(got[1][2 * i + 1] == from0) << "rank 1 recv, " << sizes[i] << " bytes";
  }
}

TEST(NcclTwoRanks, NativeAllreduceIsTheSum) {
  SKIP_WITHOUT_TWO_GPUS();
  lab::NcclWorld world({0, 1}, 30.0);
  for (size_t count : kCounts) {
    const std::vector<float> a = randn(count, 1), b = randn(count, 2);
    std::vector<float> want(count);
    for (size_t i = 0; i < count; ++i) want[i] = a[i] + b[i];
    std::vector<std::vector<float>> data = {a, b};
    expect_no_errors(run_ranks(2, [&](int r) {
      world.transport(r).native_allreduce_sum(data[static_cast<size_t>(r)].data(), count);
    }));
    EXPECT_TRUE(same_bits(data[0], want)) << "rank 0, count " << count;
    EXPECT_TRUE(same_bits(data[1], want)) << "rank 1, count " << count;
  }
}

TEST(NcclTwoRanks, LabRingBitwiseEqualsTheThreadsTransportsRing) {
  SKIP_WITHOUT_TWO_GPUS();
  lab::NcclWorld nccl({0, 1}, 30.0);
  lab::ThreadsWorld threads(2);
  for (size_t count : kCounts)
    for (bool pipelined : {false, true}) {
      const std::vector<std::vector<float>> in = {randn(count, 21), randn(count, 22)};
      const auto want = ring_over(threads, in, pipelined);
      const auto got = ring_over(nccl, in, pipelined);
      for (int r = 0; r < 2; ++r)
        EXPECT_TRUE(same_bits(got[static_cast<size_t>(r)], want[static_cast<size_t>(r)]))
            << "rank " << r << ", count " << count << (pipelined ? ", pipelined" : "");
    }
}

// Buffers in device memory (Communicator::allreduce_sum's `mem`): NCCL sends from and receives into
// them where they are, the ring's reduction is the device memory's add; the bits are the threads
// transport's ring and, for NCCL's own allreduce, a + b.
TEST(NcclTwoRanks, LabRingAndNativeOnDeviceBuffersGiveTheHostsBits) {
  SKIP_WITHOUT_TWO_GPUS();
  lab::NcclWorld nccl({0, 1}, 30.0);
  lab::ThreadsWorld threads(2);
  for (size_t count : kCounts) {
    const std::vector<std::vector<float>> in = {randn(count, 31), randn(count, 32)};
    const auto want = ring_over(threads, in, true);
    std::vector<int> adds;
    const auto got = on_device_over(nccl, in, false, &adds);
    for (int r = 0; r < 2; ++r) {
      EXPECT_TRUE(same_bits(got[static_cast<size_t>(r)], want[static_cast<size_t>(r)])) << "rank " << r << ", count " << count;
      if (count >= 2) {
        EXPECT_GT(adds[static_cast<size_t>(r)], 0) << "the reduction is the device's";
      }
    }
    const auto native = on_device_over(nccl, in, true);
    for (size_t i = 0; i < count; ++i) {
      const float sum = in[0][i] + in[1][i];
      ASSERT_TRUE(same_bits(std::vector<float>{native[0][i]}, {sum})) << "native, element " << i;
      ASSERT_TRUE(same_bits(std::vector<float>{native[1][i]}, {sum})) << "native, element " << i;
    }
  }
}

// Rank 1 fails while rank 0 waits in a recv from it: rank 0 stops at once with rank 1's reason.
TEST(NcclTwoRanks, AnAbortOnRank1FailsRank0sPendingRecv) {
  SKIP_WITHOUT_TWO_GPUS();
  lab::NcclWorld world({0, 1}, 10.0);
  double waited = 0;
  const auto errors = run_ranks(2, [&](int r) {
    lab::Transport& t = world.transport(r);
    if (r == 1) {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      t.abort("injected failure");
      return;
    }
    std::vector<unsigned char> buf(4096);
    const auto t0 = std::chrono::steady_clock::now();
    try {
      t.recv(1, buf.data(), buf.size(), 5);
    } catch (...) {
      waited = seconds_since(t0);
      throw;
    }
  });
  EXPECT_FALSE(errors[1]);
  ASSERT_TRUE(throws_a<lab::CommError>(errors[0])) << message_of(errors[0]);
  EXPECT_EQ(message_of(errors[0]), "rank 0: recv from rank 1 aborted: rank 1 failed: injected failure");
  EXPECT_LT(waited, 10.0);
  EXPECT_TRUE(world.transport(0).aborted());
  EXPECT_EQ(world.transport(0).abort_reason(), "rank 1 failed: injected failure");
  // Every later call fails at once with the same reason.
  float x = 1.0f;
  EXPECT_THROW(world.transport(1).native_allreduce_sum(&x, 1), lab::CommError);
}

// Rank 1 never sends: rank 0's recv times out after its timeout, naming rank 1, and fails the world.
TEST(NcclTwoRanks, ATimeoutNamesTheRankThatNeverSent) {
  SKIP_WITHOUT_TWO_GPUS();
  lab::NcclWorld world({0, 1}, 30.0);
  world.transport(0).set_timeout(1.0);
  double waited = 0;
  const auto errors = run_ranks(2, [&](int r) {
    if (r == 1) return;
    std::vector<unsigned char> buf(64);
    const auto t0 = std::chrono::steady_clock::now();
    try {
      world.transport(0).recv(1, buf.data(), buf.size(), 9);
    } catch (...) {
      waited = seconds_since(t0);
      throw;
    }
  });
  ASSERT_TRUE(throws_a<lab::CommError>(errors[0])) << message_of(errors[0]);
  EXPECT_EQ(message_of(errors[0]),
            "rank 0: timed out after 1 s waiting for rank 1 (recv from rank 1: ncclRecv of 64 bytes, tag 9)");
  EXPECT_GE(waited, 1.0);
  EXPECT_LT(waited, 3.0);
  EXPECT_TRUE(world.transport(1).aborted());
}

// Time while the hold flag is set does not count: a recv held for 1.5 s with a 1 s timeout
// completes when its sender comes.
TEST(NcclTwoRanks, HeldTimeDoesNotCountTowardsTheTimeout) {
  SKIP_WITHOUT_TWO_GPUS();
  lab::NcclWorld world({0, 1}, 30.0);
  std::atomic<bool> hold{true};
  world.transport(0).set_timeout(1.0);
  world.transport(0).set_hold_flag(&hold);
  const std::vector<unsigned char> sent = random_bytes(256, 3);
  std::vector<unsigned char> got(256, 0);
  expect_no_errors(run_ranks(2, [&](int r) {
    if (r == 0) {
      world.transport(0).recv(1, got.data(), got.size(), 1);
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    hold = false;
    world.transport(1).send(0, sent.data(), sent.size(), 1);
  }));
  EXPECT_TRUE(got == sent);
}

}  // namespace
