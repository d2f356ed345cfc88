// The run configuration (lab/core/config.h): config.toml written and read back, unknown keys and bad
// values named in PyTorch's words, the combinations the modes refuse, TOML the parser mishandles.
#include <gtest/gtest.h>

#include <functional>

#include <fstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "config.h"
#include "errors.h"
#include "test_util.h"
#include "toml_parse.h"

TEST(Config, TomlRoundTrip) {
  lab::RunConfig c;
  c.model = "mlp";
  c.world_size = 4;
  c.batch_size = 32;
  c.bn = "sync";
  c.broadcast_buffers = false;
  c.bn_momentum.reset();
  c.lr = 0.123;
  c.optimizer = "adamw";
  c.adam_beta1 = 0.85;
  c.adam_beta2 = 0.995;
  c.adam_eps = 1e-6;
  c.seed = 42;
  c.data_dir = "some \"quoted\" dir";
  testutil::TempDir tmp;
  std::ofstream(tmp.file("config.toml")) << lab::to_toml(c, {{"sgemm", "reference"}});
  const lab::RunConfig r = lab::config_from_toml_file(tmp.file("config.toml"));
  EXPECT_EQ(r.model, "mlp");
  EXPECT_EQ(r.world_size, 4);
  EXPECT_EQ(r.batch_size, 32);
  EXPECT_EQ(r.bn, "sync");
  EXPECT_FALSE(r.broadcast_buffers);
  EXPECT_FALSE(r.bn_momentum.has_value());
  EXPECT_DOUBLE_EQ(r.lr, 0.123);
  EXPECT_EQ(r.optimizer, "adamw");
  EXPECT_EQ(r.adam_beta1, 0.85);
  EXPECT_EQ(r.adam_beta2, 0.995);
  EXPECT_EQ(r.adam_eps, 1e-6);
  EXPECT_EQ(r.seed, 42u);
  // a configuration written before --optimizer existed reads as SGD
  std::ofstream(tmp.file("old.toml")) << "[optim]\nlr = 0.5\n";
  EXPECT_EQ(lab::config_from_toml_file(tmp.file("old.toml")).optimizer, "sgd");
  std::ofstream(tmp.file("bad.toml")) << "[optim]\nbetas = [0.9]\n";
  try {
    lab::config_from_toml_file(tmp.file("bad.toml"));
    ADD_FAILURE() << "expected ConfigError";
  } catch (const lab::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("optim.betas"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("bad.toml"), std::string::npos) << e.what();
  }
  EXPECT_EQ(r.data_dir, c.data_dir);
}

TEST(Config, UnknownKeyNamesKeyAndFile) {
  testutil::TempDir tmp;
  std::ofstream(tmp.file("c.toml")) << "[model]\nmodel = \"mlp\"\nwidth = 3\n";
  try {
    lab::config_from_toml_file(tmp.file("c.toml"));
    FAIL() << "expected ConfigError";
  } catch (const lab::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("model.width"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("c.toml"), std::string::npos) << e.what();
  }
}

TEST(Config, PyTorchWordingForBadValues) {
  lab::RunConfig c;
  c.batch_size = 0;
  try {
    lab::validate(c);
    FAIL();
  } catch (const lab::ConfigError& e) {
    EXPECT_STREQ(e.what(), "batch_size should be a positive integer value, but got batch_size=0");
  }
  c.batch_size = 8;
  c.world_size = 4;
  c.fail_rank = 4;
  try {
    lab::validate(c);
    FAIL();
  } catch (const lab::ConfigError& e) {
    EXPECT_STREQ(e.what(), "Invalid rank 4, rank should be in the interval [0, 3]");
  }
  // torch.optim.Adam's wording, after the flag
  const auto refusal = [](const lab::RunConfig& r) {
    try {
      lab::validate(r);
    } catch (const lab::ConfigError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  lab::RunConfig a;
  a.optimizer = "adam";
  a.adam_beta2 = 1.0;
  EXPECT_EQ(refusal(a), "--betas 0.9,1: Invalid beta parameter at index 1: 1");
  a.adam_beta2 = 0.999;
  a.adam_eps = -1;
  EXPECT_EQ(refusal(a), "--eps -1: Invalid epsilon value: -1");
  a.adam_eps = 1e-8;
  a.momentum = 0.5;  // SGD's, asked of Adam
  EXPECT_NE(refusal(a).find("--momentum 0.5 has no effect: --optimizer adam has no momentum buffer"), std::string::npos)
      << refusal(a);
  a.momentum = lab::RunConfig{}.momentum;
  EXPECT_EQ(refusal(a), "");
  a.optimizer = "lamb";
  EXPECT_EQ(refusal(a), "--optimizer: unknown optimizer 'lamb'");
}

TEST(Config, ModesRejectCombinationsPyTorchCannotRun) {
  lab::RunConfig c;
  c.mode = "dp";
  c.world_size = 4;
  c.comm = "mpi";  // DataParallel is one process
  EXPECT_THROW(lab::validate(c), lab::ConfigError);
  c.comm = "threads";
  c.bn = "sync";
  try {
    lab::validate(c);
    FAIL();
  } catch (const lab::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("SyncBatchNorm is only supported within"), std::string::npos) << e.what();
  }
  c.bn = "local";
  EXPECT_NO_THROW(lab::validate(c));
}

// --cuda-graphs: refused by name wherever the captured step would not be the same work every step
// with nothing the host decides in the middle of it, and on the CPU, which has no graph.
TEST(Config, CudaGraphsAreRefusedWhereACapturedStepCannotApply) {
  const auto refusal = [](const lab::RunConfig& r) -> std::string {
    try {
      lab::validate(r);
      return "";
    } catch (const lab::ConfigError& e) {
      return e.what();
    }
  };
  lab::RunConfig c;
  c.world_size = 1;
  c.compute.device = "sim";
  c.compute.cuda_graphs = true;
  EXPECT_EQ(refusal(c), "");
  testutil::TempDir tmp;  // the run directory's config.toml keeps it
  std::ofstream(tmp.file("config.toml")) << lab::to_toml(c, {{"sgemm", "reference"}});
  EXPECT_TRUE(lab::config_from_toml_file(tmp.file("config.toml")).compute.cuda_graphs);
  const std::vector<std::pair<std::function<void(lab::RunConfig&)>, std::string>> cases = {
      {[](lab::RunConfig& r) { r.compute.device = "cpu"; }, "it has no effect with --device cpu"},
      {[](lab::RunConfig& r) { r.world_size = 2; }, "--cuda-graphs with --world-size 2"},
      {[](lab::RunConfig& r) { r.mode = "local-sgd"; }, "--cuda-graphs with --mode local-sgd"},
      {[](lab::RunConfig& r) { r.optimizer = "adamw"; r.momentum = 0; r.lr = 1e-3; }, "Adam's bias corrections"},
      {[](lab::RunConfig& r) { r.bn = "sync"; }, "--cuda-graphs with --bn sync"},
      {[](lab::RunConfig& r) { r.bn_momentum.reset(); }, "--cuda-graphs with --bn-momentum none"},
      {[](lab::RunConfig& r) { r.no_sync_steps = 1; }, "--cuda-graphs with --no-sync-steps"},
  };
  for (const auto& [set, want] : cases) {
    lab::RunConfig r = c;
    set(r);
    EXPECT_NE(refusal(r).find(want), std::string::npos) << "want '" << want << "', got '" << refusal(r) << "'";
  }
}

// Found by fuzzing (fuzz/fuzz_config.cpp, fuzz_lesson.cpp): TOML that Debian's toml++ 3.3.0 cannot
// be given is a ConfigError naming the file and line, not an assertion failure (abort) or
// undefined behaviour inside the library. Valid non-ASCII text in strings and comments still reads.
TEST(Config, TomlTheLibraryMishandlesIsAClearError) {
  testutil::TempDir tmp;
  lab::RunConfig c;
  c.model = "mlp";
  const std::string good = lab::to_toml(c, {{"sgemm", "reference"}});
  const int lines = static_cast<int>(std::count(good.begin(), good.end(), '\n'));
  // the text appended after a valid file, what the error says, and the line it names
  const std::vector<std::tuple<std::string, std::string, int>> cases = {
      {"[`backends]\n", "table header", 1},                  // toml++ asserts (tomlplusplus#301)
      {"[[[1]]]\n", "table header", 1},
      {"x = [}\n", "cannot close", 1},                       // toml++ asserts: '}' taken for a value
      {"x = [\v]\n", "control character", 1},                // toml++ asserts: '\v' taken for a value
      {"m\xd1\xa8mot = 1\n", "non-ASCII", 1},                // U+0468: __builtin_unreachable (#295)
      {"bn_eps = 1.000'd\xef\xba\xbf\n", "non-ASCII", 1},    // U+FEBF in an unquoted value
      {"x = 1.[\"\"\"\x01\xc3\x82\"\"\"\n", "control character", 1},
      {"s = \"\"\"\\\n\xc2\xa7\"\"\"\n", "backslash", 2},    // valid TOML toml++ cannot read (#190)
  };
  for (const auto& [bad, says, line] : cases) {
    std::ofstream(tmp.file("config.toml"), std::ios::binary) << good << bad;
    try {
      lab::config_from_toml_file(tmp.file("config.toml"));
      ADD_FAILURE() << "accepted " << bad;
    } catch (const lab::ConfigError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(tmp.file("config.toml") + ":" + std::to_string(lines + line) + ":"), std::string::npos) << what;
      EXPECT_NE(what.find(says), std::string::npos) << what;
    }
  }
  c.data_dir = "/data/fashion-mnist \xc3\xa9t\xc3\xa9 \xe3\x80\x81";
  std::ofstream(tmp.file("config.toml"), std::ios::binary) << "# r\xc3\xa9sum\xc3\xa9\n" << lab::to_toml(c, {});
  EXPECT_EQ(lab::config_from_toml_file(tmp.file("config.toml")).data_dir, c.data_dir);
}

// The check in front of toml++ (toml_parse.h) lets valid TOML through: strings of every kind with
// non-ASCII text, escapes, quotes and line-ending backslashes, quoted and dotted keys, arrays over
// several lines with comments, inline tables, dates.
TEST(Config, TomlCheckLetsValidTomlThrough) {
  const std::string text =
      "# r\xc3\xa9sum\xc3\xa9 \xe3\x80\x81\n"
      "title = \"caf\xc3\xa9 \\\" \xcf\x83 \xc3\x97\"\n"
      "path = 'C:\\dir\\\xc3\xa9'\n"
      "s1 = \"\"\"one \\\n    \xe2\x80\x94 two\"\"\"\n"
      "s2 = \"\"\"ends \\\n   \"\"\"\n"
      "s3 = \"\"\"\"quoted\"\"\"\"\n"
      "s4 = '''\n[not a header] \xc3\xa9 '''\n"
      "\"quoted key \xc3\xa9\" = 1\n"
      "a.\"b\xc3\xa9\".c = 2\n"
      "list = [\n  \"x\xc3\xa9\", # comment \xc3\xa9\n  'y',\n  [1, 2], { k = \"\xe2\x89\xa4\" },\n]\n"
      "when = 1979-05-27T07:32:00Z\n"
      "day = 1979-05-27 07:32:00\n"
      "[table.\"sub \xc3\xa9\"]\n"
      "x = -0.5e-3\n"
      "[[array]]\n"
      "y = inf\n";
  toml::table t;
  ASSERT_NO_THROW(t = lab::parse_toml(text, "valid.toml"));
  EXPECT_EQ(t["s2"].value<std::string>(), "ends ");
  EXPECT_EQ(t["s3"].value<std::string>(), "\"quoted\"");
  EXPECT_EQ(t["list"].as_array()->size(), 4u);
}
