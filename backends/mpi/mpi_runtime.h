// MpiRuntime: the MPI side of one dtlab process (= one rank): MPI_Init_thread .. MPI_Finalize,
// the communicators TransportMpi uses, and the control channel that carries aborts.
//
// Supported: Open MPI 4.x, and any MPI-3 library giving MPI_THREAD_SERIALIZED or better.
//   - Communicators (duplicates of MPI_COMM_WORLD; errors are returned, never fatal):
//       data     the lab's point-to-point messages (TransportMpi)
//       control  aborts, wait-chain queries, the shutdown barrier
//       coll     the native allreduce (MPI_Iallreduce)
//   - Control protocol. Every wait loop (and aborted()) polls the control communicator:
//       kTagAbort   text "rank A failed: <reason>", sent by an aborting rank to every other rank.
//                   The first abort a process learns of (its own or a peer's) is its reason.
//       kTagQuery   int32 {id}: "whom are you waiting for?", sent by a rank that timed out.
//       kTagAnswer  int32 {id, waiting_for}: a rank, or kNotWaiting / kFinished / kInCollective.
//     A rank answers only while it is inside a transport call or polls aborted(); a rank busy
//     computing does not answer, and the asker says so.
//   - Rank and world size come from MPI and are checked against the launcher's environment:
//     Open MPI's OMPI_COMM_WORLD_RANK/SIZE and torchrun-style RANK/WORLD_SIZE.
//   - Shutdown: MPI_Ibarrier on the control communicator, polled with a deadline. When every
//     process arrived, MPI_Finalize (which in Open MPI blocks until all processes call it); when
//     not, main() calls kill_job (MPI_Abort) so that a stuck peer cannot hang the job.
//   - Threads: every MPI call is made under one mutex, so MPI_THREAD_SERIALIZED is enough (the
//     rank's thread and the main thread both call in, never at once).
//   - NCCL's launcher (--comm nccl under mpirun): the same runtime is the job's ProcessGroup
//     (process_group.h). It broadcasts NCCL's unique id, carries aborts between the processes and
//     says which machine each rank runs on (ComputeOptions::rank_nodes, from the processor names),
//     so that the k-th rank of a machine takes its k-th GPU; NCCL carries every collective.
// Not supported: more than one rank per process; MPI initialized by anyone else (the executable's
//   main owns it through start_comm_runtime); recovering after a failure (a failed world ends).
#pragma once

#include <mpi.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "backends.h"
#include "process_group.h"

namespace lab {

class MpiRuntime final : public CommRuntime, public ProcessGroup {
 public:
  // Answers to "whom are you waiting for?" besides a rank number.
  static constexpr int kNotWaiting = -1;    // in no transport call (busy elsewhere, or hung)
  static constexpr int kFinished = -2;      // done with its run, shutting down
  static constexpr int kInCollective = -3;  // inside the native allreduce

  // MPI_Init_thread and the communicators; `timeout_s` bounds the communicator setup and is the
  // grace period of a failing shutdown; `comm` is the transport it starts for ("mpi", or "nccl"
  // as NCCL's launcher), for messages. Throws ConfigError / CommError.
  explicit MpiRuntime(double timeout_s, std::string comm = "mpi");
  ~MpiRuntime() override;
  MpiRuntime(const MpiRuntime&) = delete;
  MpiRuntime& operator=(const MpiRuntime&) = delete;
  // The started runtime of this process, or nullptr.
  static MpiRuntime* current();

  int rank() const override { return m_rank; }
  bool ranks_are_processes() const override { return true; }
  int size() const override { return m_size; }
  void resolve_world(RunConfig& cfg, bool world_size_given) override;
  std::string describe() const override { return m_describe; }
  ShutdownResult shutdown(int exit_code, const std::string& error) override;
  void kill_job(int exit_code) override;

  // ---- for TransportMpi ----
  std::mutex& mpi_mutex() { return m_mu; }  // held around every MPI call
  MPI_Comm data_comm() const { return m_data; }
  MPI_Comm coll_comm() const { return m_coll; }
  int tag_ub() const { return m_tag_ub; }
  // Receives aborts, answers queries, frees finished control sends. Takes the MPI mutex.
  void service_control();
  bool aborted() override;  // services the control channel first
  std::string abort_reason() const override;
  // Marks the world aborted with `reason` (named "rank R failed: ..." unless it already starts
  // with "rank R") and sends it to every other rank. False when already aborted (first wins).
  bool abort_world(const std::string& reason) override;
  // ---- for NCCL (ProcessGroup) ----
  // MPI_Ibcast on the collective communicator, polled with the control channel serviced.
  void broadcast(void* data, size_t bytes, int root, double timeout_s) override;
  // What this rank answers to queries while it waits.
  void set_waiting_for(int peer) { m_waiting_for.store(peer, std::memory_order_relaxed); }
  int waiting_for() const override {
    const int w = m_waiting_for.load(std::memory_order_relaxed);
    return w >= 0 ? w : -1;
  }
  // Asks `peer` whom it waits for; nullopt when it does not answer within `seconds` (or when the
  // world aborted meanwhile).
  std::optional<int> query_waiting_for(int peer, double seconds);
  // Keeps a request that a failed call gave up on, and the buffer it points into, alive until
  // MPI_Finalize (a send cannot be cancelled in Open MPI; its data must stay valid).
  void orphan(MPI_Request req, std::vector<char> buffer);
  // MPI may still write into memory this process no longer owns (a receive that could not be
  // cancelled): shutdown will not finalize cleanly, and main kills the job.
  void poison(const std::string& why);
  // Throws CommError "rank R: <what>: <MPI's error string>" when rc is not MPI_SUCCESS.
  void check(int rc, const char* what) const;

 private:
  struct PendingSend {
    MPI_Request req;
    std::vector<char> buf;
  };
  void service_locked();
  void send_control_locked(int dst, int tag, std::vector<char> payload);
  // Waits (polling, servicing the control channel) until req completes; false after `seconds`.
  bool wait_control(MPI_Request& req, double seconds);
  std::string named(const std::string& reason) const;
  // Waits for a collective request of every process (servicing the control channel); CommError
  // naming `what` after timeout_s or when the job aborts meanwhile.
  void wait_collective(MPI_Request& req, double timeout_s, const std::string& what);
  // ComputeOptions::rank_nodes for --comm nccl: every process's processor name, gathered.
  std::vector<int> gather_nodes();

  int m_rank = 0, m_size = 1, m_tag_ub = 32767;
  double m_timeout = 60;
  std::string m_comm;  // "--comm mpi" / "--comm nccl", for messages
  bool m_finalized = false;
  std::string m_describe;
  MPI_Comm m_data = MPI_COMM_NULL, m_ctrl = MPI_COMM_NULL, m_coll = MPI_COMM_NULL;

  std::mutex m_mu;  // every MPI call
  std::vector<PendingSend> m_ctrl_sends;
  std::vector<PendingSend> m_orphans;
  std::string m_poisoned;

  mutable std::mutex m_abort_mu;
  std::atomic<bool> m_aborted{false};
  std::string m_reason;

  std::atomic<int> m_waiting_for{kNotWaiting};
  int32_t m_query_id = 0;
  int m_query_peer = -1;
  std::optional<int> m_answer;
};

}  // namespace lab
