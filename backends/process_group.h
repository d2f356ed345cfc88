// ProcessGroup: what a transport without a launcher of its own needs from the one that started
// the job's processes. NCCL starts no processes and finds no peers: torchrun or mpirun starts one
// process per rank, and the launcher's runtime hands NCCL its unique id and tells every process
// when another one failed. Here the launcher is MPI (backends/mpi/mpi_runtime.h implements this);
// NCCL then carries every collective, MPI only the bootstrap and the aborts (what torchrun + NCCL
// does, with MPI in torchrun's place).
//
// Every method may be called from the rank's thread; aborted(), abort_reason() and abort_world()
// from any thread.
#pragma once

#include <cstddef>
#include <string>

namespace lab {

class ProcessGroup {
 public:
  virtual ~ProcessGroup() = default;
  virtual int rank() const = 0;  // this process's rank in the job
  virtual int size() const = 0;  // processes in the job
  // Every process of the job calls this with the same bytes and root; afterwards each holds root's
  // bytes at `data`. Throws CommError naming the call when not every process arrives within
  // timeout_s, or when the job aborts meanwhile.
  virtual void broadcast(void* data, size_t bytes, int root, double timeout_s) = 0;
  // Whether any process of the job has aborted (this one included), and its reason
  // ("rank A failed: <reason>": the first one this process learnt of).
  virtual bool aborted() = 0;
  virtual std::string abort_reason() const = 0;
  // Marks the job aborted and tells every other process. False when it already was.
  virtual bool abort_world(const std::string& reason) = 0;
};

}  // namespace lab
