// Emulated ranks over threads: see transport_threads.h for what is supported.
//
// Protocol. Every ordered pair (src -> dst) has one Channel: a short FIFO of posted Messages
// guarded by a mutex, plus an atomic count of posts that the receiver polls without locking.
//   post:    the sender appends a Message (tag, pointer, bytes) and bumps `posts`.
//            send() points the Message at a heap copy it hands over to the receiver;
//            sendrecv() points it at the caller's own buffer (zero-copy) and keeps the Message
//            on its stack until the receiver has consumed it.
//   claim:   the receiver, under the lock, removes the first Message with its tag and marks it
//            Claimed. From then on only the receiver touches the payload.
//   consume: the receiver copies or adds the payload, then stores Consumed (release), after which
//            the sender may reuse its buffer and its stack Message. Heap copies are freed instead.
//   cancel:  a sender that must give up (abort, timeout, its own receive failed) removes its
//            Message if still queued; if the receiver already claimed it, the sender waits for
//            Consumed (a bounded copy, no waiting inside) so no pointer into its stack or buffer
//            outlives the call.
#include "transport_threads.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "errors.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace lab {

namespace {

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

// Backoff of one wait: spin kSpinIters times, then yield until kYieldSeconds have passed since
// the wait began, then sleep kSleepMicros per round. A futex/condvar park at every ring step
// costs a wake-up latency per message; spinning long starves the peer when there are more ranks
// than cores (8 ranks on 2 cores is normal for the lab) and, under a hypervisor, long pause loops
// are punished too. Measured on a 2-vCPU VM (pause = 33 ns): 32 spins (about 1 us) gave 2-3 us
// per 4 KB allreduce with 2 ranks where 2000 spins gave 450 us, and 4-8 ranks ran 15-30x faster.
constexpr int kSpinIters = 32;
constexpr double kYieldSeconds = 2e-3;
constexpr int kSleepMicros = 100;

enum MessageState : int { kPosted = 0, kClaimed = 1, kConsumed = 2 };

struct Message {
  uint64_t tag = 0;
  const void* data = nullptr;  // the payload: the sender's buffer (zero-copy) or `owned`
  size_t bytes = 0;
  std::atomic<int> state{kPosted};
  std::unique_ptr<char[]> owned;  // heap copy for a buffered send(); the receiver frees it
};

struct alignas(64) Channel {
  std::mutex mu;
  std::deque<Message*> queue;       // posted, unclaimed messages in posting order
  std::atomic<uint64_t> posts{0};   // bumped on every post; lets the receiver poll lock-free
};

double wall_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string fmt_seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", s);
  return buf;
}

}  // namespace

class TransportThreads;

// What one rank is blocked on, for the wait chain in timeout messages.
struct alignas(64) RankState {
  std::atomic<int> waiting_for{-1};  // peer of the wait in progress, -1 when not waiting
};

struct ThreadsWorldState {
  int n = 0;
  std::unique_ptr<Channel[]> channels;  // channels[src * n + dst]
  std::unique_ptr<RankState[]> ranks;
  std::vector<std::unique_ptr<TransportThreads>> transports;

  std::atomic<bool> aborted{false};
  mutable std::mutex abort_mu;
  std::string abort_reason;  // first abort world-wide, "rank A failed: <reason>"

  Channel& channel(int src, int dst) { return channels[static_cast<size_t>(src) * n + dst]; }
};

// What a blocked call is waiting for, for error messages: "sendrecv to rank 2".
struct WaitSite {
  const char* call;  // "recv", "sendrecv", ...
  const char* dir;   // "from" or "to"
  int peer;
  uint64_t tag;
};

class TransportThreads final : public Transport {
 public:
  TransportThreads(ThreadsWorldState& w, int rank) : m_w(w), m_rank(rank) {}

  int rank() const override { return m_rank; }
  int world_size() const override { return m_w.n; }
  const char* name() const override { return "threads"; }

  void send(int dst, const void* buf, size_t bytes, uint64_t tag) override {
    check_peer(dst, "send");
    throw_if_aborted({"send", "to", dst, tag});
    auto* m = new Message;
    m->tag = tag;
    m->bytes = bytes;
    m->owned.reset(new char[bytes > 0 ? bytes : 1]);
    if (bytes > 0) std::memcpy(m->owned.get(), buf, bytes);
    m->data = m->owned.get();
    post(dst, m);
  }

  void recv(int src, void* buf, size_t bytes, uint64_t tag) override {
    check_peer(src, "recv");
    Message* m = claim(src, bytes, {"recv", "from", src, tag});
    if (bytes > 0) std::memcpy(buf, m->data, bytes);
    consume(m);
  }

  void sendrecv(int dst, const void* sbuf, size_t sbytes, int src, void* rbuf, size_t rbytes,
                uint64_t tag) override {
    exchange(dst, sbuf, sbytes, src, rbytes, tag, "sendrecv", [&](const void* in) {
      if (rbytes > 0) std::memcpy(rbuf, in, rbytes);
    });
  }

  void sendrecv_reduce(int dst, const float* sbuf, size_t scount, int src, float* acc, size_t rcount,
                       uint64_t tag) override {
    exchange(dst, sbuf, scount * sizeof(float), src, rcount * sizeof(float), tag, "sendrecv_reduce",
             [&](const void* in) { add_into(acc, static_cast<const float*>(in), rcount); });
  }

  void abort(const std::string& reason) override {
    std::lock_guard<std::mutex> lock(m_w.abort_mu);
    if (m_w.aborted.load(std::memory_order_relaxed)) return;  // the first reason wins
    const std::string me = "rank " + std::to_string(m_rank);
    const bool named = reason.compare(0, me.size(), me) == 0 &&
                       (reason.size() == me.size() || reason[me.size()] == ' ' || reason[me.size()] == ':');
    m_w.abort_reason = named ? reason : me + " failed: " + reason;
    m_w.aborted.store(true, std::memory_order_release);
    // Waiters poll the flag (spin, yield, short sleeps), so storing it wakes everybody.
  }

  bool aborted() const override { return m_w.aborted.load(std::memory_order_acquire); }

  std::string abort_reason() const override {
    std::lock_guard<std::mutex> lock(m_w.abort_mu);
    return m_w.abort_reason;
  }

 private:
  static void add_into(float* __restrict acc, const float* __restrict in, size_t count) {
    for (size_t i = 0; i < count; ++i) acc[i] += in[i];
  }

  void check_peer(int peer, const char* call) const {
    if (peer < 0 || peer >= m_w.n)
      throw CommError("rank " + std::to_string(m_rank) + ": " + call + " with rank " + std::to_string(peer) +
                      ", but the world has ranks 0.." + std::to_string(m_w.n - 1));
  }

  void throw_if_aborted(const WaitSite& site) const {
    if (!m_w.aborted.load(std::memory_order_acquire)) return;
    throw CommError("rank " + std::to_string(m_rank) + ": " + site.call + " " + site.dir + " rank " +
                        std::to_string(site.peer) + " aborted: " + abort_reason(),
                    "the first failing rank's error above is the cause; this rank stopped because of it");
  }

  // Clears this rank's waiting_for when a wait ends, also by an exception. The store is a
  // release after abort() (if any), so whoever sees it cleared also sees the abort flag.
  struct WaitMark {
    std::atomic<int>& waiting_for;
    WaitMark(std::atomic<int>& w, int peer) : waiting_for(w) { w.store(peer, std::memory_order_release); }
    ~WaitMark() { waiting_for.store(-1, std::memory_order_release); }
  };

  // Waits until done() is true. Spin, then yield, then sleep; checks the abort flag on every
  // round and, once past the short spin, the timeout (held time excluded). While waiting, the
  // rank publishes whom it waits for.
  template <class Done>
  void wait_until(Done&& done, const WaitSite& site) {
    if (done()) return;
    WaitMark mark(m_w.ranks[m_rank].waiting_for, site.peer);
    double waited = 0;  // seconds of waiting that count towards the timeout
    const double start = wall_seconds();
    double last = start;
    for (int spins = 0;;) {
      if (done()) return;
      throw_if_aborted(site);
      if (spins < kSpinIters) {
        ++spins;
        cpu_relax();
        continue;
      }
      const double now = wall_seconds();
      const bool held = m_hold && m_hold->load(std::memory_order_relaxed);
      if (!held) waited += now - last;  // a paused run does not advance the deadline
      last = now;
      if (waited > m_timeout) throw_timeout(site);
      if (now - start < kYieldSeconds)
        std::this_thread::yield();
      else
        std::this_thread::sleep_for(std::chrono::microseconds(kSleepMicros));
    }
  }

  // "; rank 0 waits for rank 3; rank 3 is not waiting in any transport call (...)": follows
  // whom each blocked rank waits for, starting at `peer`, so that a timeout names the rank at
  // the end of the chain (the one that is really missing) and not only the nearest neighbour.
  std::string wait_chain(int peer) const {
    if (peer == m_rank) return "";
    std::vector<bool> seen(m_w.n, false);
    seen[m_rank] = true;
    std::string s;
    for (int p = peer;;) {
      seen[p] = true;
      const int q = m_w.ranks[p].waiting_for.load(std::memory_order_acquire);
      if (q < 0) {
        s += "; rank " + std::to_string(p) +
             " is not waiting in any transport call (busy elsewhere, or it has left this collective)";
        return s;
      }
      s += "; rank " + std::to_string(p) + " waits for rank " + std::to_string(q);
      if (seen[q]) return s + " (a wait cycle: deadlock)";
      p = q;
    }
  }

  // A timeout fails the whole world: this rank aborts with the timeout message, so the ranks
  // still waiting fail at once with the same cause instead of timing out one after another.
  [[noreturn]] void throw_timeout(const WaitSite& site) {
    const std::string chain = wait_chain(site.peer);
    // If another rank failed meanwhile (it aborts before clearing its waiting_for, so a chain
    // that read it as "not waiting" sees its abort here), report that cause instead.
    throw_if_aborted(site);
    const std::string msg = "rank " + std::to_string(m_rank) + ": timed out after " + fmt_seconds(m_timeout) +
                            " s waiting for rank " + std::to_string(site.peer) + " (" + site.call + " " +
                            site.dir + " rank " + std::to_string(site.peer) + ", tag " +
                            std::to_string(site.tag) + ")" + chain;
    abort(msg);
    throw CommError(msg,
                    "a rank that never reaches a collective (it finished early, is stuck, or runs a "
                    "different collective) makes its peers time out; see the wait chain");
  }

  void post(int dst, Message* m) {
    Channel& ch = m_w.channel(m_rank, dst);
    std::lock_guard<std::mutex> lock(ch.mu);
    ch.queue.push_back(m);
    ch.posts.fetch_add(1, std::memory_order_release);
  }

  // Waits for the first message from src with site.tag and claims it. A size mismatch aborts the
  // world (both sides run the same collective with different sizes: a bug) and throws.
  Message* claim(int src, size_t bytes, const WaitSite& site) {
    Channel& ch = m_w.channel(src, m_rank);
    uint64_t seen = ~uint64_t{0};
    Message* found = nullptr;
    size_t mismatch = 0;
    bool bad_size = false;
    wait_until(
        [&] {
          if (ch.posts.load(std::memory_order_acquire) == seen) return false;
          std::lock_guard<std::mutex> lock(ch.mu);
          seen = ch.posts.load(std::memory_order_relaxed);
          for (auto it = ch.queue.begin(); it != ch.queue.end(); ++it) {
            Message* m = *it;
            if (m->tag != site.tag) continue;
            if (m->bytes != bytes) {  // leave it queued: its sender cancels or the world frees it
              bad_size = true;
              mismatch = m->bytes;
              return true;
            }
            ch.queue.erase(it);
            m->state.store(kClaimed, std::memory_order_relaxed);
            found = m;
            return true;
          }
          return false;
        },
        site);
    if (bad_size) {
      const std::string msg = "rank " + std::to_string(m_rank) + ": " + site.call + " from rank " +
                              std::to_string(src) + " (tag " + std::to_string(site.tag) + "): size mismatch: rank " +
                              std::to_string(src) + " sent " + std::to_string(mismatch) + " bytes, rank " +
                              std::to_string(m_rank) + " expects " + std::to_string(bytes) + " bytes";
      abort(msg);
      throw CommError(msg, "a bug: both ranks must run the same collective with the same sizes");
    }
    return found;
  }

  static void consume(Message* m) {
    if (m->owned)
      delete m;  // a buffered send(): nobody waits for it
    else
      m->state.store(kConsumed, std::memory_order_release);
  }

  // Removes our posted zero-copy message, or waits until its receiver has finished with it.
  void cancel(int dst, Message& m) {
    Channel& ch = m_w.channel(m_rank, dst);
    {
      std::lock_guard<std::mutex> lock(ch.mu);
      auto it = std::find(ch.queue.begin(), ch.queue.end(), &m);
      if (it != ch.queue.end()) {
        ch.queue.erase(it);
        return;
      }
    }
    // Claimed: the receiver is copying from our buffer right now; that cannot block.
    while (m.state.load(std::memory_order_acquire) != kConsumed) std::this_thread::yield();
  }

  // One zero-copy ring step: post sbuf to dst, claim from src and hand the payload to
  // `take`, then wait until dst has consumed our post.
  template <class Take>
  void exchange(int dst, const void* sbuf, size_t sbytes, int src, size_t rbytes, uint64_t tag,
                const char* call, Take&& take) {
    check_peer(dst, call);
    check_peer(src, call);
    throw_if_aborted({call, "to", dst, tag});
    Message out;
    out.tag = tag;
    out.data = sbuf;
    out.bytes = sbytes;
    post(dst, &out);
    try {
      Message* in = claim(src, rbytes, {call, "from", src, tag});
      take(in->data);
      consume(in);
      wait_until([&] { return out.state.load(std::memory_order_acquire) == kConsumed; },
                 {call, "to", dst, tag});
    } catch (...) {
      cancel(dst, out);
      throw;
    }
  }

  ThreadsWorldState& m_w;
  int m_rank;
};

ThreadsWorld::ThreadsWorld(int world_size) : m_state(new ThreadsWorldState) {
  if (world_size < 1)
    throw ConfigError("the world size must be at least 1, got " + std::to_string(world_size));
  m_state->n = world_size;
  m_state->channels.reset(new Channel[static_cast<size_t>(world_size) * world_size]);
  m_state->ranks.reset(new RankState[world_size]);
  for (int r = 0; r < world_size; ++r) m_state->transports.emplace_back(new TransportThreads(*m_state, r));
}

ThreadsWorld::~ThreadsWorld() {
  // Only buffered send() copies can be left over (never received); zero-copy messages are always
  // removed by their sender before its call returns.
  const size_t channels = static_cast<size_t>(m_state->n) * m_state->n;
  for (size_t i = 0; i < channels; ++i)
    for (Message* m : m_state->channels[i].queue)
      if (m->owned) delete m;
}

int ThreadsWorld::world_size() const { return m_state->n; }

std::vector<int> ThreadsWorld::local_ranks() const {
  std::vector<int> r(static_cast<size_t>(m_state->n));
  for (int i = 0; i < m_state->n; ++i) r[static_cast<size_t>(i)] = i;
  return r;
}

Transport& ThreadsWorld::transport(int rank) {
  if (rank < 0 || rank >= m_state->n)
    throw ConfigError("Invalid rank " + std::to_string(rank) + ", rank should be in the interval [0, " +
                      std::to_string(m_state->n - 1) + "]");
  return *m_state->transports[rank];
}

}  // namespace lab
