// Ranks as processes over MPI: see transport_mpi.h for what is supported.
//
// Sections, in TransportMpi's order: the calls (send, recv, sendrecv, sendrecv_reduce,
// native_allreduce_sum, abort); posting (tags, staging, MPI_Isend/MPI_Irecv); waiting (test_ops,
// wait_ops, give_up); timeouts (wait chain, throw_timeout); then MpiWorld.
//
// Protocol of one call. Each MPI operation of the call is an Op (its request, what it waits for,
// and for error messages the call, direction, peer and tag). The call posts its Ops, then waits:
//   round:   MPI_Test every unfinished Op (under the runtime's MPI mutex), then poll the control
//            channel; an abort throws at once. After a short spin the timeout is checked.
//   give up: (abort, timeout, size mismatch, MPI error) receives into the caller's buffer are
//            cancelled and waited for a moment (an unmatched receive cancels at once; a matched
//            one completes, its sender being alive); sends and receives into transport-owned
//            buffers are handed to the runtime (orphaned) with their buffer, which lives until
//            MPI_Finalize. The caller's memory is never left to MPI after the call returns.
#include "transport_mpi.h"

#include <chrono>
#include <climits>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>

#include "errors.h"
#include "events.h"

namespace lab {

namespace {

// Backoff of one wait, as in transport_threads.cpp (measured there): spin kSpinIters rounds,
// yield until kYieldSeconds have passed, then sleep kSleepMicros per round. MPI makes progress
// only inside our MPI_Test calls, so a round is a test, never a blind sleep first.
constexpr int kSpinIters = 32;
constexpr double kYieldSeconds = 2e-3;
constexpr int kSleepMicros = 100;
// A peer that does not answer "whom are you waiting for?" within this is reported as busy.
constexpr double kQuerySeconds = 0.5;
// How long a call that gives up waits for its cancelled receives.
constexpr double kCancelSeconds = 1.0;


// What a blocked call is waiting for, for error messages: "sendrecv to rank 2".
struct WaitSite {
  const char* call;  // "recv", "sendrecv", ...
  const char* dir;   // "from", "to"; "" for a collective
  int peer;          // -1 for a collective
  uint64_t tag;
};

std::string site_text(const WaitSite& s) {
  if (s.peer < 0) return s.call;
  return std::string(s.call) + " " + s.dir + " rank " + std::to_string(s.peer);
}

enum class OpKind { Send, Recv, RecvOwned, Collective };

struct Op {
  OpKind kind = OpKind::Send;
  WaitSite site{};
  MPI_Request req = MPI_REQUEST_NULL;
  std::vector<char>* owned = nullptr;  // Send/RecvOwned/Collective: the transport's buffer
  size_t bytes = 0;                    // receives: the size expected
  bool done = false;
  MPI_Status status{};
};

}  // namespace

class TransportMpi final : public Transport {
 public:
  explicit TransportMpi(MpiRuntime& rt) : m_rt(rt) {
    int bits = 0;  // MPI tags are 0 .. tag_ub; use the widest 2^bits - 1 that fits
    while (bits < 31 && ((int64_t{1} << (bits + 1)) - 1) <= rt.tag_ub()) ++bits;
    m_low_bits = bits - 2;
  }

  int rank() const override { return m_rt.rank(); }
  int world_size() const override { return m_rt.size(); }
  const char* name() const override { return "mpi"; }

  void send(int dst, const void* buf, size_t bytes, uint64_t tag) override {
    const WaitSite site{"send", "to", dst, tag};
    check_peer(dst, "send");
    check_bytes(bytes, site);
    throw_if_aborted(site);
    Op op;
    post_send(op, site, buf, bytes);
    wait_ops(&op, 1);
  }

  void recv(int src, void* buf, size_t bytes, uint64_t tag) override {
    const WaitSite site{"recv", "from", src, tag};
    check_peer(src, "recv");
    check_bytes(bytes, site);
    throw_if_aborted(site);
    Op op;
    post_recv(op, site, buf, bytes, nullptr);
    wait_ops(&op, 1);
  }

  void sendrecv(int dst, const void* sbuf, size_t sbytes, int src, void* rbuf, size_t rbytes,
                uint64_t tag) override {
    exchange("sendrecv", dst, sbuf, sbytes, src, rbuf, rbytes, nullptr, tag);
  }

  void sendrecv_reduce(int dst, const float* sbuf, size_t scount, int src, float* acc, size_t rcount,
                       uint64_t tag) override {
    const size_t rbytes = rcount * sizeof(float);
    if (m_rscratch.size() < rbytes) m_rscratch.resize(rbytes);
    exchange("sendrecv_reduce", dst, sbuf, scount * sizeof(float), src, m_rscratch.data(), rbytes, &m_rscratch, tag);
    const float* in = reinterpret_cast<const float*>(m_rscratch.data());
    add_into(acc, in, rcount);
  }

  // MPI_Iallreduce on the runtime's collective communicator, in a transport-owned copy (a
  // collective cannot be cancelled either), waited for like every other call.
  void native_allreduce_sum(float* data, size_t count) override {
    const WaitSite site{"native allreduce (MPI_Iallreduce)", "", -1, 0};
    const size_t bytes = count * sizeof(float);
    check_bytes(bytes, site);
    throw_if_aborted(site);
    stage(data, bytes);
    Op op;
    op.kind = OpKind::Collective;
    op.site = site;
    op.owned = &m_stage;
    {
      std::lock_guard<std::mutex> lock(m_rt.mpi_mutex());
      m_rt.check(MPI_Iallreduce(MPI_IN_PLACE, m_stage.data(), static_cast<int>(count), MPI_FLOAT, MPI_SUM,
                                m_rt.coll_comm(), &op.req),
                 "MPI_Iallreduce");
    }
    wait_ops(&op, 1);
    if (bytes > 0) std::memcpy(data, m_stage.data(), bytes);
  }

  void abort(const std::string& reason) override { m_rt.abort_world(reason); }
  bool aborted() const override { return m_rt.aborted(); }
  std::string abort_reason() const override { return m_rt.abort_reason(); }

 private:
  static void add_into(float* __restrict acc, const float* __restrict in, size_t count) {
    for (size_t i = 0; i < count; ++i) acc[i] += in[i];
  }

  // Low bits of the lab tag, and its top two bits above them (run-internal tag ranges).
  int mpi_tag(uint64_t tag) const {
    const uint64_t low = tag & ((uint64_t{1} << m_low_bits) - 1);
    return static_cast<int>(low | ((tag >> 62) << m_low_bits));
  }

  std::string me() const { return "rank " + std::to_string(m_rt.rank()); }

  void check_peer(int peer, const char* call) const {
    if (peer < 0 || peer >= m_rt.size())
      throw CommError(me() + ": " + call + " with rank " + std::to_string(peer) + ", but the world has ranks 0.." +
                      std::to_string(m_rt.size() - 1));
  }

  void check_bytes(size_t bytes, const WaitSite& site) const {
    if (bytes > static_cast<size_t>(INT_MAX))
      throw CommError(me() + ": " + site_text(site) + ": " + std::to_string(bytes) +
                          " bytes in one message; the MPI transport sends at most 2 GiB - 1",
                      "split the buffer (MPI counts are int)");
  }

  void throw_if_aborted(const WaitSite& site) const {
    if (!m_rt.aborted()) return;
    throw CommError(me() + ": " + site_text(site) + " aborted: " + m_rt.abort_reason(),
                    "the first failing rank's error is the cause; this rank stopped because of it");
  }

  void stage(const void* buf, size_t bytes) {
    if (m_stage.size() < bytes) m_stage.resize(bytes);
    if (bytes > 0) std::memcpy(m_stage.data(), buf, bytes);
  }

  void* nonnull(void* p) { return p ? p : &m_dummy; }

  void post_send(Op& op, const WaitSite& site, const void* buf, size_t bytes) {
    stage(buf, bytes);
    op.kind = OpKind::Send;
    op.site = site;
    op.owned = &m_stage;
    std::lock_guard<std::mutex> lock(m_rt.mpi_mutex());
    m_rt.check(MPI_Isend(nonnull(m_stage.data()), static_cast<int>(bytes), MPI_BYTE, site.peer, mpi_tag(site.tag),
                         m_rt.data_comm(), &op.req),
               "MPI_Isend");
  }

  void post_recv(Op& op, const WaitSite& site, void* buf, size_t bytes, std::vector<char>* owned) {
    op.kind = owned ? OpKind::RecvOwned : OpKind::Recv;
    op.site = site;
    op.owned = owned;
    op.bytes = bytes;
    std::lock_guard<std::mutex> lock(m_rt.mpi_mutex());
    m_rt.check(MPI_Irecv(nonnull(buf), static_cast<int>(bytes), MPI_BYTE, site.peer, mpi_tag(site.tag),
                         m_rt.data_comm(), &op.req),
               "MPI_Irecv");
  }

  // One ring step: receive posted first (so the peer's send can land directly), then the send.
  void exchange(const char* call, int dst, const void* sbuf, size_t sbytes, int src, void* rbuf, size_t rbytes,
                std::vector<char>* owned, uint64_t tag) {
    check_peer(dst, call);
    check_peer(src, call);
    const WaitSite rsite{call, "from", src, tag};
    const WaitSite ssite{call, "to", dst, tag};
    check_bytes(sbytes, ssite);
    check_bytes(rbytes, rsite);
    throw_if_aborted(ssite);
    Op ops[2];
    post_recv(ops[0], rsite, rbuf, rbytes, owned);
    try {
      post_send(ops[1], ssite, sbuf, sbytes);
    } catch (...) {
      give_up(ops, 1);
      throw;
    }
    wait_ops(ops, 2);
  }

  // Tests every unfinished op once; true when all are done. Completed receives are checked for
  // their size here (a mismatch throws).
  bool test_ops(Op* ops, int n) {
    bool all = true;
    for (int i = 0; i < n; ++i) {
      Op& op = ops[i];
      if (op.done) continue;
      int flag = 0;
      int rc;
      {
        std::lock_guard<std::mutex> lock(m_rt.mpi_mutex());
        rc = MPI_Test(&op.req, &flag, &op.status);
      }
      if (rc != MPI_SUCCESS) {
        op.done = true;  // MPI has finished with it, in error
        int cls = 0;
        MPI_Error_class(rc, &cls);
        if (cls == MPI_ERR_TRUNCATE || (cls == MPI_ERR_IN_STATUS && op.status.MPI_ERROR == MPI_ERR_TRUNCATE))
          size_mismatch(op, "more than " + std::to_string(op.bytes));
        m_rt.check(rc, (site_text(op.site) + " (tag " + std::to_string(op.site.tag) + ")").c_str());
      }
      if (!flag) {
        all = false;
        continue;
      }
      op.done = true;
      if (op.kind == OpKind::Recv || op.kind == OpKind::RecvOwned) {
        int count = 0;
        MPI_Get_count(&op.status, MPI_BYTE, &count);
        if (static_cast<size_t>(count) != op.bytes) size_mismatch(op, std::to_string(count));
      }
    }
    return all;
  }

  [[noreturn]] void size_mismatch(const Op& op, const std::string& sent) {
    const std::string msg = me() + ": " + op.site.call + " from rank " + std::to_string(op.site.peer) + " (tag " +
                            std::to_string(op.site.tag) + "): size mismatch: rank " +
                            std::to_string(op.site.peer) + " sent " + sent + " bytes, " + me() + " expects " +
                            std::to_string(op.bytes) + " bytes";
    m_rt.abort_world(msg);
    throw CommError(msg, "a bug: both ranks must run the same collective with the same sizes");
  }

  // What this rank answers to wait-chain queries while it waits; cleared by the destructor.
  struct WaitMark {
    MpiRuntime& rt;
    WaitMark(MpiRuntime& r, int peer) : rt(r) { rt.set_waiting_for(peer); }
    ~WaitMark() { rt.set_waiting_for(MpiRuntime::kNotWaiting); }
  };

  const Op& first_pending(const Op* ops, int n) const {
    for (int i = 0; i < n; ++i)
      if (!ops[i].done) return ops[i];
    return ops[0];
  }

  // Waits until every op is done (see the protocol at the top). Throws CommError on abort,
  // timeout, size mismatch or an MPI error, after giving up the unfinished ops.
  void wait_ops(Op* ops, int n) {
    try {
      if (test_ops(ops, n)) return;
      const Op& first = first_pending(ops, n);
      WaitMark mark(m_rt, first.site.peer >= 0 ? first.site.peer : MpiRuntime::kInCollective);
      double waited = 0;  // seconds of waiting that count towards the timeout
      const double start = now_seconds();
      double last = start;
      for (int spins = 0;;) {
        if (test_ops(ops, n)) return;
        const WaitSite site = first_pending(ops, n).site;
        m_rt.set_waiting_for(site.peer >= 0 ? site.peer : MpiRuntime::kInCollective);
        throw_if_aborted(site);  // polls the control channel
        if (spins < kSpinIters) {
          ++spins;
          continue;
        }
        const double now = now_seconds();
        const bool held = m_hold && m_hold->load(std::memory_order_relaxed);
        if (!held) waited += now - last;  // a paused run does not advance the deadline
        last = now;
        if (waited > m_timeout) throw_timeout(site);
        if (now - start < kYieldSeconds)
          std::this_thread::yield();
        else
          std::this_thread::sleep_for(std::chrono::microseconds(kSleepMicros));
      }
    } catch (...) {
      give_up(ops, n);
      throw;
    }
  }

  // Leaves no MPI operation pointing into the caller's memory (see the protocol at the top).
  void give_up(Op* ops, int n) {
    for (int i = 0; i < n; ++i) {
      Op& op = ops[i];
      if (op.done || op.req == MPI_REQUEST_NULL) continue;
      if (op.kind == OpKind::Recv || op.kind == OpKind::RecvOwned) {
        std::lock_guard<std::mutex> lock(m_rt.mpi_mutex());
        MPI_Cancel(&op.req);
      }
      if (op.kind == OpKind::Recv) {
        const double start = now_seconds();
        for (;;) {
          int flag = 0;
          {
            std::lock_guard<std::mutex> lock(m_rt.mpi_mutex());
            if (MPI_Test(&op.req, &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS) flag = 1;
          }
          if (flag) break;
          m_rt.service_control();
          if (now_seconds() - start > kCancelSeconds) {
            m_rt.poison("a receive from rank " + std::to_string(op.site.peer) +
                        " could be neither cancelled nor completed");
            break;
          }
          std::this_thread::sleep_for(std::chrono::microseconds(kSleepMicros));
        }
      } else {
        // The op's buffer goes with it; the transport starts a fresh one next time.
        m_rt.orphan(op.req, std::move(*op.owned));
        op.owned->clear();
      }
      op.done = true;
    }
  }

  std::string describe_answer(int p, const std::optional<int>& a) const {
    const std::string rp = "rank " + std::to_string(p);
    if (!a) return rp + " does not answer (busy outside the transport, e.g. computing, or stuck)";
    if (*a == MpiRuntime::kNotWaiting)
      return rp + " is not waiting in any transport call (busy elsewhere, or it has left this collective)";
    if (*a == MpiRuntime::kFinished) return rp + " has finished its run";
    if (*a == MpiRuntime::kInCollective) return rp + " waits in the native allreduce";
    return rp + " waits for rank " + std::to_string(*a);
  }

  // "; rank 3 waits for rank 2; rank 2 waits for rank 1; rank 1 is not waiting in any transport
  // call (...)": asks each rank on the way whom it waits for, so a timeout names the rank at the
  // end of the chain (the one that is really missing) and not only the nearest neighbour.
  std::string wait_chain(int peer) {
    const int me_rank = m_rt.rank();
    if (peer == me_rank) return "";
    std::vector<bool> seen(static_cast<size_t>(m_rt.size()), false);
    seen[static_cast<size_t>(me_rank)] = true;
    std::string s;
    for (int p = peer;;) {
      seen[static_cast<size_t>(p)] = true;
      const std::optional<int> a = m_rt.query_waiting_for(p, kQuerySeconds);
      s += "; " + describe_answer(p, a);
      if (!a || *a < 0 || *a >= m_rt.size()) return s;
      if (seen[static_cast<size_t>(*a)]) return s + " (a wait cycle: deadlock)";
      p = *a;
    }
  }

  // For a collective: which ranks are not in it.
  std::string collective_chain() {
    std::string s;
    for (int p = 0; p < m_rt.size(); ++p) {
      if (p == m_rt.rank()) continue;
      const std::optional<int> a = m_rt.query_waiting_for(p, kQuerySeconds);
      if (a && *a == MpiRuntime::kInCollective) continue;
      s += "; " + describe_answer(p, a);
    }
    return s;
  }

  // A timeout fails the whole world: this rank aborts with the timeout message, so the ranks
  // still waiting fail at once with the same cause instead of timing out one after another.
  [[noreturn]] void throw_timeout(const WaitSite& site) {
    const std::string chain = site.peer >= 0 ? wait_chain(site.peer) : collective_chain();
    throw_if_aborted(site);  // another rank failed meanwhile: report that cause instead
    const std::string msg =
        site.peer >= 0 ? me() + ": timed out after " + seconds_text(m_timeout) + " s waiting for rank " +
                             std::to_string(site.peer) + " (" + site_text(site) + ", tag " +
                             std::to_string(site.tag) + ")" + chain
                       : me() + ": timed out after " + seconds_text(m_timeout) + " s in " + site.call + chain;
    m_rt.abort_world(msg);
    throw CommError(msg,
                    "a rank that never reaches a collective (it finished early, is stuck, or runs a "
                    "different collective) makes its peers time out; see the wait chain");
  }

  MpiRuntime& m_rt;
  int m_low_bits = 29;
  std::vector<char> m_stage;     // outgoing copy of the current send / native allreduce buffer
  std::vector<char> m_rscratch;  // incoming chunk of sendrecv_reduce
  char m_dummy = 0;              // a valid address for zero-byte messages
};

MpiWorld::MpiWorld(MpiRuntime& runtime, const RunConfig& cfg) : m_rt(runtime) {
  if (cfg.world_size != runtime.size())
    throw ConfigError("--world-size " + std::to_string(cfg.world_size) + " does not match the MPI world of " +
                          std::to_string(runtime.size()) + " processes",
                      "with --comm mpi the world size is taken from mpirun -np; leave out --world-size");
  m_transport = std::make_unique<TransportMpi>(runtime);
}

MpiWorld::~MpiWorld() = default;

int MpiWorld::world_size() const { return m_rt.size(); }

std::vector<int> MpiWorld::local_ranks() const { return {m_rt.rank()}; }

Transport& MpiWorld::transport(int rank) {
  if (rank != m_rt.rank())
    throw ConfigError("rank " + std::to_string(rank) + " lives in another process; this process is rank " +
                      std::to_string(m_rt.rank()) + " of the MPI job");
  return *m_transport;
}

}  // namespace lab
