#include "backends.h"

#include <cstdlib>

#include "errors.h"
#include "threads/transport_threads.h"
#ifdef DTLAB_HAVE_MPI
#include "mpi/mpi_runtime.h"
#include "mpi/transport_mpi.h"
#endif
#ifdef DTLAB_HAVE_NCCL
#include "cuda/cuda_device.h"
#include "nccl/transport_nccl.h"
#endif

namespace lab {

namespace {

#ifndef DTLAB_HAVE_MPI
[[noreturn]] void throw_no_mpi() {
  throw ConfigError("--comm mpi: this build of dtlab has no MPI (Open MPI was not found when it was configured)",
                    "install Open MPI (apt-get install openmpi-bin libopenmpi-dev, or run tools/setup.sh) and "
                    "rebuild: cmake -S . -B build && cmake --build build");
}
#endif

// Whether an MPI launcher (mpirun, mpiexec, srun) started this process: Open MPI's, PMI's or
// PMIx's environment is set. --comm nccl then runs one rank per process, MPI as NCCL's launcher.
bool launched_by_mpi() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"})
    if (const char* x = std::getenv(v); x && *x) return true;
  return false;
}

#ifdef DTLAB_HAVE_NCCL
// rank `rank` needs cuda:`gpu`: the machine must have it.
void check_gpu_exists(int rank, int gpu, int count, const std::string& hint) {
  if (gpu < count) return;
  throw DeviceError("--comm nccl: rank " + std::to_string(rank) + " needs cuda:" + std::to_string(gpu) +
                        ", and this process sees " + std::to_string(count) + " GPU" + (count == 1 ? "" : "s"),
                    hint);
}
#endif

// --comm nccl: the GPU of every rank is checked against the machine before NCCL is called (NCCL
// refuses two ranks on one GPU; validate() has refused a map that says so). Under an MPI launcher
// this process is one rank, on the GPU the map gives it on its machine (MpiRuntime filled
// rank_nodes); otherwise every rank is a thread of this process.
std::unique_ptr<World> make_nccl_world(const RunConfig& cfg) {
  const std::vector<int> gpus = rank_device_map(cfg.compute, cfg.world_size, "nccl");
  check_one_rank_per_gpu(gpus, cfg.compute.rank_nodes);
#ifdef DTLAB_HAVE_NCCL
  const cuda::CudaProbe probe = cuda::cuda_devices();
  if (!probe.ok()) throw DeviceError("--comm nccl: " + probe.reason, probe.hint);
  const int count = static_cast<int>(probe.devices.size());
#ifdef DTLAB_HAVE_MPI
  if (MpiRuntime* rt = MpiRuntime::current()) {
    const int rank = rt->rank();
    check_gpu_exists(rank, gpus[static_cast<size_t>(rank)], count,
                     "NCCL refuses two ranks on one GPU: start at most as many processes per machine as it has GPUs "
                     "(mpirun -npernode N), or give each rank its GPU with --rank-devices");
    return std::make_unique<NcclWorld>(*rt, gpus[static_cast<size_t>(rank)], cfg.timeout_s);
  }
#endif
  for (size_t r = 0; r < gpus.size(); ++r)
    check_gpu_exists(static_cast<int>(r), gpus[r], count,
                     "NCCL refuses two ranks on one GPU, so --comm nccl --world-size " + std::to_string(cfg.world_size) +
                         " needs " + std::to_string(cfg.world_size) +
                         " GPUs; --comm threads runs emulated ranks that share one GPU");
  return std::make_unique<NcclWorld>(gpus, cfg.timeout_s);
#else
#ifndef DTLAB_CUDA_OFF_REASON
#define DTLAB_CUDA_OFF_REASON "this build has no CUDA"
#endif
  throw DeviceError(std::string("--comm nccl: this dtlab was built without the GPU backend (") + DTLAB_CUDA_OFF_REASON +
                        ")",
                    "rebuild where the CUDA toolkit, cuDNN 9 and NCCL are installed (see `dtlab version`)");
#endif
}

}  // namespace

std::unique_ptr<World> make_world(const RunConfig& cfg) {
  if (cfg.comm == "threads") return std::make_unique<ThreadsWorld>(cfg.world_size);
  if (cfg.comm == "mpi") {
#ifdef DTLAB_HAVE_MPI
    MpiRuntime* rt = MpiRuntime::current();
    if (!rt)
      throw ConfigError("--comm mpi: MPI is not started in this process",
                        "the dtlab executable starts it for `dtlab run --comm mpi`; run that under mpirun, e.g. "
                        "mpirun -np 4 dtlab run --comm mpi ...");
    return std::make_unique<MpiWorld>(*rt, cfg);
#else
    throw_no_mpi();
#endif
  }
  if (cfg.comm == "nccl") return make_nccl_world(cfg);
  std::string names;
  for (const std::string& t : available_transports()) names += (names.empty() ? "" : ", ") + t;
  throw ConfigError("--comm: transport '" + cfg.comm + "' is not in this build", "available: " + names);
}

std::vector<std::string> available_transports() {
  std::vector<std::string> t{"threads"};
#ifdef DTLAB_HAVE_MPI
  t.push_back("mpi");
#endif
#ifdef DTLAB_HAVE_NCCL
  t.push_back("nccl");
#endif
  return t;
}

std::unique_ptr<CommRuntime> start_comm_runtime(const RunConfig& cfg) {
  if (cfg.comm == "mpi") {
#ifdef DTLAB_HAVE_MPI
    return std::make_unique<MpiRuntime>(cfg.timeout_s);
#else
    throw_no_mpi();
#endif
  }
  // NCCL ranks as processes: MPI is NCCL's launcher (process_group.h).
  if (cfg.comm == "nccl" && launched_by_mpi()) {
#ifdef DTLAB_HAVE_MPI
    return std::make_unique<MpiRuntime>(cfg.timeout_s, "nccl");
#else
    throw ConfigError("--comm nccl under mpirun: this build of dtlab has no MPI to start the ranks with",
                      "install Open MPI (apt-get install openmpi-bin libopenmpi-dev) and rebuild, or run "
                      "`dtlab run --comm nccl` without mpirun: one process, a thread per GPU");
#endif
  }
  return std::make_unique<CommRuntime>();
}

}  // namespace lab
