// Ring allreduce over any Transport, plain and pipelined: see ring_allreduce.h.
//
// Supported: every world size and count (empty chunks and segments take part as 0-byte
// messages). Both versions take the same steps in the same phases; the pipelined one repeats
// them once per segment.
#include "ring_allreduce.h"

#include <algorithm>

namespace lab {

namespace {

int mod(int a, int n) { return ((a % n) + n) % n; }

}  // namespace

void ring_allreduce(Communicator& comm, float* data, size_t count, CollectiveInfo info) {
  Transport& t = comm.transport();
  const int n = comm.world_size();
  const int r = comm.rank();
  const uint64_t seq = comm.next_seq();
  const RingChunks chunks{count, n};
  const int next = mod(r + 1, n);
  const int prev = mod(r - 1, n);

  Event whole = comm.collective_event("allreduce", seq, info, count * sizeof(float));

  // Every message of this call carries tag = op_seq: ranks that disagree about which collective
  // comes next wait for a tag that never comes and time out, instead of mixing buffers.
  const uint64_t tag = seq;

  // the chunk this rank sends at the next step, recorded by the sender

  Event e = comm.chunk_event("allreduce", seq, info);
  e.dst = next;

  if (n > 1) {
    // Reduce-scatter: partial sums travel round the ring; after N - 1 steps rank r holds chunk
    // r + 1 summed over all ranks.
    e.phase = Phase::ReduceScatter;
    for (int s = 0; s < n - 1; ++s) {
      const int send_chunk = mod(r - s, n);
      const int recv_chunk = mod(r - s - 1, n);
      e.chunk = send_chunk;
      e.ring_step = s;
      e.bytes = chunks.size(send_chunk) * sizeof(float);
      e.t_start = e.t_end = 0;
      comm.gate(e);
      e.t_start = now_seconds();
      t.sendrecv_reduce(next, data + chunks.begin(send_chunk), chunks.size(send_chunk), prev,
                        data + chunks.begin(recv_chunk), chunks.size(recv_chunk), tag);
      e.t_end = now_seconds();
      comm.add_bytes_sent(e.bytes);
      comm.record(e);
    }
    // Allgather: each finished chunk is forwarded round the ring and copied over the partial sums.
    e.phase = Phase::Allgather;
    for (int s = 0; s < n - 1; ++s) {
      const int send_chunk = mod(r + 1 - s, n);
      const int recv_chunk = mod(r - s, n);
      e.chunk = send_chunk;
      e.ring_step = s;
      e.bytes = chunks.size(send_chunk) * sizeof(float);
      e.t_start = e.t_end = 0;
      comm.gate(e);
      e.t_start = now_seconds();
      t.sendrecv(next, data + chunks.begin(send_chunk), e.bytes, prev, data + chunks.begin(recv_chunk),
                 chunks.size(recv_chunk) * sizeof(float), tag);
      e.t_end = now_seconds();
      comm.add_bytes_sent(e.bytes);
      comm.record(e);
    }
  }

  whole.t_end = now_seconds();
  comm.record(whole);
}

void ring_allreduce_pipelined(Communicator& comm, float* data, size_t count, CollectiveInfo info,
                              size_t segment_bytes, DeviceMemory* mem) {
  Transport& t = comm.transport();
  const int n = comm.world_size();
  const int r = comm.rank();
  const uint64_t seq = comm.next_seq();
  const RingChunks chunks{count, n};
  const int next = mod(r + 1, n);
  const int prev = mod(r - 1, n);
  const uint64_t tag = seq;

  // G segments per chunk, the same G for every chunk so that neighbours agree on each message.
  const size_t segment_elems = std::max<size_t>(1, segment_bytes / sizeof(float));
  const size_t segments = std::max<size_t>(1, (chunks.size(0) + segment_elems - 1) / segment_elems);
  auto seg_begin = [&](int c, size_t j) { return chunks.begin(c) + chunks.size(c) * j / segments; };
  auto seg_size = [&](int c, size_t j) { return seg_begin(c, j + 1) - seg_begin(c, j); };

  Event whole = comm.collective_event("allreduce", seq, info, count * sizeof(float));

  // the segment this rank sends at the next step, recorded by the sender

  Event e = comm.chunk_event("allreduce", seq, info);
  e.dst = next;

  for (size_t j = 0; n > 1 && j < segments; ++j) {
    // Reduce-scatter of segment j: as the plain ring, on the j-th segment of each chunk.
    e.phase = Phase::ReduceScatter;
    for (int s = 0; s < n - 1; ++s) {
      const int send_chunk = mod(r - s, n);
      const int recv_chunk = mod(r - s - 1, n);
      e.chunk = send_chunk;
      e.ring_step = s;
      e.bytes = seg_size(send_chunk, j) * sizeof(float);
      e.t_start = e.t_end = 0;
      comm.gate(e);
      e.t_start = now_seconds();
      if (mem)
        t.sendrecv_reduce_on(*mem, next, data + seg_begin(send_chunk, j), seg_size(send_chunk, j), prev,
                             data + seg_begin(recv_chunk, j), seg_size(recv_chunk, j), tag);
      else
        t.sendrecv_reduce(next, data + seg_begin(send_chunk, j), seg_size(send_chunk, j), prev,
                          data + seg_begin(recv_chunk, j), seg_size(recv_chunk, j), tag);
      e.t_end = now_seconds();
      comm.add_bytes_sent(e.bytes);
      comm.record(e);
    }
    // Allgather of segment j: the finished segments travel on while still in cache.
    e.phase = Phase::Allgather;
    for (int s = 0; s < n - 1; ++s) {
      const int send_chunk = mod(r + 1 - s, n);
      const int recv_chunk = mod(r - s, n);
      e.chunk = send_chunk;
      e.ring_step = s;
      e.bytes = seg_size(send_chunk, j) * sizeof(float);
      e.t_start = e.t_end = 0;
      comm.gate(e);
      e.t_start = now_seconds();
      if (mem)
        t.sendrecv_on(*mem, next, data + seg_begin(send_chunk, j), e.bytes, prev, data + seg_begin(recv_chunk, j),
                      seg_size(recv_chunk, j) * sizeof(float), tag);
      else
        t.sendrecv(next, data + seg_begin(send_chunk, j), e.bytes, prev, data + seg_begin(recv_chunk, j),
                   seg_size(recv_chunk, j) * sizeof(float), tag);
      e.t_end = now_seconds();
      comm.add_bytes_sent(e.bytes);
      comm.record(e);
    }
  }

  whole.t_end = now_seconds();
  comm.record(whole);
}

}  // namespace lab
