// Tree allreduce (sum): recursive halving-doubling (Rabenseifner's algorithm), the butterfly that
// MPI libraries use for medium and large messages. Not a binary tree: every rank of the
// power-of-two core works at every step, and the data a rank sends halves, then doubles.
//
// Words used here and in the .cpp:
//   N      world size; p = the largest power of two <= N; L = log2(p); rem = N - p.
//   block  1/p of the buffer (RingChunks{count, p}: the first count % p blocks one element
//          longer); block b is owned (fully reduced) by rank b after the reduce-scatter.
//   range  a run of consecutive blocks; a rank's range halves at each reduce-scatter step and
//          doubles at each allgather step. Every Chunk event's `chunk` is the first block of the
//          range it carries (0 for a whole buffer).
//   step   numbered within its phase as the ring numbers its steps (Event::ring_step), identical
//          on every rank:
//     fold-in,        step 0, only when rem > 0: each extra rank r >= p sends its whole buffer
//                     to rank r - p, which adds it (Phase::Gather). The extra ranks then wait.
//     reduce-scatter, step k = 0 .. L-1, d = p >> (k + 1): rank r and partner r XOR d
//                     split their current range (2d blocks) in halves; each keeps the half that
//                     holds its own block, sends the other half and adds the partner's copy of
//                     the kept half (Phase::ReduceScatter). After step k, rank r's range is the d
//                     blocks from r & ~(d - 1); after the last step, block r alone, fully summed.
//     allgather,      step k = 0 .. L-1, d = 1 << k: rank r sends its range (d blocks
//                     from r & ~(d - 1), finished) to partner r XOR d and copies the partner's
//                     range over its own buffer (Phase::Allgather); the range doubles.
//     fold-out,       step 0, only when rem > 0: rank r - p sends the result to the extra
//                     rank r (Phase::Broadcast).
//
// Small messages (count x 4 <= kTreeDoublingBytes): recursive doubling instead, as MPI libraries
// do for short messages. The same fold, then step k = 0 .. L-1 with the same d = p >> (k + 1):
// partners swap their whole partial sums and both add (Phase::ReduceScatter, chunk 0, S bytes).
// L steps instead of 2L, each moving the whole buffer: fewer waits on peers, which is what costs
// when messages are small or ranks outnumber cores. It is the same butterfly, so every element
// is summed in the same order as on the halving-doubling path: the same bits.
//
// Each block's final value is computed once, by its owner, and only copied afterwards: every rank
// ends with bitwise identical results. Summation order of an element of block b: the fold adds
// x[r + p] to x[r]; then step k adds the partial sums of two groups of 2^k core ranks.
//
// Bytes sent, S = count floats x 4, |b| = bytes of block b, R_k(r) = the 2^k blocks from
// r & ~(2^k - 1):
//   core rank r < p:     (S - |r|)  in reduce-scatter (every block but its own, once)
//                      + sum_{k=0..L-1} |R_k(r)|  in allgather
//                      + S in the fold-out when r < rem.
//   extra rank r >= p:  S (fold-in) and nothing else.
// When p divides count, a core rank sends 2(p-1)/p S (as a ring of p ranks does), in 2L messages
// instead of 2(p-1). On the recursive-doubling path a core rank sends L S (+ S in the fold-out).
// In both, every rank ends with bitwise identical results: on the doubling path both partners
// compute the same sum of the same two operands (float addition commutes).
//
// Every rank calls comm.gate() before each step it takes part in, with the event of the transfer
// it sends (or, for a rank that only receives in that step, the transfer it receives); the sender
// records it as a Chunk event. World size 1: nothing is sent; the call still takes an op_seq and
// records its Collective event.
#pragma once

#include <cstddef>

#include "communicator.h"

namespace lab {

// Messages up to this size take the recursive-doubling path (see above).
constexpr size_t kTreeDoublingBytes = size_t{64} << 10;

// In-place sum of data (count floats) over all ranks of comm. Throws what the transport throws
// (CommError); Communicator::allreduce_sum adds the operation context. Buffers of at most
// doubling_max_bytes take the recursive-doubling path.
void tree_allreduce(Communicator& comm, float* data, size_t count, CollectiveInfo info,
                    size_t doubling_max_bytes = kTreeDoublingBytes);

}  // namespace lab
