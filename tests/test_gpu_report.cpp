// The GPU backend explains itself on any machine: `dtlab version` names the backend (or why this
// build has none) and the devices (or why there are none: no driver, no GPU). This runs where CI
// runs, without a GPU; the backend's ops are tested on a GPU by tests/gpu.
#include <gtest/gtest.h>

#include "backends.h"
#include "test_util.h"

TEST(GpuReport, VersionNamesTheBackendAndTheDevicesOrWhyNone) {
  const std::vector<std::string> lines = lab::gpu_backend_report();
  ASSERT_FALSE(lines.empty());
  EXPECT_EQ(lines[0].rfind("GPU backend: ", 0), 0u) << lines[0];
#ifdef DTLAB_TEST_HAVE_CUDA
  // built with CUDA: the versions, then the devices or the probe's reason
  for (const char* what : {"CUDA ", "cuBLAS ", "cuDNN ", "NCCL "})
    EXPECT_NE(lines[0].find(what), std::string::npos) << lines[0];
  ASSERT_GE(lines.size(), 2u);
  if (lines[1].rfind("GPU devices: none (", 0) == 0)
    EXPECT_NE(lines[1].find("cudaGetDeviceCount"), std::string::npos) << lines[1];
  else
    EXPECT_EQ(lines[1].rfind("GPU 0: ", 0), 0u) << lines[1];
#else
  EXPECT_NE(lines[0].find("not built"), std::string::npos) << lines[0];
#endif
  const testutil::CliResult r = testutil::run_cli("version");
  EXPECT_EQ(r.exit_code, 0) << r.out;
  for (const std::string& line : lines) EXPECT_NE(r.out.find(line), std::string::npos) << r.out;
}
