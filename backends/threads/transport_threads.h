// Emulated ranks: a Transport over threads of one process (N ranks = N threads).
//
// Supported: everything in lab/comm/transport.h.
//   - Matching: messages from src to dst are matched in posting order by tag; a recv takes the
//     first message on the (src -> dst) channel whose tag is equal (later tags may overtake).
//   - send() is buffered: it copies into the (rank -> dst) mailbox and returns at once.
//     recv() copies out of the mailbox, or straight out of a peer's posted sendrecv buffer.
//   - sendrecv() and sendrecv_reduce() are zero-copy: the sender posts a pointer to its own
//     buffer in the (rank -> dst) channel's slot (one cache line, published by one store), the
//     receiver copies (or adds, fused) directly from the peer's memory and then marks the message
//     consumed. Matching is in posting order over buffered and zero-copy messages alike. The call returns only when its own send
//     has been consumed AND its receive is done, so both buffers may be reused at once.
//   - Waiting is spin, yield, park: a spin of up to 50 us with a pause instruction (only when
//     every rank can have a core of its own, and not while the peer runs on our CPU), a few std::this_thread::yield() rounds, then sleeping on the
//     rank's doorbell (a futex on Linux) that a peer rings when it posts to this rank, consumes
//     this rank's message or aborts. Ranks park only after the spin and the yields (parking at
//     every step measured 6-15x slower than Open MPI at 4 KB), and parked ranks leave the cores
//     to the ranks that have work, which matters when there are more ranks than cores.
//   - Every wait checks the world's abort flag (CommError "rank R: <call> from/to rank P aborted:
//     rank A failed: <reason>") and the timeout (CommError "rank R: timed out after T s waiting
//     for rank P (<call> from/to rank P, tag G); rank P waits for rank Q; rank Q is not waiting in
//     any transport call (...)"): the wait chain follows whom each blocked rank waits for, so the
//     message names the rank that is really missing. Time while the hold flag is set does not
//     count. A timeout fails the world: the rank that times out aborts with its message.
//   - A message size mismatch between a send and its recv is a bug in the caller: the receiver
//     aborts the world and throws CommError naming both sizes.
//   - abort_reason() is "rank A failed: <reason>" for the first abort world-wide (A = the rank
//     that called abort()), or the reason unchanged when it already starts with "rank A".
// Not supported: sending to or receiving from an out-of-range rank (CommError); overlapping
// send and receive buffers within one sendrecv; using one rank's transport from two threads at
// once (each rank's transport belongs to that rank's thread; different ranks run concurrently).
#pragma once

#include <memory>

#include "transport.h"

namespace lab {

struct ThreadsWorldState;

// The shared state of N emulated ranks. Create one per run, then one transport per rank thread.
class ThreadsWorld : public World {
 public:
  explicit ThreadsWorld(int world_size);
  ~ThreadsWorld() override;
  int world_size() const override;
  std::vector<int> local_ranks() const override;  // all of them
  // The transport of `rank`, owned by the world; used only by that rank's thread.
  Transport& transport(int rank) override;

 private:
  std::unique_ptr<ThreadsWorldState> m_state;
};

}  // namespace lab
