// The core depends on no front end or backend: lab/ includes no GUI, GPU, MPI or backend header.
// The source is in layers (docs/layout.md), every #include pointing to the same layer or one
// before it, and header names are unique. The repository is self-contained: no tracked file
// reaches outside it.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

TEST(Architecture, CoreIncludesNoGuiGpuMpiOrBackendHeaders) {
  const std::filesystem::path lab = std::filesystem::path(DTLAB_FIXTURES_DIR).parent_path().parent_path() / "lab";
  ASSERT_TRUE(std::filesystem::is_directory(lab)) << lab;
  // NCCL's headers are nccl.h, nccl_net.h and nccl_tuner.h; lab/sim/nccl_model.h is ours (a cost
  // model in plain C++)
  const std::regex forbidden(
      R"(#\s*include\s*[<"](imgui|GLFW|GL/|cuda|cudnn|nccl(_net|_tuner)?\.h|mpi\.h|threads/|cpu/|backends))");
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

// The layers, each including only itself and those before it: lab (the core), backends, commands
// (the commands as a library), lessons/runner, viz/data, viz (the window), and on top the
// executable (cli/), the tests and the fuzzers. Every #include "..." of every source file is
// resolved to the header it names (a path suffix; header names are unique, so a bare name is one
// file) and must not point up: no arrow from lab, backends, commands, lessons or viz into cli/,
// none from lab into anything. Headers not in the tree (the libraries') are not in the graph.
namespace {

const std::vector<std::pair<std::string, int>>& layers() {  // folder (relative to the root), layer
  static const std::vector<std::pair<std::string, int>> l = {
      {"lab", 0}, {"backends", 1}, {"commands", 2}, {"lessons/runner", 3}, {"viz/data", 4}, {"viz", 5},
      {"cli", 6}, {"tests", 6}, {"fuzz", 6}};
  return l;
}

int layer_of(const std::string& rel) {  // the deepest folder that holds it; -1: none
  int best = -1;
  size_t best_len = 0;
  for (const auto& [dir, layer] : layers())
    if (rel.compare(0, dir.size() + 1, dir + "/") == 0 && dir.size() > best_len) best = layer, best_len = dir.size();
  return best;
}

bool is_source(const std::filesystem::path& p) {
  const std::string e = p.extension().string();
  return e == ".h" || e == ".cpp" || e == ".cu" || e == ".cuh" || e == ".c";
}

struct Tree {
  std::filesystem::path root;
  std::vector<std::string> sources;                          // relative paths
  std::map<std::string, std::vector<std::string>> headers;  // file name -> relative paths
};

Tree read_tree() {
  Tree t;
  t.root = std::filesystem::path(DTLAB_FIXTURES_DIR).parent_path().parent_path();
  for (const auto& [dir, layer] : layers()) {
    if (dir == "viz") continue;  // viz/ is walked without recursing (viz/data is its own layer)
    for (const auto& e : std::filesystem::recursive_directory_iterator(t.root / dir)) {
      if (!e.is_regular_file() || !is_source(e.path())) continue;
      const std::string rel = std::filesystem::relative(e.path(), t.root).string();
      t.sources.push_back(rel);
    }
  }
  for (const auto& e : std::filesystem::directory_iterator(t.root / "viz"))
    if (e.is_regular_file() && is_source(e.path())) t.sources.push_back(std::filesystem::relative(e.path(), t.root).string());
  for (const std::string& rel : t.sources) {
    const std::filesystem::path p(rel);
    if (p.extension() == ".h" || p.extension() == ".cuh") t.headers[p.filename().string()].push_back(rel);
  }
  return t;
}

// The tree's header an include names ("" when none: a library's header).
std::string resolve(const Tree& t, const std::string& name) {
  const std::string base = std::filesystem::path(name).filename().string();
  auto it = t.headers.find(base);
  if (it == t.headers.end()) return "";
  for (const std::string& rel : it->second) {
    if (name.find('/') == std::string::npos) return rel;
    if (rel.size() >= name.size() + 1 && rel.compare(rel.size() - name.size() - 1, std::string::npos, "/" + name) == 0) return rel;
  }
  return "";
}

}  // namespace

TEST(Architecture, HeaderNamesAreUnique) {
  const Tree t = read_tree();
  ASSERT_GT(t.headers.size(), 50u);
  for (const auto& [name, paths] : t.headers) {
    std::string all;
    for (const std::string& p : paths) all += " " + p;
    EXPECT_EQ(paths.size(), 1u) << name << " is the name of several headers:" << all
                                << " (an #include \"" << name << "\" means whichever comes first on the include path)";
  }
}

TEST(Architecture, EveryIncludePointsToItsLayerOrAnEarlierOne) {
  const Tree t = read_tree();
  const std::regex include(R"re(^\s*#\s*include\s*"([^"]+)")re");
  const char* names[] = {"lab", "backends", "commands", "lessons/runner", "viz/data", "viz", "cli, tests, fuzz"};
  int edges = 0;
  for (const std::string& rel : t.sources) {
    const int from = layer_of(rel);
    std::ifstream f(t.root / rel);
    std::string line;
    int n = 0;
    while (std::getline(f, line)) {
      ++n;
      std::smatch m;
      if (!std::regex_search(line, m, include)) continue;
      const std::string target = resolve(t, m[1].str());
      if (target.empty()) continue;
      ++edges;
      const int to = layer_of(target);
      EXPECT_LE(to, from) << rel << ":" << n << " (" << names[from] << ") includes " << target << " (" << names[to]
                          << "), a later layer: " << line;
    }
  }
  EXPECT_GT(edges, 500);
}
