// The test binary's main: like dtlab itself, pick OpenBLAS's kernel for this CPU first (see
// backends/cpu/openblas_env.h), so tests that train run at the speed users see.
#include <gtest/gtest.h>

#include "cpu/openblas_env.h"

int main(int argc, char** argv) {
  lab::ensure_openblas_coretype(argc, argv);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
