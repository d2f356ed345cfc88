// Reduce-scatter and allgather of equal blocks, in place: the two halves of an allreduce as
// collectives of their own, the ones sharded data parallelism (ZeRO-2/3, FSDP) is built from.
//
// Layout (NCCL's in-place convention): `data` holds N blocks of `count` floats, block b at
// data + b count.
//   reduce-scatter: afterwards block r of rank r holds the sum over ranks of everyone's block r
//                   (the other blocks hold partial sums: scratch).
//   allgather:      block r of rank r is its input; afterwards every rank holds every block.
// Every rank ends with bitwise identical values in the blocks it is given (a reduced block is
// computed once, by its owner; an allgather only copies).
//
// Algorithms (AllreduceAlgorithm, as the allreduce):
//   ring   reduce-scatter, step s = 0 .. N-2: rank r sends block (r - s - 1) mod N to r + 1 and
//          adds block (r - s - 2) mod N from r - 1 into its own (fused sendrecv_reduce). Block b
//          starts at rank b + 1 and ends, summed, at rank b: its elements are added in the order
//          x[b+1] + x[b+2] + ... + x[b] (NCCL's orientation). dtlab's ring allreduce (gloo's)
//          leaves chunk c with rank c - 1 after adding x[c] + ... + x[c-1]: so a block equals the
//          allreduce's bits where both add in the same order, always for N = 2 (a + b = b + a),
//          and in general only by rounding for N >= 3.
//          allgather, step s = 0 .. N-2: rank r sends block (r - s) mod N to r + 1 and copies
//          block (r - s - 1) mod N from r - 1.
//          Both are pipelined as the ring allreduce is: every block cut into the same G segments
//          (G = ceil(count x 4 / segment_bytes)), segment j through all steps before j + 1.
//          Each rank sends (N-1)/N of the buffer in each.
//   naive  through rank 0 (the parameter server): reduce-scatter = the naive allreduce's gather
//          (rank 0 adds every rank's whole buffer in rank order: x0 + x1 + ... + x[N-1]), then
//          rank 0 sends block b to rank b (Phase::Scatter). Allgather: every rank sends its block
//          to rank 0 (Phase::Gather), which sends the whole buffer to each (Phase::Broadcast).
//          Rank 0's link carries (N-1) buffers (reduce-scatter) or (N-1)(1 + 1/N) (allgather).
//   tree   recursive halving (reduce-scatter) and doubling (allgather), N a power of two:
//          step k = 0 .. L-1 with partner r XOR d. Reduce-scatter, d = N >> (k + 1): rank r keeps
//          the half of its 2d-block range that holds block r, sends the other half and adds the
//          partner's copy of the kept half. Allgather, d = 1 << k: rank r sends its d finished
//          blocks (from r & ~(d - 1)) and copies the partner's. (N-1)/N of the buffer each, in
//          log2 N steps. Another world size is refused (ConfigError): its extra ranks would own
//          no block of the power-of-two core.
//   Native (the transport's own) is refused for these two (ConfigError).
//
// Events: one Chunk event per message sent (by the sender: chunk = first block carried, or the
// block number; ring_step = step), one Collective event per call (op "reduce_scatter" or
// "allgather", bytes = the whole buffer, N count floats). comm.gate() before every step.
// World size 1: nothing is sent; the call still takes an op_seq and records its Collective.
#pragma once

#include <cstddef>

#include "communicator.h"

namespace lab {

// Pipelining unit of the ring reduce-scatter and allgather (as the ring allreduce's).
constexpr size_t kShardSegmentBytes = size_t{512} << 10;

void ring_reduce_scatter(Communicator& comm, float* data, size_t count, CollectiveInfo info,
                         size_t segment_bytes = kShardSegmentBytes, DeviceMemory* mem = nullptr);
void ring_allgather(Communicator& comm, float* data, size_t count, CollectiveInfo info,
                    size_t segment_bytes = kShardSegmentBytes, DeviceMemory* mem = nullptr);
void naive_reduce_scatter(Communicator& comm, float* data, size_t count, CollectiveInfo info);
void naive_allgather(Communicator& comm, float* data, size_t count, CollectiveInfo info);
// N a power of two (tree_collectives_fit); Communicator refuses the rest before calling.
void tree_reduce_scatter(Communicator& comm, float* data, size_t count, CollectiveInfo info);
void tree_allgather(Communicator& comm, float* data, size_t count, CollectiveInfo info);

// Whether recursive halving/doubling can give every rank of a world of n a block of its own.
inline bool tree_collectives_fit(int n) { return n > 0 && (n & (n - 1)) == 0; }

}  // namespace lab
