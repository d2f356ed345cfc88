// Tree allreduce (recursive halving-doubling) over any Transport: see tree_allreduce.h.
//
// Supported: every world size (1 .. N; non-powers of two by folding the extra ranks in first and
// out at the end), every count (0 included: empty ranges still take their steps as 0-byte
// transfers). The fold's one-directional transfers are sendrecv calls with an empty other half:
// the transport's zero-copy, fused path (a plain send() may copy, a plain recv() cannot add).
#include "tree_allreduce.h"

#include <cstring>
#include <vector>

#include "ring_allreduce.h"  // RingChunks: the same split, into p blocks

namespace lab {

void tree_allreduce(Communicator& comm, float* data, size_t count, CollectiveInfo info, size_t doubling_max_bytes) {
  Transport& t = comm.transport();
  const int n = comm.world_size();
  const int r = comm.rank();
  const uint64_t seq = comm.next_seq();
  const uint64_t tag = seq;  // every message of this call: ranks that disagree time out

  int p = 1, levels = 0;  // p = 2^levels, the largest power of two <= n
  while (p * 2 <= n) {
    p *= 2;
    ++levels;
  }
  const RingChunks blocks{count, p};
  // Elements of the range of `len` blocks starting at block `first`.
  auto begin = [&](int first) { return blocks.begin(first); };
  auto size = [&](int first, int len) { return blocks.begin(first + len) - blocks.begin(first); };

  Event whole = comm.collective_event("allreduce", seq, info, count * sizeof(float));

  // the transfer of the next step; recorded by its sender

  Event e = comm.chunk_event("allreduce", seq, info);

  // One step: gate, transfer, and (when this rank sends) the bookkeeping of its Chunk event.
  auto step = [&](Phase phase, int s, int src, int dst, int chunk, size_t elems, auto&& transfer) {
    e.phase = phase;
    e.ring_step = s;
    e.src = src;
    e.dst = dst;
    e.chunk = chunk;
    e.bytes = elems * sizeof(float);
    e.t_start = e.t_end = 0;
    comm.gate(e);
    e.t_start = now_seconds();
    transfer();
    e.t_end = now_seconds();
    if (src == r) {
      comm.add_bytes_sent(e.bytes);
      comm.record(e);
    }
  };

  if (n > 1) {
    if (r >= p) {
      // An extra rank: fold in (its buffer is added into rank r - p's), wait, fold out.
      const int partner = r - p;
      step(Phase::Gather, 0, r, partner, 0, count,
           [&] { t.sendrecv(partner, data, count * sizeof(float), partner, nullptr, 0, tag); });
      step(Phase::Broadcast, 0, partner, r, 0, count,
           [&] { t.sendrecv(partner, nullptr, 0, partner, data, count * sizeof(float), tag); });
    } else {
      const int extra = r + p;  // this rank's extra rank, when extra < n
      bool levels_done = false;  // the small-message path did the butterfly already
      if (extra < n)
        step(Phase::Gather, 0, extra, r, 0, count,
             [&] { t.sendrecv_reduce(extra, nullptr, 0, extra, data, count, tag); });

      if (count * sizeof(float) <= doubling_max_bytes) {
        // Small message: recursive doubling. Partners swap whole partial sums and both add; the
        // partner reads a snapshot (the transport reads the sender's buffer in place while this
        // rank adds into it).
        thread_local std::vector<float> snapshot;
        snapshot.resize(count);
        for (int k = 0; k < levels; ++k) {
          const int d = p >> (k + 1);
          const int partner = r ^ d;
          step(Phase::ReduceScatter, k, r, partner, 0, count, [&] {
            if (count > 0) std::memcpy(snapshot.data(), data, count * sizeof(float));
            t.sendrecv_reduce(partner, snapshot.data(), count, partner, data, count, tag);
          });
        }
        levels_done = true;
      }
      // Reduce-scatter by recursive halving: the range [first, first + 2d) splits in two halves.
      for (int k = 0; k < levels && !levels_done; ++k) {
        const int d = p >> (k + 1);
        const int partner = r ^ d;
        const int first = r & ~(2 * d - 1);
        const int keep = (r & d) ? first + d : first;  // the half holding block r
        const int give = (r & d) ? first : first + d;  // the partner's half
        step(Phase::ReduceScatter, k, r, partner, give, size(give, d), [&] {
          t.sendrecv_reduce(partner, data + begin(give), size(give, d), partner, data + begin(keep), size(keep, d),
                            tag);
        });
      }
      // Allgather by recursive doubling: exchange finished ranges; each doubles.
      for (int k = 0; k < levels && !levels_done; ++k) {
        const int d = 1 << k;
        const int partner = r ^ d;
        const int mine = r & ~(d - 1);
        const int theirs = partner & ~(d - 1);
        step(Phase::Allgather, k, r, partner, mine, size(mine, d), [&] {
          t.sendrecv(partner, data + begin(mine), size(mine, d) * sizeof(float), partner, data + begin(theirs),
                     size(theirs, d) * sizeof(float), tag);
        });
      }

      if (extra < n)
        step(Phase::Broadcast, 0, r, extra, 0, count,
             [&] { t.sendrecv(extra, data, count * sizeof(float), extra, nullptr, 0, tag); });
    }
  }

  whole.t_end = now_seconds();
  comm.record(whole);
}

}  // namespace lab
