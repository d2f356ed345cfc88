// The MPI world of a test binary that runs as the processes of one mpirun job (mpi_test_main.cpp).
#pragma once

#include "transport.h"

namespace mpitest {

lab::World& world();
int rank();

}  // namespace mpitest
