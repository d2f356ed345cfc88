#include "backends.h"

#include "errors.h"
#include "threads/transport_threads.h"
#ifdef DTLAB_HAVE_MPI
#include "mpi/mpi_runtime.h"
#include "mpi/transport_mpi.h"
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
  std::string names;
  for (const std::string& t : available_transports()) names += (names.empty() ? "" : ", ") + t;
  throw ConfigError("--comm: transport '" + cfg.comm + "' is not in this build", "available: " + names);
}

std::vector<std::string> available_transports() {
#ifdef DTLAB_HAVE_MPI
  return {"threads", "mpi"};
#else
  return {"threads"};
#endif
}

std::unique_ptr<CommRuntime> start_comm_runtime(const RunConfig& cfg) {
  if (cfg.comm == "mpi") {
#ifdef DTLAB_HAVE_MPI
    return std::make_unique<MpiRuntime>(cfg.timeout_s);
#else
    throw_no_mpi();
#endif
  }
  return std::make_unique<CommRuntime>();
}

}  // namespace lab
