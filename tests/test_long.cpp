// Long runs on the full dataset (label "long": `ctest -L long` or `tools/test.sh --long`).
#include <gtest/gtest.h>

#include "backends.h"
#include "run.h"
#include "test_util.h"

namespace {

lab::RunSummary full_run(const std::string& model) {
  lab::RunConfig c;
  c.model = model;
  c.world_size = 4;
  c.batch_size = 32;
  c.bn = "sync";
  c.epochs = 3;
  return lab::Run(c, lab::make_world).run();
}

}  // namespace

// The acceptance runs: `dtlab run --model cnn --world-size 4 --batch-size 32 --bn sync
// --epochs 3` reaches 0.90 test accuracy in eval mode; the mlp 0.87.
TEST(LongAccuracy, CnnFourRanksSyncBn) {
  DTLAB_REQUIRE_DATASET();
  const auto s = full_run("cnn");
  EXPECT_GE(s.eval_mode.acc, 0.90);
}

TEST(LongAccuracy, MlpFourRanksSyncBn) {
  DTLAB_REQUIRE_DATASET();
  const auto s = full_run("mlp");
  EXPECT_GE(s.eval_mode.acc, 0.87);
}
