// Emulated ranks over threads: see transport_threads.h for what is supported.
//
// Sections: waiting policy, messages and channels, the reduction loop (AVX2/SSE2) | doorbells
// (RankState, futex) | TransportThreads: the calls, waiting and timeouts, matching (post, claim,
// consume, cancel, exchange) | ThreadsWorld.
//
// Protocol. Every ordered pair (src -> dst) has one Channel with two ways in:
//   slot:    the zero-copy way, for sendrecv() and sendrecv_reduce(). A rank has at most one such
//            call in flight, so one slot per channel is enough. The sender fills in (tag, pointer,
//            bytes, order) and publishes them with one release store of the slot's state word
//            (Posted, with a generation number that makes every post distinct). The receiver
//            claims it by compare-and-swap Posted -> Claimed, copies or adds straight out of the
//            sender's buffer, and stores Consumed; the sender, which waits for that, sets it Free
//            again. One cache line goes each way per message, which is what small messages cost.
//   queue:   the buffered way, for send(): a heap copy appended to a short FIFO under a mutex,
//            with an atomic count that lets the receiver skip the lock while the FIFO is empty.
//   matching: a receive takes the first message with its tag in posting order (`order`, counted
//            per channel by the sender) over both ways.
//   cancel:  a sender that must give up (abort, timeout, its own receive failed) takes its slot
//            back by compare-and-swap Posted -> Free; if the receiver has already claimed it, the
//            sender waits for Consumed (a bounded copy, no waiting inside) so no pointer into its
//            buffer outlives the call.
//   ring:    posting and consuming then ring the peer's doorbell, which wakes it if it parked
//            (see RankState); a peer that is not parked costs a fence and a read of a line that
//            stays shared.
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

#include "device_memory.h"
#include "errors.h"
#include "events.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif
#if defined(__linux__)
#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <climits>
#include <ctime>
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

// Backoff of one wait: spin for up to kSpinSeconds (only when every rank can have a core of its
// own, and only while the peer is not on our own CPU), then yield kYieldRounds times, then park
// on the rank's doorbell (a futex) until a peer rings it, for at most kParkSeconds per round (so
// that the timeout and the hold flag are looked at again).
//   - Parking costs a wake-up: 50-150 us on a 2-vCPU VM whose other core had gone idle. With a
//     1 us spin, 2 ranks took 80-120 us for a 16-64 KB ring allreduce (Open MPI, which polls,
//     7-17 us); with a 50 us spin, 6 and 20 us.
//   - Spinning while the peer shares our CPU keeps the peer off it: the scheduler sometimes
//     leaves both rank threads on one CPU for a while, and a 50 us spin then cost 50 us per ring
//     step (105 us per 4 KB allreduce instead of 3). So the spin stops as soon as the peer's
//     last known CPU (published at each wait) is ours.
//   - With more ranks than cores, no spin at all: a 4 KB ring of 4 ranks took 60-100 us instead
//     of 150-330 us with a 1 us spin, and parking right away (no yields) was 2-4x slower than 8
//     yields first.
constexpr double kSpinSeconds = 50e-6;
constexpr int kSpinBetweenClock = 16;  // pauses between looks at the clock and the peer's CPU
constexpr int kYieldRounds = 8;
constexpr double kParkSeconds = 10e-3;

// A buffered send(): the receiver frees it.
struct Message {
  uint64_t tag = 0;
  uint64_t order = 0;  // posting order on its channel
  size_t bytes = 0;
  std::unique_ptr<char[]> owned;
};

// The zero-copy slot's state word: the state in the low 2 bits, the post's generation above.
enum SlotState : uint64_t { kFree = 0, kPosted = 1, kClaimed = 2, kConsumed = 3 };
constexpr uint64_t kStateMask = 3;

struct alignas(64) Slot {
  std::atomic<uint64_t> state{kFree};
  uint64_t tag = 0;
  const void* data = nullptr;  // the sender's own buffer
  size_t bytes = 0;
  uint64_t order = 0;
};

struct Channel {
  Slot slot;                        // written by the sender, claimed by the receiver
  alignas(64) std::mutex mu;        // guards queue
  std::deque<Message*> queue;       // buffered sends, unclaimed, in posting order
  std::atomic<uint64_t> queued{0};  // queue.size(), readable without the lock
  alignas(64) uint64_t next_order = 0;  // the sender's posting counter (sender only)
  uint64_t generation = 0;              // the sender's slot post counter (sender only)
};

// acc[i] += in[i] for i < count: the reduction of sendrecv_reduce, fused with the copy out of
// the peer's buffer. GCC at -O2 keeps a plain loop scalar (one float per instruction); large
// chunks are bound by this loop once they are in cache, so x86-64 gets an AVX2 version when the
// CPU has it (picked once at run time) and an SSE2 one otherwise. Each element is still one IEEE
// addition of the same two operands, so the results are bitwise those of the plain loop.
[[maybe_unused]] void add_plain(float* __restrict acc, const float* __restrict in, size_t count) {
  for (size_t i = 0; i < count; ++i) acc[i] += in[i];
}

#if defined(__x86_64__)
__attribute__((target("avx2"))) void add_avx2(float* __restrict acc, const float* __restrict in, size_t count) {
  size_t i = 0;
  for (; i + 32 <= count; i += 32) {
    const __m256 a0 = _mm256_add_ps(_mm256_loadu_ps(acc + i), _mm256_loadu_ps(in + i));
    const __m256 a1 = _mm256_add_ps(_mm256_loadu_ps(acc + i + 8), _mm256_loadu_ps(in + i + 8));
    const __m256 a2 = _mm256_add_ps(_mm256_loadu_ps(acc + i + 16), _mm256_loadu_ps(in + i + 16));
    const __m256 a3 = _mm256_add_ps(_mm256_loadu_ps(acc + i + 24), _mm256_loadu_ps(in + i + 24));
    _mm256_storeu_ps(acc + i, a0);
    _mm256_storeu_ps(acc + i + 8, a1);
    _mm256_storeu_ps(acc + i + 16, a2);
    _mm256_storeu_ps(acc + i + 24, a3);
  }
  for (; i + 8 <= count; i += 8) _mm256_storeu_ps(acc + i, _mm256_add_ps(_mm256_loadu_ps(acc + i), _mm256_loadu_ps(in + i)));
  for (; i < count; ++i) acc[i] += in[i];
}

void add_sse2(float* __restrict acc, const float* __restrict in, size_t count) {
  size_t i = 0;
  for (; i + 8 <= count; i += 8) {
    const __m128 a0 = _mm_add_ps(_mm_loadu_ps(acc + i), _mm_loadu_ps(in + i));
    const __m128 a1 = _mm_add_ps(_mm_loadu_ps(acc + i + 4), _mm_loadu_ps(in + i + 4));
    _mm_storeu_ps(acc + i, a0);
    _mm_storeu_ps(acc + i + 4, a1);
  }
  for (; i < count; ++i) acc[i] += in[i];
}
#endif

using AddFn = void (*)(float* __restrict, const float* __restrict, size_t);

AddFn pick_add() {
#if defined(__x86_64__)
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") ? add_avx2 : add_sse2;
#else
  return add_plain;
#endif
}

const AddFn kAddInto = pick_add();

// The CPU the calling thread runs on, or -1 where the system cannot say.
int current_cpu() {
#if defined(__linux__)
  return sched_getcpu();
#else
  return -1;
#endif
}


}  // namespace

class TransportThreads;

// What one rank is blocked on, for the wait chain in timeout messages, and its doorbell.
//
// Doorbell protocol (no lost wake-ups). A peer that may have made this rank's wait condition
// true (posted it a message, consumed its message, aborted the world) first makes it true, then
// issues a seq_cst fence and reads `parked`; only if it is non-zero does it bump `bell` and wake
// the futex on `bell`. The waiter reads `bell`, raises `parked` (seq_cst), fences, checks its
// condition once more and sleeps only while `bell` still holds the value it read. Dekker style:
// either the ringer sees `parked` and wakes, or the waiter sees the new condition. A running
// waiter never writes the doorbell's line, so ringing it costs no cache-line transfer; the wait
// chain's `waiting_for`, which the rank writes at every wait, lives on a line of its own.
struct RankState {
  alignas(64) std::atomic<int> waiting_for{-1};  // peer of the wait in progress, -1 when not waiting
  std::atomic<int> cpu{-1};                      // the CPU this rank last waited on (-1: unknown)
  alignas(64) std::atomic<uint32_t> bell{0};     // bumped by every ring of a parked rank
  std::atomic<int> parked{0};                    // 1 while this rank sleeps (or is about to) on bell
};

namespace {

// Sleeps until *addr != expected, a wake-up, or `seconds` pass (spurious returns are fine).
void futex_wait(std::atomic<uint32_t>* addr, uint32_t expected, double seconds) {
#if defined(__linux__)
  struct timespec ts;
  ts.tv_sec = static_cast<time_t>(seconds);
  ts.tv_nsec = static_cast<long>((seconds - static_cast<double>(ts.tv_sec)) * 1e9);
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(addr), FUTEX_WAIT_PRIVATE, expected, &ts, nullptr, 0);
#else
  (void)addr;
  (void)expected;
  std::this_thread::sleep_for(std::chrono::microseconds(std::min<long>(100, static_cast<long>(seconds * 1e6))));
#endif
}

void futex_wake_all(std::atomic<uint32_t>* addr) {
#if defined(__linux__)
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(addr), FUTEX_WAKE_PRIVATE, INT32_MAX, nullptr, nullptr, 0);
#else
  (void)addr;
#endif
}

// Tells rank state `rs` that its wait condition may have changed (see the doorbell protocol);
// the caller has just made the condition true.
void ring(RankState& rs) {
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (rs.parked.load(std::memory_order_relaxed) != 0) {
    rs.bell.fetch_add(1, std::memory_order_seq_cst);
    futex_wake_all(&rs.bell);
  }
}

}  // namespace

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
  TransportThreads(ThreadsWorldState& w, int rank)
      : m_w(w),
        m_rank(rank),
        m_spin_seconds(w.n <= static_cast<int>(std::thread::hardware_concurrency()) ? kSpinSeconds : 0) {}

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
    post(dst, m);
  }

  void recv(int src, void* buf, size_t bytes, uint64_t tag) override {
    check_peer(src, "recv");
    const Claim c = claim(src, bytes, {"recv", "from", src, tag});
    if (bytes > 0) std::memcpy(buf, c.data, bytes);
    consume(c, src);
  }

  // Whichever of srcs has a message with `tag` first (looked at in srcs' order when several
  // have): the arrival order a parameter server serves its workers in.
  int recv_any(const std::vector<int>& srcs, void* buf, size_t bytes, uint64_t tag) override {
    if (srcs.empty()) throw CommError("rank " + std::to_string(m_rank) + ": recv_any from no rank");
    for (int src : srcs) check_peer(src, "recv_any");
    Claim found;
    size_t mismatch = 0;
    bool bad_size = false;
    int from = -1;
    wait_until(
        [&] {
          for (int src : srcs)
            if (try_claim(src, bytes, tag, found, bad_size, mismatch)) {
              from = src;
              return true;
            }
          return false;
        },
        {"recv_any", "from", srcs.front(), tag});
    if (bad_size) throw_size_mismatch(from, {"recv_any", "from", from, tag}, mismatch, bytes);
    if (bytes > 0) std::memcpy(buf, found.data, bytes);
    consume(found, from);
    return from;
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

  // Emulated ranks share one device: the receiver copies or adds straight from the sender's device
  // buffer with the device's own calls, as it does from host memory above.
  bool device_aware() const override { return true; }

  void sendrecv_on(DeviceMemory& mem, int dst, const void* sbuf, size_t sbytes, int src, void* rbuf, size_t rbytes,
                   uint64_t tag) override {
    exchange(dst, sbuf, sbytes, src, rbytes, tag, "sendrecv", [&](const void* in) {
      if (rbytes > 0) mem.copy(rbuf, in, rbytes);
    });
  }

  void sendrecv_reduce_on(DeviceMemory& mem, int dst, const float* sbuf, size_t scount, int src, float* acc,
                          size_t rcount, uint64_t tag) override {
    exchange(dst, sbuf, scount * sizeof(float), src, rcount * sizeof(float), tag, "sendrecv_reduce",
             [&](const void* in) {
               if (rcount > 0) mem.add(acc, static_cast<const float*>(in), rcount);
             });
  }

  void abort(const std::string& reason) override {
    std::lock_guard<std::mutex> lock(m_w.abort_mu);
    if (m_w.aborted.load(std::memory_order_relaxed)) return;  // the first reason wins
    const std::string me = "rank " + std::to_string(m_rank);
    const bool named = reason.compare(0, me.size(), me) == 0 &&
                       (reason.size() == me.size() || reason[me.size()] == ' ' || reason[me.size()] == ':');
    m_w.abort_reason = named ? reason : me + " failed: " + reason;
    m_w.aborted.store(true, std::memory_order_seq_cst);
    // Waiters check the flag on every round; parked ones are woken here.
    for (int r = 0; r < m_w.n; ++r) ring(m_w.ranks[r]);
  }

  bool aborted() const override { return m_w.aborted.load(std::memory_order_acquire); }

  std::string abort_reason() const override {
    std::lock_guard<std::mutex> lock(m_w.abort_mu);
    return m_w.abort_reason;
  }

 private:
  static void add_into(float* __restrict acc, const float* __restrict in, size_t count) { kAddInto(acc, in, count); }

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

  // Waits until done() is true. Spin, then yield, then park on this rank's doorbell; checks the
  // abort flag on every round and, once past the spin, the timeout (held time excluded). While
  // waiting, the rank publishes whom it waits for and on which CPU it runs: spinning while the
  // peer shares our CPU only keeps the peer off it, so then the wait goes straight to yielding.
  template <class Done>
  void wait_until(Done&& done, const WaitSite& site) {
    if (done()) return;
    RankState& me = m_w.ranks[m_rank];
    const int cpu = current_cpu();
    me.cpu.store(cpu, std::memory_order_relaxed);
    WaitMark mark(me.waiting_for, site.peer);
    double waited = 0;  // seconds of waiting that count towards the timeout
    double last = now_seconds();
    const double spin_end = last + m_spin_seconds;
    const std::atomic<int>& peer_cpu = m_w.ranks[site.peer].cpu;
    bool spinning = m_spin_seconds > 0;
    for (int spins = 0, yields = 0;;) {
      if (done()) return;
      throw_if_aborted(site);
      if (spinning) {  // look at the clock and the peer's CPU every kSpinBetweenClock pauses only
        cpu_relax();
        if (++spins % kSpinBetweenClock != 0) continue;
        if (now_seconds() < spin_end && (cpu < 0 || peer_cpu.load(std::memory_order_relaxed) != cpu)) continue;
        spinning = false;
      }
      const double now = now_seconds();
      const bool held = m_hold && m_hold->load(std::memory_order_relaxed);
      if (!held) waited += now - last;  // a paused run does not advance the deadline
      last = now;
      if (waited > m_timeout) throw_timeout(site);
      if (yields < kYieldRounds) {
        ++yields;
        std::this_thread::yield();
        continue;
      }
      // done() may claim a message (it has effects): once it says true, return.
      const uint32_t bell = me.bell.load(std::memory_order_seq_cst);
      me.parked.store(1, std::memory_order_seq_cst);
      std::atomic_thread_fence(std::memory_order_seq_cst);
      if (done()) {
        me.parked.store(0, std::memory_order_relaxed);
        return;
      }
      if (!m_w.aborted.load(std::memory_order_seq_cst))
        futex_wait(&me.bell, bell, std::min(kParkSeconds, std::max(1e-4, m_timeout - waited)));
      me.parked.store(0, std::memory_order_relaxed);
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
    const std::string msg = "rank " + std::to_string(m_rank) + ": timed out after " + seconds_text(m_timeout) +
                            " s waiting for rank " + std::to_string(site.peer) + " (" + site.call + " " +
                            site.dir + " rank " + std::to_string(site.peer) + ", tag " +
                            std::to_string(site.tag) + ")" + chain;
    abort(msg);
    throw CommError(msg,
                    "a rank that never reaches a collective (it finished early, is stuck, or runs a "
                    "different collective) makes its peers time out; see the wait chain");
  }

  // A buffered send: append m to the (rank -> dst) queue.
  void post(int dst, Message* m) {
    Channel& ch = m_w.channel(m_rank, dst);
    {
      std::lock_guard<std::mutex> lock(ch.mu);
      m->order = ch.next_order++;
      ch.queue.push_back(m);
      ch.queued.store(ch.queue.size(), std::memory_order_release);
    }
    ring(m_w.ranks[dst]);
  }

  // A zero-copy post: publish (tag, buf, bytes) in the (rank -> dst) slot, which is Free (this
  // rank's previous exchange with dst ended by taking it back). Returns the state word posted.
  uint64_t post_slot(int dst, const void* buf, size_t bytes, uint64_t tag) {
    Channel& ch = m_w.channel(m_rank, dst);
    Slot& sl = ch.slot;
    sl.tag = tag;
    sl.data = buf;
    sl.bytes = bytes;
    sl.order = ch.next_order++;  // next_order is this rank's alone: no lock
    const uint64_t posted = (++ch.generation << 2) | kPosted;
    sl.state.store(posted, std::memory_order_release);
    ring(m_w.ranks[dst]);
    return posted;
  }

  // What claim() found: a payload to copy or add, and where it came from.
  struct Claim {
    const void* data = nullptr;
    Message* message = nullptr;  // a buffered send (freed by consume), or
    Slot* slot = nullptr;        // the sender's zero-copy slot (marked Consumed by consume)
    uint64_t claimed = 0;        // the slot's state word after the claim
  };

  // Claims the first message from src with `tag` (in posting order, over the slot and the queue)
  // if there is one. A size mismatch sets bad_size (and the size sent) and claims nothing.
  bool try_claim(int src, size_t bytes, uint64_t tag, Claim& found, bool& bad_size, size_t& mismatch) {
    Channel& ch = m_w.channel(src, m_rank);
    Slot& sl = ch.slot;
    const uint64_t st = sl.state.load(std::memory_order_acquire);
    const bool slot_match = (st & kStateMask) == kPosted && sl.tag == tag;
    Message* queued = nullptr;
    std::deque<Message*>::iterator where;
    std::unique_lock<std::mutex> lock(ch.mu, std::defer_lock);
    if (ch.queued.load(std::memory_order_acquire) != 0) {
      lock.lock();
      for (auto it = ch.queue.begin(); it != ch.queue.end(); ++it)
        if ((*it)->tag == tag) {
          queued = *it;
          where = it;
          break;
        }
    }
    // The slot's fields were written before its state word, whose acquire load saw them;
    // a re-post would carry a new generation and fail the compare-and-swap below.
    if (slot_match && (queued == nullptr || sl.order < queued->order)) {
      if (sl.bytes != bytes) {  // leave it posted: its sender cancels it
        bad_size = true;
        mismatch = sl.bytes;
        return true;
      }
      const uint64_t claimed = (st & ~kStateMask) | kClaimed;
      uint64_t expected = st;
      if (!sl.state.compare_exchange_strong(expected, claimed, std::memory_order_acquire))
        return false;  // its sender took it back (it is giving up)
      found.data = sl.data;
      found.slot = &sl;
      found.claimed = claimed;
      return true;
    }
    if (queued == nullptr) return false;
    if (queued->bytes != bytes) {  // leave it queued: the world frees it
      bad_size = true;
      mismatch = queued->bytes;
      return true;
    }
    ch.queue.erase(where);
    ch.queued.store(ch.queue.size(), std::memory_order_relaxed);
    found.data = queued->owned.get();
    found.message = queued;
    return true;
  }

  [[noreturn]] void throw_size_mismatch(int src, const WaitSite& site, size_t sent, size_t bytes) {
    const std::string msg = "rank " + std::to_string(m_rank) + ": " + site.call + " from rank " + std::to_string(src) +
                            " (tag " + std::to_string(site.tag) + "): size mismatch: rank " + std::to_string(src) +
                            " sent " + std::to_string(sent) + " bytes, rank " + std::to_string(m_rank) + " expects " +
                            std::to_string(bytes) + " bytes";
    abort(msg);
    throw CommError(msg, "a bug: both ranks must run the same collective with the same sizes");
  }

  // Waits for the first message from src with site.tag and claims it. A size mismatch aborts the
  // world (both sides run the same collective with different sizes: a bug) and throws.
  Claim claim(int src, size_t bytes, const WaitSite& site) {
    Claim found;
    size_t mismatch = 0;
    bool bad_size = false;
    wait_until([&] { return try_claim(src, bytes, site.tag, found, bad_size, mismatch); }, site);
    if (bad_size) throw_size_mismatch(src, site, mismatch, bytes);
    return found;
  }

  // Done with a claimed payload: free a buffered send, or tell the slot's sender (rank src).
  void consume(const Claim& c, int src) {
    if (c.message != nullptr) {
      delete c.message;  // nobody waits for a buffered send
      return;
    }
    c.slot->state.store((c.claimed & ~kStateMask) | kConsumed, std::memory_order_release);
    ring(m_w.ranks[src]);
  }

  // Takes our posted slot back, or waits until its receiver has finished with it; Free after.
  void cancel(int dst, uint64_t posted) {
    Slot& sl = m_w.channel(m_rank, dst).slot;
    uint64_t expected = posted;
    if (!sl.state.compare_exchange_strong(expected, kFree, std::memory_order_acq_rel)) {
      // Claimed: the receiver is copying from our buffer right now; that cannot block.
      while ((sl.state.load(std::memory_order_acquire) & kStateMask) != kConsumed) std::this_thread::yield();
      sl.state.store(kFree, std::memory_order_relaxed);
    }
  }

  // One zero-copy ring step: post sbuf to dst, claim from src and hand the payload to
  // `take`, then wait until dst has consumed our post.
  template <class Take>
  void exchange(int dst, const void* sbuf, size_t sbytes, int src, size_t rbytes, uint64_t tag,
                const char* call, Take&& take) {
    check_peer(dst, call);
    check_peer(src, call);
    throw_if_aborted({call, "to", dst, tag});
    const uint64_t posted = post_slot(dst, sbuf, sbytes, tag);
    Slot& out = m_w.channel(m_rank, dst).slot;
    try {
      const Claim in = claim(src, rbytes, {call, "from", src, tag});
      take(in.data);
      consume(in, src);
      wait_until([&] { return (out.state.load(std::memory_order_acquire) & kStateMask) == kConsumed; },
                 {call, "to", dst, tag});
      out.state.store(kFree, std::memory_order_relaxed);
    } catch (...) {
      cancel(dst, posted);
      throw;
    }
  }

  ThreadsWorldState& m_w;
  int m_rank;
  double m_spin_seconds;  // kSpinSeconds, or 0 when the ranks outnumber the cores
  double m_spin_budget = m_spin_seconds;
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
  // Only buffered send() copies can be left over (never received); a zero-copy slot is always
  // taken back by its sender before its call returns.
  const size_t channels = static_cast<size_t>(m_state->n) * m_state->n;
  for (size_t i = 0; i < channels; ++i)
    for (Message* m : m_state->channels[i].queue) delete m;
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
