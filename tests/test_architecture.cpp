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
  for (const auto& entry : std::filesystem::recursive_directory_iterator(lab)) {
    if (!entry.is_regular_file()) continue;
    std::ifstream f(entry.path());
    std::string line;
    int n = 0;
    while (std::getline(f, line)) {
      ++n;
      EXPECT_FALSE(std::regex_search(line, forbidden)) << entry.path().string() << ":" << n << ": " << line;
    }
    ++files;
  }
  EXPECT_GT(files, 10);
}

// What the lab window shows is plain C++ too (viz/data): testable without a display, and only
// viz/*.cpp (the panels and the platform layer) include Dear ImGui, GLFW or OpenGL.
TEST(Architecture, VizDataIncludesNoGuiHeaders) {
  const std::filesystem::path data =
      std::filesystem::path(DTLAB_FIXTURES_DIR).parent_path().parent_path() / "viz" / "data";
  ASSERT_TRUE(std::filesystem::is_directory(data)) << data;
  const std::regex forbidden(R"(#\s*include\s*[<"](imgui|GLFW|GL/|stb_))");
  int files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(data)) {
    std::ifstream f(entry.path());
    std::string line;
    int n = 0;
    while (std::getline(f, line)) {
      ++n;
      EXPECT_FALSE(std::regex_search(line, forbidden)) << entry.path().filename().string() << ":" << n << ": " << line;
    }
    ++files;
  }
  EXPECT_GT(files, 5);
}
