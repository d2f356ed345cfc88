// The NCCL transport with more ranks than a lent GPU machine has, against the CPU model of CUDA and
// NCCL (nccl_model.cpp; label nccl-model, NCCL_MODEL_GPUS=4): every lab collective over it bitwise
// equal to the threads transport's, an abort from another thread, a timeout that fails every rank
// at once, bad peers and empty messages. What these check is the transport's logic, not NCCL.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <random>
#include <stdexcept>
#include <thread>

#include "communicator.h"
#include "errors.h"
#include "gpu_test_util.h"
#include "events.h"
#include "nccl/transport_nccl.h"
#include "threads/transport_threads.h"

namespace {

using gputest::message_of;
using gputest::randn;
using gputest::run_ranks;

// Every rank: allreduce of its own random values with `algo`, an allgather and a broadcast from
// rank 2 (checked here); returns each rank's allreduce result.
std::vector<std::vector<float>> collectives(lab::World& w, lab::AllreduceAlgorithm algo, size_t count) {
  const int n = w.world_size();
  std::vector<std::vector<float>> data(static_cast<size_t>(n));
  std::vector<lab::EventLog> logs(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) data[static_cast<size_t>(r)] = randn(count, 100 + static_cast<uint32_t>(r));
  const auto errors = run_ranks(n, [&](int r) {
    lab::Communicator c(w.transport(r), &logs[static_cast<size_t>(r)]);
    c.set_allreduce_algorithm(algo);
    c.allreduce_sum(data[static_cast<size_t>(r)].data(), count, {"x", 0});
    std::vector<float> all(static_cast<size_t>(n) * 5), mine(5, static_cast<float>(r));
    c.allgather(mine.data(), 5, all.data(), {"g", 0});
    for (int k = 0; k < n; ++k)
      if (all[static_cast<size_t>(k) * 5] != static_cast<float>(k)) throw std::runtime_error("allgather: wrong row");
    std::vector<char> b(100000, static_cast<char>(r));
    c.broadcast(b.data(), b.size(), 2, {"b", 0});
    if (b.back() != 2) throw std::runtime_error("broadcast: not rank 2's bytes");
  });
  for (int r = 0; r < n; ++r) EXPECT_FALSE(errors[static_cast<size_t>(r)]) << message_of(errors[static_cast<size_t>(r)]);
  return data;
}

}  // namespace

TEST(NcclModel, FourRanksEveryAlgorithmBitwiseEqualsTheThreadsTransport) {
  lab::NcclWorld nccl({0, 1, 2, 3}, 20);
  lab::ThreadsWorld threads(4);
  for (auto algo : {lab::AllreduceAlgorithm::Ring, lab::AllreduceAlgorithm::Naive, lab::AllreduceAlgorithm::Tree})
    for (size_t count : {size_t{0}, size_t{3}, size_t{1000}, size_t{300001}}) {
      const auto a = collectives(nccl, algo, count), b = collectives(threads, algo, count);
      for (size_t r = 0; r < 4; ++r)
        EXPECT_EQ(0, std::memcmp(a[r].data(), b[r].data(), count * sizeof(float)))
            << lab::allreduce_algorithm_name(algo) << " count " << count << " rank " << r;
    }
  // NCCL's own allreduce (the model sums in rank order): the same result on every rank
  const auto x = collectives(nccl, lab::AllreduceAlgorithm::Native, 1000);
  for (size_t r = 1; r < 4; ++r) EXPECT_EQ(0, std::memcmp(x[0].data(), x[r].data(), 1000 * sizeof(float))) << r;
}

TEST(NcclModel, AnAbortFromAnotherThreadStopsEveryRank) {
  lab::NcclWorld w({0, 1, 2}, 20);
  std::atomic<int> waiting{0};
  std::thread killer([&] {  // as Run::~Run aborts every rank
    while (waiting < 3) std::this_thread::yield();
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    for (int r = 0; r < 3; ++r) w.transport(r).abort("the run was destroyed");
  });
  const auto errors = run_ranks(3, [&](int r) {
    std::vector<char> b(1000);
    ++waiting;
    w.transport(r).recv((r + 1) % 3, b.data(), b.size(), 0);  // every rank waits, none sends
  });
  killer.join();
  for (int r = 0; r < 3; ++r)
    EXPECT_NE(message_of(errors[static_cast<size_t>(r)]).find("aborted: rank 0 failed: the run was destroyed"),
              std::string::npos)
        << message_of(errors[static_cast<size_t>(r)]);
}

TEST(NcclModel, ATimeoutOnOneRankFailsTheOthersAtOnce) {
  lab::NcclWorld w({0, 1, 2}, 20);
  w.transport(0).set_timeout(0.5);
  const auto t0 = std::chrono::steady_clock::now();
  const auto errors = run_ranks(3, [&](int r) {
    std::vector<char> b(10);
    if (r == 0) w.transport(0).recv(2, b.data(), 10, 1);  // rank 2 never sends
    if (r == 1) w.transport(1).recv(0, b.data(), 10, 1);  // rank 0 never sends either
  });
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 1.5);
  EXPECT_NE(message_of(errors[0]).find("rank 0: timed out after 0.5 s waiting for rank 2"), std::string::npos)
      << message_of(errors[0]);
  EXPECT_NE(message_of(errors[1]).find("rank 1: recv from rank 0 aborted: rank 0: timed out"), std::string::npos)
      << message_of(errors[1]);
}

TEST(NcclModel, BadPeersEmptyMessagesAndBadWorlds) {
  {
    lab::NcclWorld w({0, 1}, 5);
    EXPECT_THROW(w.transport(0).send(2, nullptr, 0, 0), lab::CommError);
    const auto errors = run_ranks(2, [&](int r) { w.transport(r).sendrecv(1 - r, nullptr, 0, 1 - r, nullptr, 0, 0); });
    EXPECT_FALSE(errors[0]) << message_of(errors[0]);
    EXPECT_FALSE(errors[1]) << message_of(errors[1]);
  }
  EXPECT_THROW(lab::NcclWorld({}, 1), lab::ConfigError);
  EXPECT_THROW(lab::NcclWorld({0, 7}, 1), lab::DeviceError);  // no GPU 7
}
