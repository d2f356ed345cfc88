// Naive allreduce over any Transport: see naive_allreduce.h for the protocol.
//
// Supported: every world size (1 .. N), every count (0 included: 0-byte transfers still take
// their steps). One-directional transfers are sendrecv calls with an empty other half: that is
// the transport's zero-copy path (rank 0 adds straight from the sender's buffer, fused), where a
// plain send() may first copy the buffer and a plain recv() cannot add; the empty message back
// also tells the sender that its buffer has been consumed.
#include "naive_allreduce.h"

#include <algorithm>
#include <vector>

#include "mutation.h"

namespace lab {

void naive_allreduce(Communicator& comm, float* data, size_t count, CollectiveInfo info) {
  Transport& t = comm.transport();
  const int n = comm.world_size();
  const int r = comm.rank();
  const uint64_t seq = comm.next_seq();
  const uint64_t tag = seq;  // every message of this call: ranks that disagree time out
  const size_t bytes = count * sizeof(float);

  Event whole = comm.collective_event("allreduce", seq, info, bytes);

  // the transfer of the next step; recorded by its sender

  Event e = comm.chunk_event("allreduce", seq, info);
  e.chunk = 0;  // the whole buffer is one block
  e.bytes = bytes;

  // Runs one step: gate, transfer, and (when this rank sends) the bookkeeping of its Chunk event.
  auto step = [&](Phase phase, int s, int src, int dst, auto&& transfer) {
    e.phase = phase;
    e.ring_step = s;
    e.src = src;
    e.dst = dst;
    e.t_start = e.t_end = 0;
    comm.gate(e);
    e.t_start = now_seconds();
    transfer();
    e.t_end = now_seconds();
    if (src == r) {
      comm.add_bytes_sent(bytes);
      comm.record(e);
    }
  };

  if (n > 1) {
    if (r == 0 && comm.arrival_order()) {
      // --nondeterministic: gather in arrival order, acc = ((x0 + xa) + xb) + ... for whichever
      // rank a arrives first, then b, ...: the bits depend on timing.
      std::vector<int> waiting;
      for (int src = 1; src < n; ++src) waiting.push_back(src);
      std::vector<float> in(count);
      for (int s = 0; s < n - 1; ++s) {
        int src = -1;
        step(Phase::Gather, s, -1, 0, [&] {
          src = t.recv_any(waiting, in.data(), bytes, tag);
          for (size_t i = 0; i < count; ++i) data[i] += in[i];
          t.send(src, nullptr, 0, tag);  // the empty half of the sender's sendrecv
        });
        waiting.erase(std::find(waiting.begin(), waiting.end(), src));
      }
      for (int dst = 1; dst < n; ++dst)
        step(Phase::Broadcast, dst - 1, 0, dst, [&] { t.sendrecv(dst, data, bytes, dst, nullptr, 0, tag); });
    } else if (!comm.arrival_order() && mutated("naive-relay")) {
      // A lesson's mutation test (mutation.h): the sum leaves rank 0 once and is passed on from
      // rank to rank (broadcast step s: rank s -> s + 1); the gather is the usual one.
      if (r == 0)
        for (int src = 1; src < n; ++src)
          step(Phase::Gather, src - 1, src, 0, [&] { t.sendrecv_reduce(src, nullptr, 0, src, data, count, tag); });
      else
        step(Phase::Gather, r - 1, r, 0, [&] { t.sendrecv(0, data, bytes, 0, nullptr, 0, tag); });
      if (r > 0) step(Phase::Broadcast, r - 1, r - 1, r, [&] { t.sendrecv(r - 1, nullptr, 0, r - 1, data, bytes, tag); });
      if (r < n - 1) step(Phase::Broadcast, r, r, r + 1, [&] { t.sendrecv(r + 1, data, bytes, r + 1, nullptr, 0, tag); });
    } else if (r == 0) {
      // Gather in rank order: acc = ((x0 + x1) + x2) + ..., added straight from each sender's buffer.
      // (The mutation naive-drops-last-rank, mutation.h, receives the last rank's buffer and leaves
      // it out of the sum.)
      const bool drop_last = mutated("naive-drops-last-rank");
      std::vector<float> dropped;
      for (int src = 1; src < n; ++src)
        step(Phase::Gather, src - 1, src, 0, [&] {
          if (drop_last && src == n - 1) {
            dropped.resize(count);
            t.sendrecv(src, nullptr, 0, src, dropped.data(), bytes, tag);
          } else {
            t.sendrecv_reduce(src, nullptr, 0, src, data, count, tag);
          }
        });
      // Broadcast the sum, one rank after another. On the simulated network (link_model.h) these
      // messages leave through rank 0's one link out one after another, as the gather's arrive
      // through its link in: 2 (N-1) message times in all, however the sends are posted.
      for (int dst = 1; dst < n; ++dst)
        step(Phase::Broadcast, dst - 1, 0, dst, [&] { t.sendrecv(dst, data, bytes, dst, nullptr, 0, tag); });
    } else {
      step(Phase::Gather, r - 1, r, 0, [&] { t.sendrecv(0, data, bytes, 0, nullptr, 0, tag); });
      step(Phase::Broadcast, r - 1, 0, r, [&] { t.sendrecv(0, nullptr, 0, 0, data, bytes, tag); });
    }
  }

  whole.t_end = now_seconds();
  comm.record(whole);
}

}  // namespace lab
