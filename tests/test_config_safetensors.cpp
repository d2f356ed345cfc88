#include <gtest/gtest.h>

#include <cstring>
#include <fstream>

#include "config.h"
#include "errors.h"
#include "model.h"
#include "safetensors.h"
#include "test_util.h"

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
