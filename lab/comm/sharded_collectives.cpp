// Reduce-scatter and allgather of equal blocks, in place: see sharded_collectives.h.
//
// Supported: every world size for ring and naive, powers of two for tree; every count (0
// included: empty blocks still take their steps as 0-byte messages).
#include "sharded_collectives.h"

#include <algorithm>

namespace lab {

namespace {

int mod(int a, int n) { return ((a % n) + n) % n; }

// The Chunk event of one call's messages, and the bookkeeping of each: gate, time, bytes, record.
class Steps {
 public:
  Steps(Communicator& comm, const char* op, uint64_t seq, CollectiveInfo info)
      : m_comm(comm), m_e(comm.chunk_event(op, seq, info)) {}

  // Runs transfer() as step `s` of `phase`, from src to dst, carrying `bytes` of block `block`.
  // Only the sender records the event and counts the bytes; every party calls the gate.
  template <class F>
  void run(Phase phase, int s, int src, int dst, int block, size_t bytes, F&& transfer) {
    m_e.phase = phase;
    m_e.ring_step = s;
    m_e.src = src;
    m_e.dst = dst;
    m_e.chunk = block;
    m_e.bytes = bytes;
    m_e.t_start = m_e.t_end = 0;
    m_comm.gate(m_e);
    m_e.t_start = now_seconds();
    transfer();
    m_e.t_end = now_seconds();
    if (src == m_comm.rank()) {
      m_comm.add_bytes_sent(bytes);
      m_comm.record(m_e);
    }
  }

 private:
  Communicator& m_comm;
  Event m_e;
};

// G segments per block, the same G on every rank; segment j of block b is its elements
// [count j / G, count (j + 1) / G).
struct Segments {
  size_t count = 0;
  size_t g = 1;
  Segments(size_t count_, size_t segment_bytes) : count(count_) {
    const size_t elems = std::max<size_t>(1, segment_bytes / sizeof(float));
    g = std::max<size_t>(1, (count + elems - 1) / elems);
  }
  size_t begin(int b, size_t j) const { return static_cast<size_t>(b) * count + count * j / g; }
  size_t size(size_t j) const { return count * (j + 1) / g - count * j / g; }
};

}  // namespace

void ring_reduce_scatter(Communicator& comm, float* data, size_t count, CollectiveInfo info, size_t segment_bytes,
                         DeviceMemory* mem) {
  Transport& t = comm.transport();
  const int n = comm.world_size();
  const int r = comm.rank();
  const uint64_t seq = comm.next_seq();
  Event whole = comm.collective_event("reduce_scatter", seq, info, static_cast<uint64_t>(n) * count * sizeof(float));
  const int next = mod(r + 1, n), prev = mod(r - 1, n);
  const Segments seg(count, segment_bytes);
  Steps steps(comm, "reduce_scatter", seq, info);
  for (size_t j = 0; n > 1 && j < seg.g; ++j) {
    const size_t len = seg.size(j);
    for (int s = 0; s < n - 1; ++s) {
      const int send_b = mod(r - s - 1, n);
      const int recv_b = mod(r - s - 2, n);
      steps.run(Phase::ReduceScatter, s, r, next, send_b, len * sizeof(float), [&] {
        if (mem)
          t.sendrecv_reduce_on(*mem, next, data + seg.begin(send_b, j), len, prev, data + seg.begin(recv_b, j), len, seq);
        else
          t.sendrecv_reduce(next, data + seg.begin(send_b, j), len, prev, data + seg.begin(recv_b, j), len, seq);
      });
    }
  }
  whole.t_end = now_seconds();
  comm.record(whole);
}

void ring_allgather(Communicator& comm, float* data, size_t count, CollectiveInfo info, size_t segment_bytes,
                    DeviceMemory* mem) {
  Transport& t = comm.transport();
  const int n = comm.world_size();
  const int r = comm.rank();
  const uint64_t seq = comm.next_seq();
  Event whole = comm.collective_event("allgather", seq, info, static_cast<uint64_t>(n) * count * sizeof(float));
  const int next = mod(r + 1, n), prev = mod(r - 1, n);
  const Segments seg(count, segment_bytes);
  Steps steps(comm, "allgather", seq, info);
  for (size_t j = 0; n > 1 && j < seg.g; ++j) {
    const size_t bytes = seg.size(j) * sizeof(float);
    for (int s = 0; s < n - 1; ++s) {
      const int send_b = mod(r - s, n);
      const int recv_b = mod(r - s - 1, n);
      steps.run(Phase::Allgather, s, r, next, send_b, bytes, [&] {
        if (mem)
          t.sendrecv_on(*mem, next, data + seg.begin(send_b, j), bytes, prev, data + seg.begin(recv_b, j), bytes, seq);
        else
          t.sendrecv(next, data + seg.begin(send_b, j), bytes, prev, data + seg.begin(recv_b, j), bytes, seq);
      });
    }
  }
  whole.t_end = now_seconds();
  comm.record(whole);
}

// One-directional transfers are sendrecv calls with an empty other half, as in the naive
// allreduce: the transport's zero-copy path, and the empty message back tells the sender that its
// buffer has been consumed.
void naive_reduce_scatter(Communicator& comm, float* data, size_t count, CollectiveInfo info) {
  Transport& t = comm.transport();
  const int n = comm.world_size();
  const int r = comm.rank();
  const uint64_t seq = comm.next_seq();
  const size_t all = static_cast<size_t>(n) * count;
  Event whole = comm.collective_event("reduce_scatter", seq, info, all * sizeof(float));
  Steps steps(comm, "reduce_scatter", seq, info);
  const size_t block_bytes = count * sizeof(float);
  if (n > 1) {
    if (r == 0) {
      // acc = ((x0 + x1) + x2) + ..., every rank's whole buffer added straight from its sender
      for (int src = 1; src < n; ++src)
        steps.run(Phase::Gather, src - 1, src, 0, 0, all * sizeof(float),
                  [&] { t.sendrecv_reduce(src, nullptr, 0, src, data, all, seq); });
      for (int dst = 1; dst < n; ++dst)
        steps.run(Phase::Scatter, dst - 1, 0, dst, dst, block_bytes, [&] {
          t.sendrecv(dst, data + static_cast<size_t>(dst) * count, block_bytes, dst, nullptr, 0, seq);
        });
    } else {
      steps.run(Phase::Gather, r - 1, r, 0, 0, all * sizeof(float),
                [&] { t.sendrecv(0, data, all * sizeof(float), 0, nullptr, 0, seq); });
      steps.run(Phase::Scatter, r - 1, 0, r, r, block_bytes, [&] {
        t.sendrecv(0, nullptr, 0, 0, data + static_cast<size_t>(r) * count, block_bytes, seq);
      });
    }
  }
  whole.t_end = now_seconds();
  comm.record(whole);
}

void naive_allgather(Communicator& comm, float* data, size_t count, CollectiveInfo info) {
  Transport& t = comm.transport();
  const int n = comm.world_size();
  const int r = comm.rank();
  const uint64_t seq = comm.next_seq();
  const size_t all_bytes = static_cast<size_t>(n) * count * sizeof(float);
  Event whole = comm.collective_event("allgather", seq, info, all_bytes);
  Steps steps(comm, "allgather", seq, info);
  const size_t block_bytes = count * sizeof(float);
  if (n > 1) {
    if (r == 0) {
      for (int src = 1; src < n; ++src)
        steps.run(Phase::Gather, src - 1, src, 0, src, block_bytes, [&] {
          t.sendrecv(src, nullptr, 0, src, data + static_cast<size_t>(src) * count, block_bytes, seq);
        });
      for (int dst = 1; dst < n; ++dst)
        steps.run(Phase::Broadcast, dst - 1, 0, dst, 0, all_bytes,
                  [&] { t.sendrecv(dst, data, all_bytes, dst, nullptr, 0, seq); });
    } else {
      steps.run(Phase::Gather, r - 1, r, 0, r, block_bytes, [&] {
        t.sendrecv(0, data + static_cast<size_t>(r) * count, block_bytes, 0, nullptr, 0, seq);
      });
      steps.run(Phase::Broadcast, r - 1, 0, r, 0, all_bytes, [&] { t.sendrecv(0, nullptr, 0, 0, data, all_bytes, seq); });
    }
  }
  whole.t_end = now_seconds();
  comm.record(whole);
}

void tree_reduce_scatter(Communicator& comm, float* data, size_t count, CollectiveInfo info) {
  Transport& t = comm.transport();
  const int n = comm.world_size();
  const int r = comm.rank();
  const uint64_t seq = comm.next_seq();
  Event whole = comm.collective_event("reduce_scatter", seq, info, static_cast<uint64_t>(n) * count * sizeof(float));
  Steps steps(comm, "reduce_scatter", seq, info);
  int k = 0;
  for (int d = n / 2; d >= 1; d /= 2, ++k) {
    const int partner = r ^ d;
    const int lo = r & ~(2 * d - 1);           // the current range: 2d blocks from lo
    const int keep = (r & d) ? lo + d : lo;    // the half that holds block r
    const int give = (r & d) ? lo : lo + d;
    const size_t len = static_cast<size_t>(d) * count;
    steps.run(Phase::ReduceScatter, k, r, partner, give, len * sizeof(float), [&] {
      t.sendrecv_reduce(partner, data + static_cast<size_t>(give) * count, len, partner,
                        data + static_cast<size_t>(keep) * count, len, seq);
    });
  }
  whole.t_end = now_seconds();
  comm.record(whole);
}

void tree_allgather(Communicator& comm, float* data, size_t count, CollectiveInfo info) {
  Transport& t = comm.transport();
  const int n = comm.world_size();
  const int r = comm.rank();
  const uint64_t seq = comm.next_seq();
  Event whole = comm.collective_event("allgather", seq, info, static_cast<uint64_t>(n) * count * sizeof(float));
  Steps steps(comm, "allgather", seq, info);
  int k = 0;
  for (int d = 1; d < n; d *= 2, ++k) {
    const int partner = r ^ d;
    const int mine = r & ~(d - 1);             // this rank's finished range: d blocks
    const int theirs = partner & ~(d - 1);
    const size_t bytes = static_cast<size_t>(d) * count * sizeof(float);
    steps.run(Phase::Allgather, k, r, partner, mine, bytes, [&] {
      t.sendrecv(partner, data + static_cast<size_t>(mine) * count, bytes, partner,
                 data + static_cast<size_t>(theirs) * count, bytes, seq);
    });
  }
  whole.t_end = now_seconds();
  comm.record(whole);
}

}  // namespace lab
