// Ring allreduce (sum) over a Communicator's Transport: reduce-scatter, then allgather.
//
// Words used here and in the .cpp:
//   N      world size; ranks talk only to their ring neighbours: send to r + 1, receive from r - 1.
//   chunk  1/N of the buffer; chunk c is owned (fully reduced) by rank c - 1 after reduce-scatter.
//          Chunk sizes: the first count % N chunks are one element longer (RingChunks).
//   step   one ring step: every rank sends one chunk and receives one chunk (N - 1 per phase).
//
// Reduce-scatter, step s = 0 .. N-2: rank r sends chunk (r - s) mod N to r + 1 and adds the chunk
// (r - s - 1) mod N received from r - 1 into its own buffer (Transport::sendrecv_reduce, fused).
// Afterwards rank r owns chunk (r + 1) mod N, summed over all ranks.
// Allgather, step s = 0 .. N-2: rank r sends chunk (r + 1 - s) mod N (finished) to r + 1 and
// copies chunk (r - s) mod N from r - 1 over its own.
// Each chunk's final value is computed once, by its owner, and only copied afterwards: every rank
// ends with bitwise identical results.
//
// Empty chunks (count < N, or count == 0) still take part as 0-byte messages, recorded as Chunk
// events with bytes = 0: every rank does the same 2(N - 1) steps and records 2(N - 1) chunk events
// per call, whatever the count. Rank r sends every chunk but (r + 1) in reduce-scatter and every
// chunk but (r + 2) in allgather: 2(N - 1)/N of the buffer when N divides count.
//
// World size 1: nothing is sent; the call still takes an op_seq and records its Collective event.
#pragma once

#include <cstddef>

#include "communicator.h"

namespace lab {

// Split of a buffer of `count` floats into `n` chunks: the first count % n chunks get one
// element more than count / n.
struct RingChunks {
  size_t count = 0;
  int n = 1;
  size_t size(int c) const { return count / n + (static_cast<size_t>(c) < count % n ? 1 : 0); }
  size_t begin(int c) const {
    const size_t extra = count % n;
    const size_t uc = static_cast<size_t>(c);
    return uc * (count / n) + (uc < extra ? uc : extra);
  }
};

// In-place sum of data (count floats) over all ranks of comm. Records one Chunk event per send
// (by the sender), calls comm.gate() before every step, and one Collective event per call. Throws
// what the transport throws (CommError); Communicator::allreduce_sum adds the operation context.
// The plain ring: the reference that the pipelined ring below is tested against.
void ring_allreduce(Communicator& comm, float* data, size_t count, CollectiveInfo info);

// Pipelining unit of the ring that Communicator::allreduce_sum runs (AllreduceAlgorithm::Ring).
constexpr size_t kRingSegmentBytes = size_t{512} << 10;

// The pipelined ring: the same chunks, steps, neighbours and summation order as ring_allreduce
// (so bitwise the same results), but every chunk is cut into the same number G of segments
// (G = ceil(largest chunk / segment_bytes); segment j of chunk c is its elements
// [size(c) j / G, size(c) (j + 1) / G)), and the ring runs segment by segment: segment j of every
// chunk goes through all 2(N - 1) steps before segment j + 1 starts. What a rank reads at step s
// was written by its neighbour at step s - 1, moments before, and is still in cache; the plain
// ring reads it back a whole chunk later. One Chunk event and one gate call per segment sent
// (chunk = c, ring_step = s); with G = 1 (chunks up to segment_bytes) exactly the plain ring.
// mem: data lives on that device and the transport is device-aware (device_memory.h): every chunk
// moves and adds there, the same steps and the same bits.
void ring_allreduce_pipelined(Communicator& comm, float* data, size_t count, CollectiveInfo info,
                              size_t segment_bytes = kRingSegmentBytes, DeviceMemory* mem = nullptr);

}  // namespace lab
