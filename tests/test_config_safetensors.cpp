#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "config.h"
#include "errors.h"
#include "model.h"
#include "safetensors.h"
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
  EXPECT_EQ(r.seed, 42u);
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
}

TEST(Safetensors, ModelRoundTripIsBitExact) {
  lab::ModelOptions o;
  o.name = "cnn";
  auto a = lab::build_model(o, 1);
  auto b = lab::build_model(o, 2);
  a->batchnorms()[0]->num_batches_tracked().i64 = 17;
  a->batchnorms()[0]->running_var().value.data[3] = 2.5f;
  testutil::TempDir tmp;
  lab::write_safetensors(tmp.file("w.safetensors"), lab::model_tensors(*a), {{"format", "pt"}});
  std::map<std::string, std::string> meta;
  const auto t = lab::read_safetensors(tmp.file("w.safetensors"), &meta);
  EXPECT_EQ(meta["format"], "pt");
  lab::load_model_tensors(*b, t, tmp.file("w.safetensors"));
  const auto ea = a->state_dict(), eb = b->state_dict();
  ASSERT_EQ(ea.size(), eb.size());
  for (size_t i = 0; i < ea.size(); ++i) {
    EXPECT_EQ(ea[i].name, eb[i].name);
    if (ea[i].param) EXPECT_EQ(ea[i].param->value.data, eb[i].param->value.data) << ea[i].name;
    else if (ea[i].buffer->is_int64) EXPECT_EQ(ea[i].buffer->i64, eb[i].buffer->i64) << ea[i].name;
    else EXPECT_EQ(ea[i].buffer->value.data, eb[i].buffer->value.data) << ea[i].name;
  }
  // The writer's order (state_dict order) survives the round trip.
  ASSERT_EQ(t.size(), ea.size());
  for (size_t i = 0; i < t.size(); ++i) EXPECT_EQ(t[i].name, ea[i].name);
}

TEST(Safetensors, BadFilesGiveClearErrors) {
  testutil::TempDir tmp;
  std::ofstream(tmp.file("short.safetensors")) << "abc";
  EXPECT_THROW(lab::read_safetensors(tmp.file("short.safetensors")), lab::IoError);
  try {
    lab::read_safetensors(tmp.file("missing.safetensors"));
    FAIL();
  } catch (const lab::IoError& e) {
    EXPECT_NE(std::string(e.what()).find("missing.safetensors"), std::string::npos);
  }
  // A cnn file loaded into an mlp: the error names the file and a key.
  lab::ModelOptions o;
  o.name = "cnn";
  auto cnn = lab::build_model(o, 0);
  o.name = "mlp";
  auto mlp = lab::build_model(o, 0);
  lab::write_safetensors(tmp.file("cnn.safetensors"), lab::model_tensors(*cnn), {});
  try {
    lab::load_model_tensors(*mlp, lab::read_safetensors(tmp.file("cnn.safetensors")), tmp.file("cnn.safetensors"));
    FAIL();
  } catch (const lab::IoError& e) {
    EXPECT_NE(std::string(e.what()).find("cnn.safetensors"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("1.weight"), std::string::npos) << e.what();
  }
  // Truncated payload.
  std::string bytes = testutil::read_file(tmp.file("cnn.safetensors"));
  std::ofstream(tmp.file("trunc.safetensors"), std::ios::binary) << bytes.substr(0, bytes.size() - 100);
  EXPECT_THROW(lab::read_safetensors(tmp.file("trunc.safetensors")), lab::IoError);
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

// Found by fuzzing and by hand (fuzz/fuzz_safetensors.cpp): headers whose sizes overflow, are
// negative or floats, or whose __metadata__ is not a map, are an IoError naming the file, not
// undefined behaviour (signed overflow, float-to-integer conversion) or a JSON library exception.
TEST(Safetensors, HostileHeadersGiveClearErrors) {
  testutil::TempDir tmp;
  auto file = [&](const std::string& header, const std::string& payload) {
    std::string h = header;
    std::string bytes(8, '\0');
    for (int i = 0; i < 8; ++i) bytes[static_cast<size_t>(i)] = static_cast<char>((h.size() >> (8 * i)) & 0xFF);
    std::ofstream(tmp.file("w.safetensors"), std::ios::binary) << bytes << h << payload;
    return tmp.file("w.safetensors");
  };
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"w":{"dtype":"F32","shape":[1099511627776,1099511627776],"data_offsets":[0,0]}})", "need"},
      {R"({"w":{"dtype":"F32","shape":[4611686018427387904],"data_offsets":[0,0]}})", "not a size"},
      {R"({"w":{"dtype":"F32","shape":[-1,-4],"data_offsets":[0,16]}})", "not a size"},
      {R"({"w":{"dtype":"F32","shape":[1.5e300],"data_offsets":[0,0]}})", "not a size"},
      {R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,1e300]}})", "not a size"},
      {R"({"__metadata__":[1,2]})", "__metadata__"},
      {R"({"__metadata__":5})", "__metadata__"},
  };
  for (const auto& [header, says] : cases) {
    try {
      lab::read_safetensors(file(header, std::string(16, '\0')));
      ADD_FAILURE() << "accepted " << header;
    } catch (const lab::IoError& e) {
      EXPECT_NE(std::string(e.what()).find("w.safetensors"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
    }
  }
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
