// The test binary's main: like dtlab itself, pick OpenBLAS's kernel for this CPU first (see
// backends/cpu/openblas_env.h), so tests that train run at the speed users see, and refuse a
// DTLAB_SGEMM that names no kernel (DTLAB_SGEMM=reference runs every test on the reference sgemm).
#include <gtest/gtest.h>

#include <cstdio>

#include "cpu/gemm_choice.h"
#include "cpu/openblas_env.h"
#include "errors.h"

int main(int argc, char** argv) {
  lab::ensure_openblas_coretype(argc, argv);
  try {
    lab::sgemm_choice_from_env();
  } catch (const lab::ConfigError& e) {
    std::fprintf(stderr, "dtlab_tests: %s\n  hint: %s\n", e.what(), e.hint().c_str());
    return lab::kExitUsage;
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
