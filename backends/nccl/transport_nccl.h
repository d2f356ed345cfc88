// Ranks on real GPUs: a Transport over NCCL, one GPU per rank (NCCL 2.28 refuses two ranks of one
// communicator on one GPU), either
//   - N ranks as threads of this process, rank r on GPU devices[r] (`dtlab run --comm nccl`), or
//   - one rank per process, started by a launcher (`mpirun -np N dtlab run --comm nccl`, on one
//     machine or several): the launcher's runtime (process_group.h, MPI here) broadcasts rank 0's
//     ncclUniqueId and carries aborts between the processes; NCCL carries every message.
//
// Supported: send, recv, sendrecv (and the base class's sendrecv_reduce over it), the transport's
// own allreduce (native_allreduce_sum: ncclAllReduce, float32 sum, the `--allreduce nccl` peer),
// abort, timeouts and the hold flag of lab/comm/transport.h.
//   - Buffers are host memory (the lab's tensors are host tensors). Every call stages through
//     device buffers of its rank, grown on demand and kept: upload on the rank's CUDA stream,
//     the NCCL operation, download. Sizes are bytes (ncclUint8), floats for the allreduce.
//   - Matching: NCCL has no tags. Messages between a pair of ranks are matched in posting order;
//     the lab's collectives post matching calls in the same order on both sides, which is all
//     this needs. Tags appear in error messages only. 0-byte messages are not posted at all (on
//     either side, so the order of the others is kept).
//   - send() returns once the peer has received (NCCL's sends wait for the matching receive):
//     fine for the lab's algorithms, where every send is matched by a receive that its peer
//     posts on its own thread; the ring's steps use sendrecv(), one NCCL group of a send and a
//     receive, so that every rank sending at once does not deadlock.
//   - Communicators are non-blocking (ncclConfig_t.blocking = 0) and created in one group from
//     the constructing thread. No call waits inside CUDA or NCCL: each waits in a polling loop
//     (cudaStreamQuery; ncclCommGetAsyncError, whose ncclInProgress is normal while NCCL
//     enqueues; the world's abort flag; the timeout, not counting time while the hold flag is
//     set): spin for 100 us, yield until 2 ms, then sleep 50 us per round.
//   - Failures: a timeout throws CommError "rank R: timed out after T s waiting for rank P (recv
//     from rank P: ncclRecv of B bytes, tag G)" and aborts the world with that message. Once any
//     rank has aborted, every call on every rank calls ncclCommAbort on its own communicator and
//     throws CommError "rank R: <call> to/from rank P aborted: rank A failed: <reason>". A failed
//     CUDA or NCCL call throws DeviceError naming the call, with NCCL's error string and
//     ncclGetLastError's text, and aborts the world.
//   - abort(reason) may come from any thread (the run aborts every rank when it is destroyed):
//     it sets the world's flag ("rank A failed: <reason>", the first abort wins) and aborts this
//     rank's communicator; the other ranks see the flag in their next poll.
//   - Each call makes its rank's GPU current (cudaSetDevice) first: a rank's transport is used
//     from the rank's thread, which is not the thread that created it.
// Not supported: recv_any (ConfigError: NCCL cannot receive from whichever rank sends first);
// two ranks on one GPU (NCCL refuses them: DeviceError from the constructor; the caller checks the
// map first); a send to or receive from oneself outside sendrecv (the send waits for a receive
// the same thread has not posted yet: it times out); detecting a size mismatch between a send
// and its receive (both sides wait until the timeout); device memory buffers; several ranks per
// process with ranks as processes; using one rank's transport from two threads at once (abort(),
// aborted() and abort_reason() excepted).
// Aborts with ranks as processes: abort() also tells every other process through the launcher's
// runtime (ProcessGroup::abort_world), and aborted() polls it, so a rank waiting in NCCL for a
// process that failed stops at its next poll, with that process's reason.
#pragma once

#include <memory>
#include <vector>

#include "process_group.h"
#include "transport.h"

namespace lab {

struct NcclWorldState;

// N ranks as threads of this process, rank r on GPU devices[r] (distinct: the caller has checked),
// over NCCL communicators created non-blocking in one group (ncclGroupStart; per rank cudaSetDevice
// + ncclCommInitRankConfig with one ncclUniqueId; ncclGroupEnd), each rank with its own CUDA stream
// and device staging buffers. Every transport starts with timeout() = timeout_s.
class NcclWorld : public World {
 public:
  // Throws DeviceError (NCCL's error string and a hint) when NCCL cannot start, e.g. two ranks
  // on one GPU if the caller did not check, or init exceeding timeout_s; ConfigError for no ranks.
  NcclWorld(const std::vector<int>& devices, double timeout_s);
  // This process's rank of a world of group.size() processes (ranks as processes), on GPU
  // `device`: rank 0 makes NCCL's unique id, the group broadcasts it, each process initializes its
  // communicator. A process that fails to start tells the others (group.abort_world). Throws
  // DeviceError as above; CommError when another process failed or the broadcast timed out.
  NcclWorld(ProcessGroup& group, int device, double timeout_s);
  // Finalizes and destroys every communicator; aborts them all instead after a failure (an
  // abort, an NCCL error, or a finalize that does not complete within timeout_s).
  ~NcclWorld() override;
  int world_size() const override;
  std::vector<int> local_ranks() const override;  // all of them, or this process's rank
  // The transport of `rank` (name() "nccl"), owned by the world; used by that rank's thread. A rank
  // of another process: ConfigError.
  Transport& transport(int rank) override;

 private:
  std::unique_ptr<NcclWorldState> m_state;
};

}  // namespace lab
