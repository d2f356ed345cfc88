// The backend registry: which transports a build has, and the errors that say what is missing.
// (The MPI transport itself is tested under mpirun: tests/mpi, label "mpi".)
#include <gtest/gtest.h>

#include <algorithm>

#include "backends.h"
#include "errors.h"
#include "test_util.h"
#include "threads/transport_threads.h"

namespace {

bool have(const std::string& name) {
  const auto t = lab::available_transports();
  return std::find(t.begin(), t.end(), name) != t.end();
}

TEST(Backends, ThreadsAreAlwaysThere) {
  EXPECT_TRUE(have("threads"));
  lab::RunConfig c;
  c.world_size = 3;
  EXPECT_EQ(lab::make_world(c)->local_ranks(), (std::vector<int>{0, 1, 2}));
  // Emulated ranks need no process-wide runtime: it is the no-op one.
  auto rt = lab::start_comm_runtime(c);
  rt->resolve_world(c, true);
  EXPECT_EQ(c.world_size, 3);
  EXPECT_EQ(rt->rank(), 0);
  EXPECT_TRUE(rt->describe().empty());
  EXPECT_TRUE(rt->shutdown(0, "").clean);
}

// A build without Open MPI says so, and how to get it; a build with it needs mpirun (or at least
// the runtime that dtlab's main starts) before a world can be made.
TEST(Backends, CommMpiNeedsOpenMpiAndItsRuntime) {
  lab::RunConfig c;
  c.comm = "mpi";
  try {
    lab::make_world(c);
    FAIL() << "make_world returned";
  } catch (const lab::ConfigError& e) {
    if (have("mpi")) {
      EXPECT_NE(std::string(e.what()).find("MPI is not started in this process"), std::string::npos) << e.what();
      EXPECT_NE(e.hint().find("mpirun -np 4 dtlab run --comm mpi"), std::string::npos) << e.hint();
    } else {
      EXPECT_NE(std::string(e.what()).find("this build of dtlab has no MPI"), std::string::npos) << e.what();
      EXPECT_NE(e.hint().find("apt-get install openmpi-bin libopenmpi-dev"), std::string::npos) << e.hint();
    }
  }
  if (!have("mpi")) {
    EXPECT_THROW(lab::start_comm_runtime(c), lab::ConfigError);
    const testutil::CliResult r = testutil::run_cli("run --comm mpi --steps 1");
    EXPECT_EQ(r.exit_code, lab::kExitUsage) << r.out;
    EXPECT_NE(r.out.find("this build of dtlab has no MPI"), std::string::npos) << r.out;
  }
}

TEST(Backends, NativeAllreduceNeedsATransportThatHasOne) {
  lab::ThreadsWorld w(1);
  float x = 1;
  try {
    w.transport(0).native_allreduce_sum(&x, 1);
    FAIL() << "native_allreduce_sum returned";
  } catch (const lab::ConfigError& e) {
    EXPECT_STREQ(e.what(), "the threads transport has no allreduce of its own");
    EXPECT_EQ(e.hint(), "--allreduce mpi needs --comm mpi, --allreduce nccl needs --comm nccl");
  }
}

TEST(Backends, UnknownTransportNamesTheAvailableOnes) {
  lab::RunConfig c;
  c.comm = "carrier-pigeon";
  EXPECT_THROW(lab::validate(c), lab::ConfigError);
  try {
    lab::make_world(c);
    FAIL();
  } catch (const lab::ConfigError& e) {
    EXPECT_NE(e.hint().find("threads"), std::string::npos) << e.hint();
  }
}

}  // namespace
