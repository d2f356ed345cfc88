// The registry of parallel modes (lab/modes/mode.h) is complete: a mode defined here, in a test,
// and registered at run time is run by Run, parsed by the CLI's definitions (which a lesson's
// runs use), offered by the app's settings model and checked by the configuration rules by
// capability. Nothing outside lab/modes/ knows its name, so if any of them still compared mode
// names, this mode would be refused or misdescribed somewhere below.
#include <gtest/gtest.h>

#include <filesystem>

#include "backends.h"
#include "command_line.h"
#include "config_effects.h"
#include "dataset.h"
#include "errors.h"
#include "mode.h"
#include "model.h"
#include "optim.h"
#include "run.h"
#include "sampler.h"
#include "settings_check.h"
#include "test_util.h"

namespace {

// "solo": every rank trains its own model on its DistributedSampler shard, with no communication
// at all (the baseline of an ensemble). The smallest mode there is: a sampler, forward, loss,
// backward and the optimizer step.
class SoloRank : public lab::RankMode {
 public:
  explicit SoloRank(lab::RankEnv& env)
      : m_env(env),
        m_sampler({env.train.size, env.world, env.rank, env.cfg.shuffle, env.cfg.seed, env.cfg.sampler_drop_last}) {}
  std::vector<std::vector<int64_t>> batches(int64_t epoch) override {
    m_sampler.set_epoch(epoch);
    return lab::make_batches(m_sampler.indices(), m_env.cfg.batch_size, m_env.cfg.drop_last);
  }
  int64_t samples_per_epoch() const override { return m_sampler.num_samples(); }
  lab::StepCount step(const lab::StepInput& in, lab::StepRecord& rec) override {
    const lab::Tensor& logits = m_env.model.forward(*in.x, lab::Mode::Train);
    int correct = 0;
    rec.loss = lab::cross_entropy(logits, *in.labels, &m_dlogits, &correct);
    m_env.model.zero_grad();
    m_env.model.backward(m_dlogits);
    m_env.opt.step();
    ++m_steps;
    rec.correct = correct;
    rec.batch_size = static_cast<int64_t>(in.indices->size());
    lab::StepCount count;
    count.samples = count.trained = rec.batch_size;
    return count;
  }
  void save(lab::ModeCheckpoint& mc) const override { mc.counters["solo_steps"] = m_steps; }
  void restore(const lab::ModeCheckpoint& mc, int64_t) override { m_steps = mc.counters.at("solo_steps").get<int64_t>(); }

 private:
  lab::RankEnv& m_env;
  lab::DistributedSampler m_sampler;
  lab::Tensor m_dlogits;
  int64_t m_steps = 0;
};

class SoloMode : public lab::ParallelMode {
 public:
  const char* name() const override { return "solo"; }
  const char* title() const override { return "independent ranks"; }
  const char* help() const override { return "every rank trains alone"; }
  const char* about() const override { return "Every rank trains its own model on its shard; nothing is exchanged."; }
  lab::ModeCaps caps() const override {
    lab::ModeCaps k;
    k.checkpoints = true;     // and no gradient allreduce, no SyncBatchNorm, no buffers to broadcast
    k.own_parameters = true;  // every rank ends with its own model
    return k;
  }
  std::string describe(const lab::RunConfig& c) const override {
    return "solo, " + std::to_string(c.world_size) + " independent ranks";
  }
  std::unique_ptr<lab::RankMode> make_rank(lab::RankEnv& env) const override { return std::make_unique<SoloRank>(env); }
  void summary(const lab::SummaryEnv& env, nlohmann::json& j) const override {
    j["solo"] = {{"ranks_with_own_parameters", env.ranks_with_own_parameters}};
  }
};

const lab::ParallelMode& solo() {
  static const lab::ParallelMode* m = [] {
    if (!lab::find_mode("solo")) lab::register_mode(std::make_unique<SoloMode>());
    return lab::find_mode("solo");
  }();
  return *m;
}

}  // namespace

TEST(ModeRegistry, ABuiltInNameCannotBeTakenTwice) {
  solo();
  EXPECT_THROW(lab::register_mode(std::make_unique<SoloMode>()), lab::ConfigError);
  EXPECT_NE(lab::mode_names().find("solo"), std::string::npos) << lab::mode_names();
  EXPECT_EQ(lab::modes_with(&lab::ModeCaps::checkpoints).find("async"), std::string::npos);
  EXPECT_NE(lab::modes_with(&lab::ModeCaps::checkpoints).find("solo"), std::string::npos);
}

TEST(ModeRegistry, AnUnknownModeIsRefusedNamingTheKnownOnes) {
  lab::RunConfig c;
  c.mode = "sollo";
  try {
    lab::validate(c);
    FAIL() << "--mode sollo was accepted";
  } catch (const lab::ConfigError& e) {
    const std::string what = std::string(e.what()) + "\n" + e.hint();
    EXPECT_NE(what.find("--mode"), std::string::npos) << what;
    EXPECT_NE(what.find("ddp"), std::string::npos) << what;
  }
}

// What a lesson's run line and the CLI go through: CLI11's definitions, then lab::validate.
TEST(ModeRegistry, TheCliAndALessonsRunsAcceptARegisteredModeAndApplyItsCapabilities) {
  solo();
  const commands::CommandSpec spec = commands::parse_command("run", {"--mode", "solo", "--world-size", "2", "--steps", "3"});
  EXPECT_EQ(spec.run.mode, "solo");
  // A capability the mode lacks refuses the flag by the general rule, naming the modes that have it.
  try {
    commands::parse_command("run", {"--mode", "solo", "--world-size", "2", "--bn", "sync"});
    FAIL() << "--bn sync was accepted by a mode without SyncBatchNorm";
  } catch (const lab::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("solo"), std::string::npos) << e.what();
  }
  // DDP's own settings have no effect here, and the rules say so.
  lab::RunConfig c = spec.run;
  c.bucket_cap_mb = 1;
  bool named = false;
  for (const lab::IneffectiveSetting& s : lab::ineffective_settings(c)) named = named || s.setting == "bucket_cap_mb";
  EXPECT_TRUE(named) << "--bucket-cap-mb under a mode without gradient allreduce was not named as without effect";
}

TEST(ModeRegistry, TheAppsSettingsModelOffersAndDescribesIt) {
  solo();
  lab::RunConfig c;
  c.world_size = 2;
  ASSERT_TRUE(viz::apply_choice(c, "mode", "solo"));
  EXPECT_EQ(viz::setting_value(c, "mode"), "solo");
  EXPECT_EQ(viz::describe_parallelism(c), "solo, 2 independent ranks");
  EXPECT_NE(viz::unavailable_reason(c, "bn", "sync"), "") << "sync BN offered to a mode without SyncBatchNorm";
  for (const viz::SettingCheck& k : viz::check_settings(c, 1024))
    EXPECT_NE(k.severity, viz::Severity::Error) << k.setting << ": " << k.message;
}

// Run drives it through the generic rank loop: one rank of solo is one rank of DDP bit for bit
// (DDP with one rank exchanges nothing), and with two ranks each keeps its own parameters.
TEST(ModeRegistry, RunTrainsItAndItsSummaryAndCheckpointsWork) {
  DTLAB_REQUIRE_DATASET();
  solo();
  testutil::TempDir one_ddp, one_solo, two_solo, resumed;
  lab::RunConfig c = testutil::small_run("mlp", 1, one_ddp.path(), 4);
  lab::Run(c, lab::make_world).run();
  c.mode = "solo";
  c.out_dir = one_solo.path();
  lab::Run(c, lab::make_world).run();
  EXPECT_EQ(testutil::read_file(one_ddp.file("final.safetensors")), testutil::read_file(one_solo.file("final.safetensors")))
      << "one rank of solo is not one rank of DDP";

  c.world_size = 2;
  c.out_dir = two_solo.path();
  c.checkpoint_every = 2;
  lab::Run(c, lab::make_world).run();
  const nlohmann::json s = nlohmann::json::parse(testutil::read_file(two_solo.file("summary.json")));
  ASSERT_TRUE(s.contains("solo")) << s.dump(1);
  EXPECT_EQ(s["solo"]["ranks_with_own_parameters"], nlohmann::json::array({1}));
  EXPECT_FALSE(s.contains("ddp")) << "DDP's section in a mode without buckets";
  const std::string final_two = testutil::read_file(two_solo.file("final.safetensors"));

  // Resumed from step 2 (the newer checkpoints removed), the run ends where the uninterrupted one
  // did: the mode's own counter came back from the checkpoint with the model and the optimizer.
  namespace fs = std::filesystem;
  ASSERT_TRUE(fs::exists(two_solo.path() + "/checkpoints/step-00000002")) << "no checkpoint at step 2";
  for (const auto& e : fs::directory_iterator(two_solo.path() + "/checkpoints"))
    if (e.path().filename().string() > "step-00000002") fs::remove_all(e.path());
  lab::Run(commands::parse_command("run", {"--resume", two_solo.path(), "--out", resumed.path()}).run, lab::make_world).run();
  EXPECT_EQ(final_two, testutil::read_file(resumed.file("final.safetensors")));
  const nlohmann::json rank1 =
      nlohmann::json::parse(testutil::read_file(resumed.path() + "/checkpoints/step-00000002/rank1.json"));
  EXPECT_EQ(rank1.value("solo_steps", int64_t{-1}), 2) << rank1.dump(1);
}
