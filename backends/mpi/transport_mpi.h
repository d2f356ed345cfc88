// Ranks as processes: a Transport over MPI point-to-point (Open MPI), one rank per process.
//
// Supported: everything in lab/comm/transport.h, and native_allreduce_sum (MPI_Iallreduce).
//   - Matching is MPI's: messages from src to dst with equal tags arrive in posting order. A lab
//     tag (uint64) becomes an MPI tag by keeping its low bits and its top two bits (lab tags are
//     collective sequence numbers, plus run-internal ranges at the top); two lab tags that map
//     alike are never in flight between one pair at once (a collective completes on a rank
//     before its next one starts, and 2^29 collectives lie between them with Open MPI's tags).
//   - Every call is nonblocking underneath (MPI_Isend / MPI_Irecv / MPI_Iallreduce) and waits in
//     a polling loop: MPI_Test, the control channel (aborts and wait-chain queries, see
//     mpi_runtime.h), then the timeout (time while the hold flag is set does not count). Backoff
//     as in transport_threads: spin, then yield, then short sleeps (ranks often outnumber cores).
//   - send() returns when MPI has completed the send (copied out, or received). Sends go out of
//     a staging copy owned by the transport: Open MPI cannot cancel a send, so a call that gives
//     up (abort, timeout) leaves that copy to MPI rather than the caller's buffer. Receives go
//     straight into the caller's buffer; a call that gives up cancels them.
//   - sendrecv() posts the receive, then the send, and waits for both. sendrecv_reduce() receives
//     into scratch space and adds (acc[i] += in[i] in index order, as transport_threads does, so
//     the lab's algorithms give bitwise the same sums over either transport).
//   - abort(reason) sends the reason to every other rank; their calls then throw CommError
//     "rank R: <call> from/to rank P aborted: rank A failed: <reason>". aborted() polls the
//     control channel, so a rank that only polls it (--fail-at hang) learns of an abort too.
//   - A timeout asks the awaited peer whom it waits for, and so on along the chain (the wait
//     chain of transport_threads, over the control channel), then aborts the world with that
//     message: "rank 0: timed out after 3 s waiting for rank 3 (...); rank 3 waits for rank 2;
//     rank 2 waits for rank 1; rank 1 is not waiting in any transport call (...)".
//   - A message longer or shorter than its receive aborts the world (a bug in the caller).
// Not supported: more than one rank per process; messages of 2 GiB or more (MPI's int counts);
// using the transport from two threads at once (aborted() and abort() excepted).
#pragma once

#include <memory>
#include <vector>

#include "config.h"
#include "mpi_runtime.h"
#include "transport.h"

namespace lab {

// The ranks of an MPI job as seen from one of its processes: this process's rank only.
class MpiWorld : public World {
 public:
  // cfg.world_size must equal MPI's world size (ConfigError otherwise).
  MpiWorld(MpiRuntime& runtime, const RunConfig& cfg);
  ~MpiWorld() override;
  int world_size() const override;
  std::vector<int> local_ranks() const override;  // {this process's rank}
  // This process's rank's transport; any other rank lives in another process (ConfigError).
  Transport& transport(int rank) override;

 private:
  MpiRuntime& m_rt;
  std::unique_ptr<Transport> m_transport;
};

}  // namespace lab
