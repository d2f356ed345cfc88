// safetensors (lab/nn/safetensors.h): a model's weights round trip bit for bit; bad and hostile
// files are errors that say what is wrong.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "errors.h"
#include "model.h"
#include "safetensors.h"
#include "test_util.h"

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
