// The threads transport: matching, zero-copy exchange, timeouts, the hold flag, abort and
// failure propagation through the Communicator. Timeouts here are short (0.3 - 2 s) and every
// test asserts how long the failing calls took: a failure must never turn into a hang.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "errors.h"
#include "rank_threads.h"

namespace {

using labtest::message_of;
using labtest::RankWorld;

// gmock is not linked: a plain substring check that prints the whole message on failure.
#define EXPECT_CONTAINS(text, part) \
  EXPECT_NE(std::string(text).find(part), std::string::npos) << "message: " << (text)

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

TEST(TransportThreads, WorldSizeMustBePositive) {
  EXPECT_THROW(lab::ThreadsWorld(0), lab::ConfigError);
  lab::ThreadsWorld w(2);
  EXPECT_THROW(w.transport(2), lab::ConfigError);
  EXPECT_THROW(w.transport(0).send(5, "x", 1, 0), lab::CommError);
  EXPECT_STREQ(w.transport(1).name(), "threads");
  EXPECT_EQ(w.transport(1).rank(), 1);
  EXPECT_EQ(w.transport(1).world_size(), 2);
}

// Messages on one (src, dst) pair are matched by tag, in posting order within a tag.
TEST(TransportThreads, MatchesByTagInOrder) {
  lab::ThreadsWorld w(2);
  auto& t0 = w.transport(0);
  auto& t1 = w.transport(1);
  t0.send(1, "a", 1, 1);
  t0.send(1, "b", 1, 2);
  t0.send(1, "c", 1, 1);
  char got[3] = {};
  t1.recv(0, &got[0], 1, 2);
  t1.recv(0, &got[1], 1, 1);
  t1.recv(0, &got[2], 1, 1);
  EXPECT_EQ(std::string(got, 3), "bac");
  t0.send(1, "left over", 9, 9);  // freed by the world
}

// A ring of sendrecv and sendrecv_reduce steps reusing the same buffers: each call returns only

// Buffered send() and zero-copy sendrecv() travel different ways (a queue and a slot), but a
// receive still takes the first message with its tag in posting order over both.
TEST(TransportThreads, MatchesInPostingOrderAcrossBufferedAndZeroCopySends) {
  RankWorld w(2);
  std::string got_by_sendrecv, got_by_recv, got_back;
  auto errors = w.run([&](int r, lab::Communicator& comm) {
    auto& t = comm.transport();
    char buf[4] = {};
    if (r == 0) {
      t.send(1, "qqqq", 4, 7);                         // posted first
      t.sendrecv(1, "ssss", 4, 1, buf, 4, 7);          // posted second, waits for rank 1's recv
      got_back.assign(buf, 4);
    } else {
      t.sendrecv(0, "rrrr", 4, 0, buf, 4, 7);          // must take the buffered "qqqq"
      got_by_sendrecv.assign(buf, 4);
      t.recv(0, buf, 4, 7);                            // then the zero-copy "ssss"
      got_by_recv.assign(buf, 4);
    }
  });
  for (int r = 0; r < 2; ++r) EXPECT_FALSE(errors[r]) << message_of(errors[r]);
  EXPECT_EQ(got_by_sendrecv, "qqqq");
  EXPECT_EQ(got_by_recv, "ssss");
  EXPECT_EQ(got_back, "rrrr");
}
// once its buffer has been consumed, so overwriting it right away never corrupts a peer's data.
TEST(TransportThreads, ZeroCopyRingReusesBuffersSafely) {
  const int n = 4;
  const int kRounds = 300;
  RankWorld w(n);
  std::vector<long> bad(n, 0);
  auto errors = w.run([&](int r, lab::Communicator& comm) {
    auto& t = comm.transport();
    std::vector<float> out(257), in(257), acc(257);
    for (int k = 0; k < kRounds; ++k) {
      for (auto& x : out) x = static_cast<float>(r * 1000 + k);
      t.sendrecv((r + 1) % n, out.data(), out.size() * sizeof(float), (r + n - 1) % n, in.data(),
                 in.size() * sizeof(float), k);
      for (float x : in) bad[r] += x != static_cast<float>(((r + n - 1) % n) * 1000 + k);
      for (auto& x : acc) x = 1.0f;
      t.sendrecv_reduce((r + 1) % n, out.data(), out.size(), (r + n - 1) % n, acc.data(), acc.size(), k);
      for (float x : acc) bad[r] += x != 1.0f + static_cast<float>(((r + n - 1) % n) * 1000 + k);
    }
  });
  for (int r = 0; r < n; ++r) {
    EXPECT_FALSE(errors[r]) << message_of(errors[r]);
    EXPECT_EQ(bad[r], 0) << "rank " << r;
  }
}

TEST(TransportThreads, SendrecvToSelfInAWorldOfOne) {
  lab::ThreadsWorld w(1);
  float a[3] = {1, 2, 3}, b[3] = {};
  w.transport(0).sendrecv(0, a, sizeof a, 0, b, sizeof b, 0);
  EXPECT_EQ(std::memcmp(a, b, sizeof a), 0);
  w.transport(0).sendrecv_reduce(0, a, 3, 0, b, 3, 1);
  EXPECT_EQ(b[2], 6.0f);
}

// A peer that never sends: the receiver gives up after the timeout and names the peer.
TEST(TransportThreads, RecvTimesOutNamingThePeer) {
  lab::ThreadsWorld w(2);
  auto& t1 = w.transport(1);
  t1.set_timeout(0.2);
  char buf[4];
  const auto t0 = std::chrono::steady_clock::now();
  try {
    t1.recv(0, buf, sizeof buf, 5);
    FAIL() << "recv returned";
  } catch (const lab::CommError& e) {
    const double dt = seconds_since(t0);
    EXPECT_GE(dt, 0.2);
    EXPECT_LT(dt, 0.2 + 0.2);
    EXPECT_CONTAINS(e.what(), "rank 1: timed out after 0.2 s waiting for rank 0 (recv from rank 0, tag 5); rank 0 "
                              "is not waiting in any transport call");
    EXPECT_EQ(e.exit_code(), lab::kExitCommunication);
  }
}

// A peer that never receives: the sender's sendrecv times out too (its send is never consumed),
// and takes its zero-copy post back so nothing points into its stack afterwards.
TEST(TransportThreads, SendrecvTimesOutWhenItsSendIsNeverConsumed) {
  lab::ThreadsWorld w(3);
  auto& t0 = w.transport(0);
  t0.set_timeout(0.2);
  w.transport(2).send(0, "zz", 2, 1);  // the receive half completes at once
  char out[2] = {'o', 'k'}, in[2];
  const auto start = std::chrono::steady_clock::now();
  try {
    t0.sendrecv(1, out, 2, 2, in, 2, 1);
    FAIL() << "sendrecv returned";
  } catch (const lab::CommError& e) {
    EXPECT_LT(seconds_since(start), 0.2 + 0.2);
    EXPECT_CONTAINS(e.what(), "waiting for rank 1 (sendrecv to rank 1, tag 1)");
  }
  EXPECT_EQ(std::string(in, 2), "zz");
  // The timeout failed the world; the cancelled post is gone from rank 1's channel.
  EXPECT_TRUE(w.transport(1).aborted());
  char got[2];
  EXPECT_THROW(w.transport(1).recv(0, got, 2, 1), lab::CommError);
}

// While the hold flag is set (a paused run), waiting does not count towards the timeout.
TEST(TransportThreads, HoldFlagPausesTheTimeout) {
  lab::ThreadsWorld w(2);
  auto& t1 = w.transport(1);
  std::atomic<bool> hold{true};
  t1.set_hold_flag(&hold);
  t1.set_timeout(0.1);
  // Held throughout: a message that arrives after 2.5 x the timeout is still received.
  std::thread late([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
    w.transport(0).send(1, "late", 4, 0);
  });
  char buf[4];
  EXPECT_NO_THROW(t1.recv(0, buf, 4, 0));
  late.join();
  EXPECT_EQ(std::string(buf, 4), "late");
  // Released after 0.15 s: the timeout counts from the release, so it fires at about 0.25 s.
  std::thread release([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(150));
    hold = false;
  });
  const auto start = std::chrono::steady_clock::now();
  EXPECT_THROW(t1.recv(0, buf, 4, 1), lab::CommError);
  const double dt = seconds_since(start);
  release.join();
  EXPECT_GE(dt, 0.15 + 0.1 - 0.01);  // the hold flag is polled, so a poll interval of held time may count
  EXPECT_LT(dt, 0.15 + 0.1 + 0.2);
}

TEST(TransportThreads, SizeMismatchIsAnErrorThatAbortsTheWorld) {
  lab::ThreadsWorld w(2);
  w.transport(0).send(1, "12345678", 8, 3);
  char buf[4];
  try {
    w.transport(1).recv(0, buf, 4, 3);
    FAIL() << "recv returned";
  } catch (const lab::CommError& e) {
    EXPECT_CONTAINS(e.what(), "size mismatch: rank 0 sent 8 bytes, rank 1 expects 4 bytes");
  }
  EXPECT_TRUE(w.transport(0).aborted());
}

// abort(): the first reason wins, is visible everywhere, and every later call throws at once.
TEST(TransportThreads, AbortFailsEveryLaterCall) {
  lab::ThreadsWorld w(3);
  w.transport(2).abort("out of memory");
  w.transport(0).abort("second reason");
  EXPECT_TRUE(w.transport(1).aborted());
  EXPECT_EQ(w.transport(1).abort_reason(), "rank 2 failed: out of memory");
  char buf[1];
  try {
    w.transport(1).recv(0, buf, 1, 0);
    FAIL() << "recv returned";
  } catch (const lab::CommError& e) {
    EXPECT_STREQ(e.what(), "rank 1: recv from rank 0 aborted: rank 2 failed: out of memory");
  }
  EXPECT_THROW(w.transport(0).send(1, "x", 1, 0), lab::CommError);
}

// Fails rank `victim` with "injected failure" just before its reduce-scatter step 1, i.e. after
// its first ring step.
class FailingGate : public lab::StepGate {
 public:
  explicit FailingGate(int victim) : m_victim(victim) {}
  void before_step(int rank, const lab::Event& next) override {
    if (rank == m_victim && next.phase == lab::Phase::ReduceScatter && next.ring_step == 1)
      throw std::runtime_error("injected failure");
  }

 private:
  int m_victim;
};

// One rank throws in the middle of an allreduce and calls abort (as a rank's run loop does):
// every other rank gets a CommError naming that rank long before the timeout; nobody hangs.
TEST(TransportThreads, FailureInjectionMidAllreduceFailsEveryRankQuickly) {
  const int n = 4;
  const double kTimeout = 2.0;
  FailingGate gate(2);
  RankWorld w(n, kTimeout, &gate);
  std::vector<double> elapsed(n);
  const auto start = std::chrono::steady_clock::now();
  auto errors = w.run([&](int r, lab::Communicator& comm) {
    comm.set_train_step(3);
    std::vector<float> v(1000, 1.0f);
    try {
      comm.allreduce_sum(v.data(), v.size(), {"grad bucket", 0});
    } catch (const std::runtime_error& e) {
      elapsed[r] = seconds_since(start);
      if (!dynamic_cast<const lab::CommError*>(&e)) comm.transport().abort(e.what());
      throw;
    }
  });
  for (int r = 0; r < n; ++r) {
    ASSERT_TRUE(errors[r]) << "rank " << r << " finished without error";
    EXPECT_LT(elapsed[r], kTimeout / 2) << "rank " << r;
    const std::string msg = message_of(errors[r]);
    if (r == 2) {
      EXPECT_EQ(msg, "injected failure");
      continue;
    }
    EXPECT_CONTAINS(msg, "rank " + std::to_string(r) + ": allreduce #0 (grad bucket 0) at step 3: ");
    EXPECT_CONTAINS(msg, "rank 2 failed: injected failure");
    try {
      std::rethrow_exception(errors[r]);
    } catch (const lab::CommError& e) {
      EXPECT_EQ(e.exit_code(), lab::kExitCommunication);
    } catch (...) {
      ADD_FAILURE() << "rank " << r << " threw something other than CommError: " << msg;
    }
  }
}

// A rank that never joins the collective: its ring neighbours time out, the first to do so
// aborts the world, and every rank's error names the missing rank.
TEST(TransportThreads, MissingRankTimesOutAndFailsTheWorld) {
  const int n = 4;
  const double kTimeout = 0.2;
  RankWorld w(n, kTimeout);
  std::vector<double> elapsed(n);
  const auto start = std::chrono::steady_clock::now();
  auto errors = w.run([&](int r, lab::Communicator& comm) {
    if (r == 3) return;  // finished early
    std::vector<float> v(100, 1.0f);
    try {
      comm.allreduce_sum(v.data(), v.size(), {"grad bucket", 1});
    } catch (...) {
      elapsed[r] = seconds_since(start);
      throw;
    }
  });
  EXPECT_FALSE(errors[3]);
  for (int r = 0; r < 3; ++r) {
    ASSERT_TRUE(errors[r]) << "rank " << r;
    const std::string msg = message_of(errors[r]);
    EXPECT_CONTAINS(msg, "rank " + std::to_string(r) + ": allreduce #0 (grad bucket 1): ");
    // Whichever rank times out first, the wait chain (or the abort reason carrying it) ends at
    // rank 3, the missing one.
    EXPECT_CONTAINS(msg, "rank 3 is not waiting in any transport call");
    EXPECT_LT(elapsed[r], kTimeout + 0.2) << msg;
  }
}

}  // namespace
