// --lr-schedule: PyTorch's CosineAnnealingLR and StepLR rates to the last bit (fixtures from
// tools/fixtures/gen_lr.py), and a run that really trains with them.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>

#include "backends.h"
#include "config.h"
#include "errors.h"
#include "lr_schedule.h"
#include "run.h"
#include "safetensors.h"
#include "test_util.h"

namespace {

TEST(LrSchedule, RatesArePyTorchsBitForBit) {
  const auto fx = testutil::load_fixture("lr_schedule.json");
  for (const auto& [name, c] : fx["cases"].items()) {
    lab::LrScheduleOptions o;
    o.kind = c["kind"];
    o.lr = c["lr"];
    if (o.kind == "cosine") {
      o.t_max = c["t_max"];
      o.eta_min = c["eta_min"];
    } else {
      o.step_size = c["step_size"];
      o.gamma = c["gamma"];
    }
    lab::LrSchedule s(o);
    int epoch = 0;
    for (const auto& want : c["lr_per_epoch"]) {
      // repr() of a Python float reads back as exactly that double.
      const double torch_lr = std::strtod(want.get<std::string>().c_str(), nullptr);
      EXPECT_EQ(s.lr(), torch_lr) << name << " epoch " << epoch;
      s.step();
      ++epoch;
    }
  }
}

TEST(LrSchedule, ConstantNeverChanges) {
  lab::LrScheduleOptions o;
  o.lr = 0.07;
  lab::LrSchedule s(o);
  for (int i = 0; i < 5; ++i, s.step()) EXPECT_EQ(s.lr(), 0.07);
}

TEST(LrSchedule, BadValuesNameTheFlag) {
  lab::RunConfig c;
  c.lr_schedule = "linear";
  try {
    lab::validate(c);
    FAIL() << "accepted --lr-schedule linear";
  } catch (const lab::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("--lr-schedule"), std::string::npos) << e.what();
  }
  c.lr_schedule = "step";
  c.lr_step_size = 0;
  EXPECT_THROW(lab::validate(c), lab::ConfigError);
  c.lr_step_size = 2;
  c.lr_gamma = 0;
  EXPECT_THROW(lab::validate(c), lab::ConfigError);
}

// With momentum 0 and no shuffling SGD carries nothing from one epoch to the next but the
// weights and the BatchNorm buffers, which --init restores: two epochs of StepLR(1, 0.5) from lr
// L must equal one epoch at L, then one epoch at L/2 started from its final weights, bit for bit.
TEST(LrSchedule, TwoEpochsOfStepLrEqualTwoRunsAtTheirRates) {
  DTLAB_REQUIRE_DATASET();
  testutil::TempDir both, first, second;
  auto base = [](const std::string& out) {
    lab::RunConfig c = testutil::small_run("mlp", 2, out, 0);
    c.epochs = 1;
    c.shuffle = false;
    c.momentum = 0;
    c.lr = 0.1;
    return c;
  };
  lab::RunConfig a = base(both.path());
  a.epochs = 2;
  a.lr_schedule = "step";
  a.lr_step_size = 1;
  a.lr_gamma = 0.5;
  lab::Run(a, lab::make_world).run();

  lab::Run(base(first.path()), lab::make_world).run();
  lab::RunConfig b = base(second.path());
  b.lr = 0.05;
  b.init = first.file("final.safetensors");
  lab::Run(b, lab::make_world).run();

  EXPECT_EQ(testutil::read_file(both.file("final.safetensors")), testutil::read_file(second.file("final.safetensors")));
  // A run at the constant rate ends elsewhere: the schedule was applied.
  testutil::TempDir constant;
  lab::RunConfig k = base(constant.path());
  k.epochs = 2;
  lab::Run(k, lab::make_world).run();
  EXPECT_NE(testutil::read_file(constant.file("final.safetensors")), testutil::read_file(both.file("final.safetensors")));
  // metrics.jsonl records each epoch's rate.
  std::ifstream m(both.file("metrics.jsonl"));
  std::vector<double> lrs;
  for (std::string line; std::getline(m, line);) {
    const auto j = nlohmann::json::parse(line);
    if (j["kind"] == "epoch") lrs.push_back(j["lr"]);
  }
  EXPECT_EQ(lrs, (std::vector<double>{0.1, 0.05}));
}

TEST(LrSchedule, ConfigTomlKeepsTheSchedule) {
  lab::RunConfig c;
  c.lr_schedule = "cosine";
  c.lr_t_max = 7;
  c.lr_min = 0.001;
  testutil::TempDir tmp;
  std::ofstream(tmp.file("config.toml")) << lab::to_toml(c, {});
  const lab::RunConfig r = lab::config_from_toml_file(tmp.file("config.toml"));
  EXPECT_EQ(r.lr_schedule, "cosine");
  EXPECT_EQ(r.lr_t_max, 7);
  EXPECT_EQ(r.lr_min, 0.001);
}

}  // namespace
