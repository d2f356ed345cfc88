// The core depends on no front end or backend: lab/ includes no GUI, GPU, MPI or backend header.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <string>

TEST(Architecture, CoreIncludesNoGuiGpuMpiOrBackendHeaders) {
  const std::filesystem::path lab = std::filesystem::path(DTLAB_FIXTURES_DIR).parent_path().parent_path() / "lab";
  ASSERT_TRUE(std::filesystem::is_directory(lab)) << lab;
  const std::regex forbidden(R"(#\s*include\s*[<"](imgui|GLFW|GL/|cuda|cudnn|nccl|mpi\.h|threads/|cpu/|backends))");
  int files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(lab)) {
    std::ifstream f(entry.path());
    std::string line;
    int n = 0;
    while (std::getline(f, line)) {
      ++n;
      EXPECT_FALSE(std::regex_search(line, forbidden)) << entry.path().filename().string() << ":" << n << ": " << line;
    }
    ++files;
  }
  EXPECT_GT(files, 10);
}
