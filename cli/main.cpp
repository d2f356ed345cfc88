// dtlab: the command-line front end (being written; see README).
#include <cstdio>

#include "gemm.h"

int main() {
  std::printf("dtlab 0.1.0 (sgemm: %s)\n", lab::gemm_backend_name());
  return 0;
}
