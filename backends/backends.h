// The backend registry: which transports this build has. Front ends (CLI, GUI, tests) pass
// make_world to lab::Run; lab/ itself never names a backend.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "config.h"
#include "transport.h"

namespace lab {

// The World for cfg.comm ("threads", "mpi", "nccl": all ranks in this process, or this process's
// rank when start_comm_runtime started MPI for it). Throws ConfigError for a transport this build
// lacks.
std::unique_ptr<World> make_world(const RunConfig& cfg);
// Names of the transports compiled in, e.g. {"threads", "mpi"}.
std::vector<std::string> available_transports();

// The GPU backend of this build, one line each, for `dtlab version` (gpu_backend.cpp):
//   "GPU backend: CUDA 13.0 (sm_80, sm_90), cuBLAS 13.1.0, cuDNN 9.19.0, NCCL 2.28.9"
//   "GPU devices: none (no CUDA driver: cudaGetDeviceCount returned cudaErrorInsufficientDriver ...)"
// or the devices, or "GPU backend: not built (...)" in a build without CUDA. Never throws.
std::vector<std::string> gpu_backend_report();

// The process-wide runtime of a transport, owned by the executable's main() for the length of
// the program: MPI_Init_thread .. MPI_Finalize for "mpi", nothing for "threads" (this base).
//
//   auto rt = start_comm_runtime(cfg);                     // MPI_Init_thread
//   rt->resolve_world(cfg, world_size_given);              // may throw: shut down all the same
//   ... lab::Run(cfg, make_world) ...
//   ShutdownResult s = rt->shutdown(exit_code, error);   // always, also after an error
//   if (!s.clean) rt->kill_job(exit_code);                // main decides
class CommRuntime {
 public:
  struct ShutdownResult {
    bool clean = true;  // false: peers did not finish in time; main should call kill_job
    std::string note;   // for the console ("" when nothing to say)
  };
  virtual ~CommRuntime() = default;
  // This process's rank (0 for emulated ranks: every rank lives here).
  virtual int rank() const { return 0; }
  // Whether every rank is a process of a launcher's job (mpirun: --comm mpi, or --comm nccl under
  // mpirun), rather than a thread of this one.
  virtual bool ranks_are_processes() const { return false; }
  // Sets cfg.world_size from the runtime (MPI's world size); when world_size_given (--world-size
  // was on the command line) the two must agree. Throws ConfigError otherwise.
  virtual void resolve_world(RunConfig& cfg, bool world_size_given) {
    (void)cfg;
    (void)world_size_given;
  }
  // One console line saying where the ranks come from, e.g.
  // "ranks: 4 processes via Open MPI (OMPI_COMM_WORLD_RANK/SIZE)"; empty for emulated ranks.
  virtual std::string describe() const { return {}; }
  // Ends the runtime after the program's work ended with exit_code (error: what main printed).
  virtual ShutdownResult shutdown(int exit_code, const std::string& error) {
    (void)exit_code;
    (void)error;
    return {};
  }
  // The rank this process's transport is waiting for right now (-1: none), e.g. when a signal
  // came: under mpirun, SIGTERM usually means another process of the job ended.
  virtual int waiting_for() const { return -1; }
  // Stops every process of the job at once (MPI_Abort); does not return. No-op here.
  virtual void kill_job(int exit_code) { (void)exit_code; }
};

// Starts the runtime for cfg.comm: MPI for "mpi", and for "nccl" when an MPI launcher started this
// process (mpirun -np N dtlab run --comm nccl: one rank per process, MPI as NCCL's launcher); none
// otherwise. Throws ConfigError (e.g. "mpi" in a build without MPI) before anything is started.
std::unique_ptr<CommRuntime> start_comm_runtime(const RunConfig& cfg);

}  // namespace lab
