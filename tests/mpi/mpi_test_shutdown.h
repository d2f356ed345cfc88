// The end of a test binary that runs as the processes of one mpirun job (tests/mpi, tests/gpu's
// NCCL process tests), as dtlab's main ends: the runtime shut down whatever happened, and the job
// killed when a peer does not arrive.
#pragma once

#include <cstdio>
#include <string>

#include "backends.h"

namespace mpitest {

// Shuts `rt` down after the tests ended with `code` (`error`: why, "" on success); returns code.
inline int shutdown(lab::CommRuntime* rt, int code, const std::string& error) {
  if (!rt) return code;
  const lab::CommRuntime::ShutdownResult s = rt->shutdown(code, error);
  if (!s.note.empty()) std::fprintf(stderr, "%s\n", s.note.c_str());
  if (!s.clean) rt->kill_job(code);
  return code;
}

}  // namespace mpitest
