// The core depends on no front end or backend: lab/ includes no GUI, GPU, MPI or backend header.
// The repository is self-contained: no tracked file reaches outside it.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <regex>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

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

// A user clones the repository alone: the tools, tests and benchmarks must find everything they
// use inside it (the PyTorch models in tools/torch, the peers in tools/peers), never in a folder
// beside the clone, nor at a path of one machine. CI runs the suite from a clone with nothing
// beside it (.ci/run); this test names the file and line that would reach out.
TEST(Architecture, NoTrackedFileReachesOutsideTheRepository) {
  const std::filesystem::path root = std::filesystem::path(DTLAB_FIXTURES_DIR).parent_path().parent_path();
  if (!std::filesystem::exists(root / ".git")) GTEST_SKIP() << root.string() << " is not a git checkout: no tracked files to read";
  std::string quoted;  // root in single quotes for the shell
  for (char c : root.string()) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  const std::string command = "git -C '" + quoted + "' ls-files -z 2>/dev/null";
  std::FILE* pipe = popen(command.c_str(), "r");
  ASSERT_NE(pipe, nullptr) << command;
  std::string listing;
  std::array<char, 4096> chunk;
  for (size_t n; (n = std::fread(chunk.data(), 1, chunk.size(), pipe)) > 0;) listing.append(chunk.data(), n);
  if (pclose(pipe) != 0) GTEST_SKIP() << "`" << command << "` failed (is git installed?): no tracked files to read";

  // Spelled in pieces so that this file does not match itself.
  const std::string beside = std::string("..") + "/sha" "red";
  const std::vector<std::string> forbidden = {
      beside,                                   // the team's folder beside the repository
      std::string("sha" "red") + "/peers",      // its reference peers
      std::string("\"sha" "red\""),             // a path joined from parts: os.path.join(parent, "sh...", "peers")
      std::string("'sha" "red'"),
      std::string("/wo" "rk/"),                 // a path of the machine the project is developed on
  };

  int files = 0;
  std::istringstream names(listing);
  for (std::string name; std::getline(names, name, '\0');) {
    std::ifstream f(root / name, std::ios::binary);
    if (!f) continue;  // a tracked file deleted in the work tree, or a submodule
    const std::string text{std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
    if (text.find('\0') != std::string::npos) continue;  // binary
    ++files;
    std::istringstream lines(text);
    int n = 0;
    for (std::string line; std::getline(lines, line);) {
      ++n;
      for (const std::string& what : forbidden) {
        if (line.find(what) == std::string::npos) continue;
        ADD_FAILURE() << name << ":" << n << " reaches outside the repository (" << what << "): " << line;
      }
    }
  }
  EXPECT_GT(files, 100);
}
