// Communicator: collectives over a Transport, with numbering, events and error context.
//
// Error protocol. Each collective runs inside `guarded`: when anything throws on this rank,
//   - the world is aborted with the cause (Transport::abort; the first reason world-wide wins),
//     so every other rank's blocked call fails at once instead of waiting for its timeout;
//   - a transport CommError is rethrown as a CommError naming this rank, the operation, its
//     op_seq, what/tag and the training step, e.g.
//     "rank 1: allreduce #12 (grad bucket 0) at step 3: sendrecv_reduce from rank 0 aborted:
//      rank 2 failed: injected failure";
//   - any other exception (the rank's own failure, e.g. from a StepGate) is rethrown unchanged.
// Tags: every message of a collective carries tag = op_seq, identical on all ranks.
#include "communicator.h"

#include <algorithm>
#include <cstring>
#include <exception>
#include <string>

#include "errors.h"
#include "naive_allreduce.h"
#include "ring_allreduce.h"
#include "sharded_collectives.h"
#include "tree_allreduce.h"

namespace lab {

namespace {

int mod(int a, int n) { return ((a % n) + n) % n; }

// "allreduce #12 (grad bucket 0) at step 3"
std::string describe(const char* op, uint64_t seq, CollectiveInfo info, int64_t train_step) {
  std::string s = std::string(op) + " #" + std::to_string(seq);
  const bool has_what = info.what && info.what[0];
  if (has_what || info.tag >= 0) {
    s += " (";
    if (has_what) s += info.what;
    if (info.tag >= 0) s += (has_what ? " " : "tag ") + std::to_string(info.tag);
    s += ")";
  }
  if (train_step >= 0) s += " at step " + std::to_string(train_step);
  return s;
}

// Drops a leading "rank R: " (this rank's own prefix) so the context is not said twice.
std::string strip_rank(const std::string& msg, int rank) {
  const std::string prefix = "rank " + std::to_string(rank) + ": ";
  return msg.compare(0, prefix.size(), prefix) == 0 ? msg.substr(prefix.size()) : msg;
}

template <class Body>
void guarded(Communicator& comm, const char* op, uint64_t seq, CollectiveInfo info, Body&& body) {
  try {
    body();
  } catch (const CommError& e) {
    const std::string detail = strip_rank(e.what(), comm.rank());
    comm.transport().abort(detail);  // no-op when another rank aborted first
    throw CommError("rank " + std::to_string(comm.rank()) + ": " +
                        describe(op, seq, info, comm.train_step()) + ": " + detail,
                    e.hint());
  } catch (const std::exception& e) {
    comm.transport().abort(strip_rank(e.what(), comm.rank()));
    throw;
  } catch (...) {
    comm.transport().abort("unknown exception in " + describe(op, seq, info, comm.train_step()));
    throw;
  }
}


}  // namespace

Communicator::Communicator(Transport& transport, EventLog* log, StepGate* gate)
    : m_t(transport), m_log(log), m_gate(gate) {}

std::unique_ptr<Communicator> Communicator::sub(Transport& group) const {
  auto c = std::make_unique<Communicator>(group, m_log, m_gate);
  c->m_algorithm = m_algorithm;
  c->m_arrival_order = m_arrival_order;
  return c;
}

int Communicator::rank() const { return m_t.rank(); }
int Communicator::world_size() const { return m_t.world_size(); }

// Events carry world ranks: a process group's (group_transport.h) are translated here, with its name.
Event Communicator::in_world(const Event& e) const {
  const char* g = m_t.group_name();
  if (!g || !g[0]) return e;
  Event w = e;
  w.group = g;
  if (w.rank >= 0 && w.rank < m_t.world_size()) w.rank = m_t.world_rank(w.rank);
  if (w.src >= 0 && w.src < m_t.world_size()) w.src = m_t.world_rank(w.src);
  if (w.dst >= 0 && w.dst < m_t.world_size()) w.dst = m_t.world_rank(w.dst);
  return w;
}

void Communicator::record(const Event& e) {
  if (m_log) m_log->record(in_world(e));
}

void Communicator::record_device_events(int64_t step) {
  if (!m_device_events) return;
  m_device_buf.clear();
  m_device_events(m_device_buf);
  for (Event& d : m_device_buf) {
    d.kind = EventKind::Device;
    d.rank = rank();
    d.train_step = step;
    record(d);
  }
}

void Communicator::gate(const Event& next) {
  if (m_gate) m_gate->before_step(m_t.world_rank(rank()), in_world(next));
}

const char* allreduce_algorithm_name(AllreduceAlgorithm a) {
  switch (a) {
    case AllreduceAlgorithm::Ring: return "ring";
    case AllreduceAlgorithm::Naive: return "naive";
    case AllreduceAlgorithm::Tree: return "tree";
    case AllreduceAlgorithm::Native: return "mpi";
  }
  return "?";
}

AllreduceAlgorithm parse_allreduce_algorithm(const std::string& name) {
  if (name == "nccl") return AllreduceAlgorithm::Native;  // NCCL's own (--comm nccl)
  for (AllreduceAlgorithm a : {AllreduceAlgorithm::Ring, AllreduceAlgorithm::Naive, AllreduceAlgorithm::Tree,
                               AllreduceAlgorithm::Native})
    if (name == allreduce_algorithm_name(a)) return a;
  throw ConfigError("--allreduce: unknown algorithm '" + name + "'",
                    "choose ring, naive (gather to rank 0), tree (recursive halving-doubling), mpi or nccl "
                    "(the transport's own, with --comm mpi or --comm nccl)");
}

void Communicator::allreduce_sum(float* data, size_t count, CollectiveInfo info, DeviceMemory* mem) {
  if (mem && !allreduce_on_device()) {  // staged through host memory
    m_staged.resize(count);
    if (count > 0) mem->download(m_staged.data(), data, count * sizeof(float));
    allreduce_sum(m_staged.data(), count, info);
    if (count > 0) mem->upload(data, m_staged.data(), count * sizeof(float));
    return;
  }
  guarded(*this, "allreduce", m_seq, info, [&] {
    switch (m_algorithm) {
      case AllreduceAlgorithm::Ring: ring_allreduce_pipelined(*this, data, count, info, kRingSegmentBytes, mem); break;
      case AllreduceAlgorithm::Naive: naive_allreduce(*this, data, count, info); break;
      case AllreduceAlgorithm::Tree: tree_allreduce(*this, data, count, info); break;
      case AllreduceAlgorithm::Native: {
        // A black box: its steps are not visible, so no gate and no chunk events.
        const uint64_t seq = next_seq();
        Event whole = collective_event("allreduce", seq, info, count * sizeof(float));
        if (mem)
          m_t.native_allreduce_sum_on(*mem, data, count);
        else
          m_t.native_allreduce_sum(data, count);
        whole.t_end = now_seconds();
        record(whole);
        break;
      }
    }
  });
}

// Chain from root: rank at position p = (rank - root) mod N receives each segment from p - 1 and
// forwards it to p + 1. send() is buffered, so segment k + 1 flows down the chain while segment k
// is still being forwarded further on (a pipeline without a ring). Chunk events: one per segment
// sent, chunk = segment index, ring_step = p (the hop).
void Communicator::broadcast(void* data, size_t bytes, int root, CollectiveInfo info) {
  const uint64_t seq = next_seq();
  guarded(*this, "broadcast", seq, info, [&] {
    const int n = world_size();
    const int r = rank();
    if (root < 0 || root >= n)
      throw CommError("broadcast root " + std::to_string(root) + " is not a rank of a world of " + std::to_string(n));
    Event whole = collective_event("broadcast", seq, info, bytes);
    const int p = mod(r - root, n);
    const int prev = mod(r - 1, n);
    const int next = mod(r + 1, n);
    const size_t segments = bytes == 0 ? 1 : (bytes + kBroadcastSegmentBytes - 1) / kBroadcastSegmentBytes;
    char* buf = static_cast<char*>(data);
    Event e = chunk_event("broadcast", seq, info);
    e.phase = Phase::Broadcast;
    e.dst = next;
    e.ring_step = p;
    for (size_t k = 0; n > 1 && k < segments; ++k) {
      const size_t off = k * kBroadcastSegmentBytes;
      const size_t len = bytes == 0 ? 0 : std::min(kBroadcastSegmentBytes, bytes - off);
      if (p > 0) m_t.recv(prev, buf + off, len, seq);
      if (p < n - 1) {
        e.chunk = static_cast<int32_t>(k);
        e.bytes = len;
        e.t_start = e.t_end = 0;
        gate(e);
        e.t_start = now_seconds();
        m_t.send(next, buf + off, len, seq);
        e.t_end = now_seconds();
        add_bytes_sent(len);
        record(e);
      }
    }
    whole.t_end = now_seconds();
    record(whole);
  });
}

// Ring allgather of equal blocks: block b (count floats) is rank b's input. Step s = 0 .. N-2:
// rank r sends block (r - s) mod N to r + 1 and receives block (r - s - 1) mod N from r - 1, both
// zero-copy straight between the ranks' `all` buffers.
void Communicator::allgather(const float* mine, size_t count, float* all, CollectiveInfo info, DeviceMemory* mem) {
  if (mem && !m_t.device_aware()) {  // staged through host memory
    const size_t n = static_cast<size_t>(world_size()) * count;
    m_staged.resize(n + count);
    if (count > 0) mem->download(m_staged.data() + n, mine, count * sizeof(float));
    allgather(m_staged.data() + n, count, m_staged.data(), info);
    if (n > 0) mem->upload(all, m_staged.data(), n * sizeof(float));
    return;
  }
  const uint64_t seq = next_seq();
  guarded(*this, "allgather", seq, info, [&] {
    const int n = world_size();
    const int r = rank();
    Event whole = collective_event("allgather", seq, info, static_cast<uint64_t>(n) * count * sizeof(float));
    float* own = all + static_cast<size_t>(r) * count;
    if (own != mine && count > 0) {
      if (mem)
        mem->copy(own, mine, count * sizeof(float));  // (not overlapping: mine is the caller's own buffer)
      else
        std::memmove(own, mine, count * sizeof(float));
    }
    const size_t block_bytes = count * sizeof(float);
    Event e = chunk_event("allgather", seq, info);
    e.phase = Phase::Allgather;
    e.dst = mod(r + 1, n);
    e.bytes = block_bytes;
    for (int s = 0; s < n - 1; ++s) {
      const int send_block = mod(r - s, n);
      const int recv_block = mod(r - s - 1, n);
      e.chunk = send_block;
      e.ring_step = s;
      e.t_start = e.t_end = 0;
      gate(e);
      e.t_start = now_seconds();
      float* sbuf = all + static_cast<size_t>(send_block) * count;
      float* rbuf = all + static_cast<size_t>(recv_block) * count;
      if (mem)
        m_t.sendrecv_on(*mem, e.dst, sbuf, block_bytes, mod(r - 1, n), rbuf, block_bytes, seq);
      else
        m_t.sendrecv(e.dst, sbuf, block_bytes, mod(r - 1, n), rbuf, block_bytes, seq);
      e.t_end = now_seconds();
      add_bytes_sent(block_bytes);
      record(e);
    }
    whole.t_end = now_seconds();
    record(whole);
  });
}

namespace {

// The refusals of reduce_scatter_sum and allgather_in_place: the same on every rank, before
// anything is sent.
void check_sharded_algorithm(AllreduceAlgorithm a, int n, const char* op) {
  if (a == AllreduceAlgorithm::Native)
    throw ConfigError(std::string(op) + ": the transport's own (--allreduce mpi or nccl) is not available for it",
                      "use --allreduce ring, naive or tree");
  if (a == AllreduceAlgorithm::Tree && !tree_collectives_fit(n))
    throw ConfigError(std::string(op) + " with --allreduce tree needs a power-of-two world size, not " + std::to_string(n),
                      "recursive halving/doubling would leave the ranks beyond the largest power of two without a "
                      "block of their own: use --allreduce ring or naive");
}

}  // namespace

void Communicator::reduce_scatter_sum(float* data, size_t count, CollectiveInfo info, DeviceMemory* mem) {
  blocks_collective("reduce_scatter", data, count, info, mem);
}

void Communicator::allgather_in_place(float* data, size_t count, CollectiveInfo info, DeviceMemory* mem) {
  blocks_collective("allgather", data, count, info, mem);
}

// reduce_scatter_sum and allgather_in_place: the refusals, the staging of a device buffer where
// the algorithm cannot work there, and the algorithm (sharded_collectives.h).
void Communicator::blocks_collective(const char* op, float* data, size_t count, CollectiveInfo info, DeviceMemory* mem) {
  check_sharded_algorithm(m_algorithm, world_size(), op);
  const bool rs = std::strcmp(op, "reduce_scatter") == 0;
  const size_t all = static_cast<size_t>(world_size()) * count;
  if (mem && !(m_algorithm == AllreduceAlgorithm::Ring && m_t.device_aware())) {  // staged through host memory
    m_staged.resize(all);
    if (all > 0) mem->download(m_staged.data(), data, all * sizeof(float));
    blocks_collective(op, m_staged.data(), count, info, nullptr);
    if (all > 0) mem->upload(data, m_staged.data(), all * sizeof(float));
    return;
  }
  guarded(*this, op, m_seq, info, [&] {
    switch (m_algorithm) {
      case AllreduceAlgorithm::Naive:
        return rs ? naive_reduce_scatter(*this, data, count, info) : naive_allgather(*this, data, count, info);
      case AllreduceAlgorithm::Tree:
        return rs ? tree_reduce_scatter(*this, data, count, info) : tree_allgather(*this, data, count, info);
      default:
        return rs ? ring_reduce_scatter(*this, data, count, info, kShardSegmentBytes, mem)
                  : ring_allgather(*this, data, count, info, kShardSegmentBytes, mem);
    }
  });
}

Event Communicator::collective_event(const char* op, uint64_t seq, CollectiveInfo info, uint64_t bytes) const {
  Event e = chunk_event(op, seq, info);
  e.kind = EventKind::Collective;
  e.src = e.dst = -1;
  e.bytes = bytes;
  e.t_start = now_seconds();
  return e;
}

Event Communicator::chunk_event(const char* op, uint64_t seq, CollectiveInfo info) const {
  Event e;
  e.kind = EventKind::Chunk;
  e.op = op;
  e.what = info.what;
  e.tag = info.tag;
  e.rank = rank();
  e.src = rank();
  e.op_seq = seq;
  e.train_step = m_train_step;
  return e;
}

}  // namespace lab
