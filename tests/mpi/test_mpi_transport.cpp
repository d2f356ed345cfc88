// TransportMpi tests that run as the processes of one mpirun job (mpi_test_main.cpp starts MPI):
// every process runs every test in the same order, each doing its own rank's part. Inputs are
// built so that sums are exact (rank r contributes r), and the ring allreduce over MPI is
// compared bit for bit with the same ring over emulated ranks computed in this process.
// Tests named MpiTransportAbort.* end the world and run one per mpirun (tests/mpi/CMakeLists.txt).
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "backends.h"
#include "communicator.h"
#include "errors.h"
#include "mpi_test_world.h"
#include "threads/transport_threads.h"

namespace {

#define EXPECT_CONTAINS(text, part) EXPECT_NE(std::string(text).find(part), std::string::npos) << (text)

lab::Transport& me() { return mpitest::world().transport(mpitest::rank()); }
int rank() { return mpitest::rank(); }
int size() { return mpitest::world().world_size(); }

// Rank r's input of the bitwise test: reproducible from r alone.
std::vector<float> random_input(int r, size_t count) {
  std::mt19937 gen(1234u + static_cast<unsigned>(r));
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(count);
  for (float& x : v) x = d(gen);
  return v;
}

TEST(MpiTransport, WorldComesFromMpi) {
  EXPECT_EQ(mpitest::world().local_ranks(), std::vector<int>{rank()});
  EXPECT_STREQ(me().name(), "mpi");
  EXPECT_GE(size(), 2) << "run under mpirun -np 2 or more";
  EXPECT_THROW(mpitest::world().transport((rank() + 1) % size()), lab::ConfigError);
}

TEST(MpiTransport, RingAllreduceIsExact) {
  lab::Communicator comm(me(), nullptr);
  const int n = size();
  for (size_t count : {size_t{1}, size_t{3}, size_t{1000}, size_t{100003}}) {
    std::vector<float> v(count);
    for (size_t i = 0; i < count; ++i) v[i] = static_cast<float>(rank() + static_cast<int>(i % 5) * n);
    comm.allreduce_sum(v.data(), count, {"exact", -1});
    size_t wrong = 0;
    for (size_t i = 0; i < count; ++i) {
      const float want = static_cast<float>(n * (n - 1) / 2 + static_cast<int>(i % 5) * n * n);
      wrong += v[i] != want;
    }
    EXPECT_EQ(wrong, 0u) << "count " << count;
  }
}

// The lab's ring over MPI and over threads: the same order of additions, the same bits.
TEST(MpiTransport, RingAllreduceMatchesEmulatedRanksBitwise) {
  const int n = size();
  const size_t count = 12345;
  std::vector<float> mine = random_input(rank(), count);
  lab::Communicator comm(me(), nullptr);
  comm.allreduce_sum(mine.data(), count, {"bitwise", -1});

  lab::ThreadsWorld emulated(n);
  std::vector<std::vector<float>> bufs(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    bufs[static_cast<size_t>(r)] = random_input(r, count);
    threads.emplace_back([&, r] {
      lab::Communicator c(emulated.transport(r), nullptr);
      c.allreduce_sum(bufs[static_cast<size_t>(r)].data(), count, {"bitwise", -1});
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(std::memcmp(mine.data(), bufs[static_cast<size_t>(rank())].data(), count * sizeof(float)), 0);
}

TEST(MpiTransport, BroadcastAndAllgather) {
  lab::Communicator comm(me(), nullptr);
  const int n = size();
  std::vector<char> buf(3 * 1024 * 1024 + 17);  // several broadcast segments
  for (size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<char>(rank() == 1 ? (i * 7) & 0x7f : 0);
  comm.broadcast(buf.data(), buf.size(), 1, {"bcast", -1});
  size_t wrong = 0;
  for (size_t i = 0; i < buf.size(); ++i) wrong += buf[i] != static_cast<char>((i * 7) & 0x7f);
  EXPECT_EQ(wrong, 0u);
  const float mine[2] = {static_cast<float>(rank()), static_cast<float>(10 * rank())};
  std::vector<float> all(static_cast<size_t>(2 * n));
  comm.allgather(mine, 2, all.data(), {"gather", -1});
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(all[static_cast<size_t>(2 * r)], static_cast<float>(r));
    EXPECT_EQ(all[static_cast<size_t>(2 * r + 1)], static_cast<float>(10 * r));
  }
}

TEST(MpiTransport, NativeAllreduceSums) {
  const int n = size();
  std::vector<float> v(4099);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(rank() + static_cast<int>(i % 3));
  me().native_allreduce_sum(v.data(), v.size());
  for (size_t i = 0; i < v.size(); ++i)
    ASSERT_EQ(v[i], static_cast<float>(n * (n - 1) / 2 + n * static_cast<int>(i % 3))) << i;
}

// Messages match by tag, in order per tag; run-internal tags at the top of the tag space do not
// meet collective tags that share their low bits.
TEST(MpiTransport, MatchesByTagInOrder) {
  const uint64_t kHigh = (uint64_t{1} << 62) + 5;
  if (rank() == 0) {
    const int a = 1, b = 2, c = 3, d = 4;
    me().send(1, &a, sizeof a, 5);
    me().send(1, &b, sizeof b, 6);
    me().send(1, &c, sizeof c, 5);
    me().send(1, &d, sizeof d, kHigh);
  } else if (rank() == 1) {
    int x = 0;
    me().recv(0, &x, sizeof x, kHigh);
    EXPECT_EQ(x, 4);
    me().recv(0, &x, sizeof x, 6);
    EXPECT_EQ(x, 2);
    me().recv(0, &x, sizeof x, 5);
    EXPECT_EQ(x, 1);
    me().recv(0, &x, sizeof x, 5);
    EXPECT_EQ(x, 3);
  }
  float sync = 0;  // everyone leaves together
  me().native_allreduce_sum(&sync, 1);
}

TEST(MpiTransport, SendrecvReduceAddsInPlace) {
  const int n = size();
  const int next = (rank() + 1) % n, prev = (rank() + n - 1) % n;
  std::vector<float> out(1000, static_cast<float>(rank())), acc(1000, 0.5f);
  me().sendrecv_reduce(next, out.data(), out.size(), prev, acc.data(), acc.size(), 77);
  for (float x : acc) ASSERT_EQ(x, 0.5f + static_cast<float>(prev));
  std::vector<char> s(5, static_cast<char>('a' + rank())), r(5, 0);
  me().sendrecv(next, s.data(), s.size(), prev, r.data(), r.size(), 78);
  EXPECT_EQ(r, std::vector<char>(5, static_cast<char>('a' + prev)));
}

// ---- one per mpirun: these end the world ----

TEST(MpiTransportAbort, AbortReachesWaitersAndPollers) {
  if (rank() == size() - 1) {
    me().abort("out of memory");
  } else if (rank() == 0) {
    char b[1];
    try {
      me().recv(1, b, 1, 3);  // rank 1 never sends
      FAIL() << "recv returned";
    } catch (const lab::CommError& e) {
      EXPECT_EQ(std::string(e.what()),
                "rank 0: recv from rank 1 aborted: rank " + std::to_string(size() - 1) + " failed: out of memory");
    }
  } else {
    const auto t0 = std::chrono::steady_clock::now();
    while (!me().aborted() && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(20))
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_TRUE(me().aborted());
  EXPECT_EQ(me().abort_reason(), "rank " + std::to_string(size() - 1) + " failed: out of memory");
}

// Rank 0 waits for rank 2, rank 2 waits for rank 1, rank 1 only polls: rank 0's timeout names
// rank 1 through the chain.
TEST(MpiTransportAbort, TimeoutFollowsTheWaitChain) {
  ASSERT_GE(size(), 3);
  char b[1];
  if (rank() == 0) {
    me().set_timeout(1.0);
    try {
      me().recv(2, b, 1, 9);
      FAIL() << "recv returned";
    } catch (const lab::CommError& e) {
      EXPECT_EQ(std::string(e.what()),
                "rank 0: timed out after 1 s waiting for rank 2 (recv from rank 2, tag 9); rank 2 waits for rank 1; "
                "rank 1 is not waiting in any transport call (busy elsewhere, or it has left this collective)");
    }
  } else if (rank() == 2) {
    me().set_timeout(30.0);
    EXPECT_THROW(me().recv(1, b, 1, 9), lab::CommError);
  } else {
    const auto t0 = std::chrono::steady_clock::now();
    while (!me().aborted() && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(20))
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_TRUE(me().aborted());
  EXPECT_CONTAINS(me().abort_reason(), "rank 0: timed out after 1 s");
}

TEST(MpiTransportAbort, SizeMismatchAbortsTheWorld) {
  char b[8] = {};
  if (rank() == 0) {
    me().send(1, "12345678", 8, 3);
  } else if (rank() == 1) {
    try {
      me().recv(0, b, 4, 3);
      FAIL() << "recv returned";
    } catch (const lab::CommError& e) {
      EXPECT_CONTAINS(e.what(), "size mismatch: rank 0 sent more than 4 bytes, rank 1 expects 4 bytes");
    }
  }
  if (rank() != 1) {
    try {
      me().recv(1, b, 1, 4);  // never sent: ends by the abort
      FAIL() << "recv returned";
    } catch (const lab::CommError& e) {
      EXPECT_CONTAINS(e.what(), "size mismatch");
    }
  }
  EXPECT_TRUE(me().aborted());
}

TEST(MpiTransportAbort, NativeAllreduceTimeoutNamesTheAbsentRank) {
  me().set_timeout(1.0);
  if (rank() == 1) {
    const auto t0 = std::chrono::steady_clock::now();
    while (!me().aborted() && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(20))
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
  } else {
    float x = 1;
    try {
      me().native_allreduce_sum(&x, 1);
      FAIL() << "allreduce returned";
    } catch (const lab::CommError& e) {
      EXPECT_CONTAINS(e.what(), "rank 1 is not waiting in any transport call");
    }
  }
  EXPECT_TRUE(me().aborted());
  EXPECT_CONTAINS(me().abort_reason(), "timed out after 1 s in native allreduce (MPI_Iallreduce)");
}

}  // namespace
