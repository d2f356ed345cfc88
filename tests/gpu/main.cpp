// The GPU op tests' main: prints what the backend sees first (the versions, the devices or why
// there are none), so that a log of tools/gpu_check.sh says which GPU and libraries it tested.
#include <gtest/gtest.h>

#include <cstdio>

#include "cuda_device.h"

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  for (const std::string& line : lab::cuda::cuda_backend_report()) std::printf("# %s\n", line.c_str());
  return RUN_ALL_TESTS();
}
