// Naive allreduce (sum): the parameter-server picture. Every rank sends its whole buffer to rank
// 0, which adds the buffers in rank order and sends the sum back to every rank.
//
// Words used here and in the .cpp:
//   N      world size; rank 0 is the "server", ranks 1 .. N-1 talk only to it.
//   S      the buffer, count floats; it travels whole (one block: chunk = 0 in every event).
//   step   one transfer between rank 0 and one other rank, numbered within its phase as the
//          ring numbers its steps (Event::ring_step), identical on every rank:
//            gather,    step s = 0 .. N-2: rank s + 1 sends S to rank 0, which adds it
//                                           (Phase::Gather)
//            broadcast, step s = 0 .. N-2: rank 0 sends the sum to rank s + 1 (Phase::Broadcast)
//
// Rank 0 computes ((x0 + x1) + x2) + ... + x(N-1) once, element by element; every other rank only
// copies it: all ranks end with bitwise identical results (the bits of a rank-order sum).
// Traffic: rank 0 receives (N-1) S and sends (N-1) S; every other rank sends S and receives S.
// Rank 0's link carries 2(N-1) S where a ring carries 2(N-1)/N S per rank: that, and rank 0
// doing every addition alone, is why a parameter server does not scale. On the simulated network
// (link_model.h: one full-duplex link per rank to a switch) the N-1 gradients come in through rank
// 0's link in one after another and the N-1 copies of the sum leave through its link out one
// after another: 2(N-1) S / bandwidth, N times the ring's 2(N-1)/N S / bandwidth.
//
// Every rank calls comm.gate() before each step it takes part in (rank 0: all 2(N-1) of them;
// rank r > 0: its gather step r-1 and its broadcast step r-1) with the event of that step's
// transfer; the sender records it as a Chunk event. World size 1: nothing is sent; the call still
// takes an op_seq and records its Collective event.
#pragma once

#include <cstddef>

#include "communicator.h"

namespace lab {

// In-place sum of data (count floats) over all ranks of comm. Throws what the transport throws
// (CommError); Communicator::allreduce_sum adds the operation context.
void naive_allreduce(Communicator& comm, float* data, size_t count, CollectiveInfo info);

}  // namespace lab
