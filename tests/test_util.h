// Helpers shared by the tests: temporary directories, fixtures, the dataset, running the CLI.
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "config.h"
#include "dataset.h"

namespace testutil {

// A fresh directory under the system temp dir, removed when the object dies.
class TempDir {
 public:
  TempDir() {
    std::random_device rd;
    m_path = (std::filesystem::temp_directory_path() / ("dtlab-test-" + std::to_string(rd()) + std::to_string(rd())))
                 .string();
    std::filesystem::create_directories(m_path);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(m_path, ec);
  }
  const std::string& path() const { return m_path; }
  std::string file(const std::string& name) const { return m_path + "/" + name; }

 private:
  std::string m_path;
};

inline nlohmann::json load_fixture(const std::string& name) {
  std::ifstream f(std::string(DTLAB_FIXTURES_DIR) + "/" + name);
  if (!f) throw std::runtime_error("missing fixture " + name);
  return nlohmann::json::parse(f);
}

inline bool have_dataset() {
  return std::filesystem::exists(std::string(lab::kDefaultDataDir) + "/train-images-idx3-ubyte.gz");
}

#define DTLAB_REQUIRE_DATASET()                                                                    \
  do {                                                                                             \
    if (!testutil::have_dataset())                                                                 \
      GTEST_SKIP() << "Fashion-MNIST is not installed (apt-get install dataset-fashion-mnist)";    \
  } while (0)

inline std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

struct CliResult {
  int exit_code = -1;
  std::string out;  // stdout and stderr together
};

// Runs a shell command line, stdout and stderr together.
// Writes text to path, replacing the file.
inline void write_file(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << text;
}

inline CliResult run_shell(const std::string& command) {
  TempDir tmp;
  const std::string out = tmp.file("out.txt");
  const std::string cmd = "(" + command + ") > " + out + " 2>&1";
  const int status = std::system(cmd.c_str());
  CliResult r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = read_file(out);
  return r;
}

// Runs the dtlab executable with args (a shell-quoted string), after `prefix` (e.g. environment
// settings or a wrapper such as xvfb-run).
inline CliResult run_cli_with_prefix(const std::string& prefix, const std::string& args) {
  return run_shell(prefix + " " + std::string(DTLAB_BINARY) + " " + args);
}

// Runs the dtlab executable with args (a shell-quoted string).
inline CliResult run_cli(const std::string& args) { return run_cli_with_prefix("", args); }

// A small training run for tests: 256 training and 64 test samples, per-rank batch 16.
inline lab::RunConfig small_run(const std::string& model, int world, const std::string& out, int64_t steps) {
  lab::RunConfig c;
  c.model = model;
  c.world_size = world;
  c.batch_size = 16;
  c.limit_train = 256;
  c.limit_test = 64;
  c.steps = steps;
  c.epochs = 0;  // --steps alone: as many epochs as it takes
  c.threads = 1;
  c.out_dir = out;
  c.timeout_s = 20;
  return c;
}

// metrics.jsonl without its wall-clock fields ("t", "seconds", "samples_per_s").
inline std::string without_wall_clock(const std::string& metrics) {
  std::stringstream in(metrics), out;
  std::string line;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line);
    j.erase("t");
    j.erase("seconds");
    j.erase("samples_per_s");
    out << j.dump() << "\n";
  }
  return out.str();
}

}  // namespace testutil
