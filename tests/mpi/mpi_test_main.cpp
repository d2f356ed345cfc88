// main of the TransportMpi tests: MPI up (as dtlab's main does it), the tests, an orderly
// shutdown. Every process runs every test; a process whose tests fail exits non-zero, and its
// shutdown tells the others.
#include <gtest/gtest.h>

#include <cstdio>
#include <memory>

#include "backends.h"
#include "errors.h"
#include "mpi_test_shutdown.h"
#include "mpi_test_world.h"

namespace {
std::unique_ptr<lab::World> g_world;
int g_rank = 0;
}  // namespace

namespace mpitest {
lab::World& world() { return *g_world; }
int rank() { return g_rank; }
}  // namespace mpitest

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  lab::RunConfig cfg;
  cfg.comm = "mpi";
  cfg.timeout_s = 30;
  std::unique_ptr<lab::CommRuntime> rt;
  int code = 0;
  std::string error;
  try {
    rt = lab::start_comm_runtime(cfg);
    rt->resolve_world(cfg, false);
    g_rank = rt->rank();
    g_world = lab::make_world(cfg);
    g_world->transport(g_rank).set_timeout(cfg.timeout_s);
    code = RUN_ALL_TESTS();
    if (code) error = "a test failed on rank " + std::to_string(g_rank);
  } catch (const lab::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    code = 1;
    error = e.what();
  }
  g_world.reset();
  return mpitest::shutdown(rt.get(), code, error);
}
