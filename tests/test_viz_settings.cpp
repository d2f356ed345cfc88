// The settings panel's checks (viz/data/settings_check.h): each names the setting and the reason,
// and a choice is greyed out exactly when lab::validate would reject it.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "errors.h"
#include "settings_check.h"
#include "test_util.h"

TEST(VizSettings, ChecksNameTheSettingAndTheReason) {
  lab::RunConfig c;
  c.world_size = 1;
  c.bn = "sync";
  auto checks = viz::check_settings(c, 60000);
  const viz::SettingCheck* note = viz::find_check(checks, "bn", viz::Severity::Note);
  ASSERT_NE(note, nullptr);
  EXPECT_NE(note->message.find("no effect"), std::string::npos);

  c = lab::RunConfig{};
  c.model = "mlp";
  c.world_size = 4;
  c.batch_size = 62;
  checks = viz::check_settings(c, 250);  // 63 per rank: 62 + 1
  const viz::SettingCheck* warn = viz::find_check(checks, "batch_size", viz::Severity::Warning);
  ASSERT_NE(warn, nullptr);
  EXPECT_NE(warn->message.find("Expected more than 1 value per channel"), std::string::npos) << warn->message;
  EXPECT_NE(viz::find_check(checks, "sampler_drop_last", viz::Severity::Note), nullptr) << "250 = 4 x 63 - 2: padding";
  c.model = "cnn";  // BatchNorm2d: 28 x 28 values per channel even for one sample
  EXPECT_EQ(viz::find_check(viz::check_settings(c, 250), "batch_size", viz::Severity::Warning), nullptr);
  c.model = "mlp";

  c.batch_size = 0;
  checks = viz::check_settings(c, 250);
  ASSERT_FALSE(checks.empty());
  EXPECT_EQ(checks[0].severity, viz::Severity::Error);
  EXPECT_NE(checks[0].message.find("batch_size should be a positive integer value, but got batch_size=0"), std::string::npos);

  c.batch_size = 100;
  c.drop_last = true;
  checks = viz::check_settings(c, 250);
  const viz::SettingCheck* err = viz::find_check(checks, "batch_size", viz::Severity::Error);
  ASSERT_NE(err, nullptr) << "63 samples per rank, batch 100 with drop_last: no step at all";
}

// The greying-out rules: a choice that lab::validate would reject after the change is greyed out
// with validate's reason, and one that is not greyed out is accepted by validate; a choice is not
// blamed for a problem the configuration already has.
TEST(VizSettings, WhatValidateRejectsIsGreyedOutWithItsReason) {
  auto valid = [](const lab::RunConfig& c) {
    try {
      lab::validate(c);
      return true;
    } catch (const lab::Error&) {
      return false;
    }
  };
  std::vector<lab::RunConfig> bases;
  for (const char* mode : {"ddp", "dp", "local-sgd"})
    for (int world : {1, 4})
      for (const char* bn : {"local", "sync"}) {
        lab::RunConfig c;
        c.model = "mlp";
        c.mode = mode;
        c.world_size = world;
        c.bn = bn;
        if (valid(c)) bases.push_back(c);
      }
  ASSERT_GE(bases.size(), 8u);
  const std::vector<std::pair<std::string, std::vector<std::string>>> choices = {
      {"mode", {"ddp", "dp", "local-sgd", "pipeline", "tensor"}},
      {"allreduce", {"ring", "naive", "tree", "mpi"}},
      {"bn", {"local", "sync"}},
      {"sampler_drop_last", {"true", "false"}},
      {"drop_last", {"true", "false"}},
      {"no_sync_steps", {"0", "2", "-1"}},
      {"average_every", {"0", "1", "4"}},
      {"warmup_steps", {"-1", "0", "3"}},
      {"batch_size", {"0", "16"}},
      {"world_size", {"0", "1", "4", "65"}},
      {"overlap", {"true", "false"}}};
  int greyed = 0, rejected = 0;
  for (const lab::RunConfig& base : bases)
    for (const auto& [setting, values] : choices)
      for (const std::string& value : values) {
        lab::RunConfig changed = base;
        ASSERT_TRUE(viz::apply_choice(changed, setting, value)) << setting << " " << value;
        const std::string why = viz::unavailable_reason(base, setting, value);
        const std::string what = "mode " + base.mode + ", world " + std::to_string(base.world_size) + ", bn " + base.bn +
                                 ": " + setting + " = " + value;
        if (!valid(changed)) {
          ++rejected;
          EXPECT_NE(why, "") << what << " would be refused by lab::validate, so it must be greyed out";
        }
        if (why.empty()) {
          EXPECT_TRUE(valid(changed)) << what;
        }
        greyed += !why.empty();
      }
  EXPECT_GT(rejected, 20);
  EXPECT_GE(greyed, rejected);

  lab::RunConfig c;
  c.model = "mlp";
  c.world_size = 4;
  c.bn = "sync";
  EXPECT_NE(viz::unavailable_reason(c, "mode", "dp").find("SyncBatchNorm is only supported within"), std::string::npos);
  EXPECT_NE(viz::unavailable_reason(c, "allreduce", "mpi").find("mpirun"), std::string::npos);
  EXPECT_EQ(viz::unavailable_reason(c, "allreduce", "naive"), "");
  EXPECT_EQ(viz::unavailable_reason(c, "mode", "local-sgd"), "");
  c.bn = "local";
  c.mode = "dp";
  EXPECT_NE(viz::unavailable_reason(c, "bn", "sync").find("SyncBatchNorm"), std::string::npos);
  EXPECT_NE(viz::unavailable_reason(c, "sampler_drop_last", "true").find("DistributedSampler"), std::string::npos);
  EXPECT_NE(viz::unavailable_reason(c, "allreduce", "tree").find("no allreduce"), std::string::npos)
      << "no effect in DataParallel";
  EXPECT_NE(viz::unavailable_reason(c, "broadcast_buffers", "false").find("replicate"), std::string::npos);
  EXPECT_NE(viz::unavailable_reason(c, "no_sync_steps", "2"), "");
  // not blamed for a problem the configuration already has
  c = lab::RunConfig{};
  c.world_size = 4;
  c.batch_size = 0;
  EXPECT_EQ(viz::unavailable_reason(c, "allreduce", "tree"), "");
  EXPECT_NE(viz::unavailable_reason(c, "allreduce", "mpi"), "");
}

TEST(VizSettings, DataParallelChunksTheGlobalBatchLikeTorchChunk) {
  lab::RunConfig c;
  c.model = "mlp";
  c.mode = "dp";
  c.world_size = 4;
  c.batch_size = 10;  // 3, 3, 3, 1: device 3 normalizes one sample
  auto checks = viz::check_settings(c, 1000);
  const viz::SettingCheck* w = viz::find_check(checks, "batch_size", viz::Severity::Warning);
  ASSERT_NE(w, nullptr);
  EXPECT_NE(w->message.find("device 3's chunk holds 1 sample (3, 3, 3, 1)"), std::string::npos) << w->message;
  c.model = "cnn";
  EXPECT_EQ(viz::find_check(viz::check_settings(c, 1000), "batch_size", viz::Severity::Warning), nullptr);
  c.model = "mlp";
  c.batch_size = 6;  // 2, 2, 2: device 3 idles
  checks = viz::check_settings(c, 1002);
  EXPECT_EQ(viz::find_check(checks, "batch_size", viz::Severity::Warning), nullptr);
  bool idle = false;
  for (const auto& x : checks) idle = idle || x.message.find("device(s) 3 to 3 idle") != std::string::npos;
  EXPECT_TRUE(idle);
  c.batch_size = 8;  // 1001 = 125 x 8 + 1: the last batch is one sample, on device 0
  checks = viz::check_settings(c, 1001);
  w = viz::find_check(checks, "batch_size", viz::Severity::Warning);
  ASSERT_NE(w, nullptr);
  EXPECT_NE(w->message.find("the last batch of each epoch holds 1 samples"), std::string::npos) << w->message;
  c.drop_last = true;
  EXPECT_EQ(viz::find_check(viz::check_settings(c, 1001), "batch_size", viz::Severity::Warning), nullptr);
  c.batch_size = 2000;  // one DataLoader over 1000 samples, drop_last: nothing to train on
  EXPECT_NE(viz::find_check(viz::check_settings(c, 1000), "batch_size", viz::Severity::Error), nullptr);
}

TEST(VizSettings, LocalSgdSaysWhenItAveragesAndWhenItNeverDoes) {
  lab::RunConfig c;
  c.model = "mlp";
  c.mode = "local-sgd";
  c.world_size = 4;
  c.batch_size = 25;  // 1000 samples: 250 per rank, 10 iterations an epoch
  c.epochs = 1;
  c.warmup_steps = 2;
  c.average_every = 3;
  auto checks = viz::check_settings(c, 1000);
  const viz::SettingCheck* n = viz::find_check(checks, "average_every", viz::Severity::Note);
  ASSERT_NE(n, nullptr);
  EXPECT_NE(n->message.find("averaged after iterations 2, 5, 8, ..."), std::string::npos) << n->message;
  c.warmup_steps = 10;
  checks = viz::check_settings(c, 1000);
  n = viz::find_check(checks, "warmup_steps", viz::Severity::Note);
  ASSERT_NE(n, nullptr);
  EXPECT_NE(n->message.find("never averaged"), std::string::npos) << n->message;
  c.average_every = 0;
  checks = viz::check_settings(c, 1000);
  ASSERT_FALSE(checks.empty());
  EXPECT_EQ(checks[0].severity, viz::Severity::Error);
  EXPECT_EQ(checks[0].setting, "average_every") << checks[0].message;
}
