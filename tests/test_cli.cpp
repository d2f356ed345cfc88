// The dtlab executable: bad input gets a clear error naming the flag, file or value, and the
// documented exit code (README, `dtlab --help`).
#include <gtest/gtest.h>
#include <zlib.h>

#include <filesystem>
#include <fstream>

#include "errors.h"
#include "test_util.h"

using testutil::run_cli;

namespace {

bool contains(const std::string& s, const std::string& what) { return s.find(what) != std::string::npos; }

}  // namespace

TEST(Cli, HelpExplainsEveryFlagAndExitCodes) {
  const auto r = run_cli("run --help");
  EXPECT_EQ(r.exit_code, 0) << r.out;
  for (const char* flag : {"--model", "--world-size", "--batch-size", "--epochs", "--steps", "--lr", "--momentum",
                           "--weight-decay", "--seed", "--threads", "--out", "--init", "--bn", "--bucket-cap-mb",
                           "--no-broadcast-buffers", "--drop-last", "--sampler-drop-last", "--no-shuffle",
                           "--data-dir", "--limit-train", "--limit-test", "--timeout"})
    EXPECT_TRUE(contains(r.out, flag)) << flag;
  const auto top = run_cli("--help");
  EXPECT_EQ(top.exit_code, 0);
  EXPECT_TRUE(contains(top.out, "Exit codes")) << top.out;
}

TEST(Cli, BadSettingsExitWithUsageCode) {
  auto r = run_cli("run --batch-size 0");
  EXPECT_EQ(r.exit_code, lab::kExitUsage) << r.out;
  EXPECT_TRUE(contains(r.out, "batch_size should be a positive integer value, but got batch_size=0")) << r.out;
  r = run_cli("run --world-size 0");
  EXPECT_EQ(r.exit_code, lab::kExitUsage) << r.out;
  EXPECT_TRUE(contains(r.out, "world size must be at least 1")) << r.out;
  r = run_cli("run --world-size 65");
  EXPECT_EQ(r.exit_code, lab::kExitUsage) << r.out;
  EXPECT_TRUE(contains(r.out, "--world-size")) << r.out;
  r = run_cli("run --bn bogus");
  EXPECT_EQ(r.exit_code, lab::kExitUsage) << r.out;
  EXPECT_TRUE(contains(r.out, "bogus")) << r.out;
  r = run_cli("run --bn-momentum fast");
  EXPECT_EQ(r.exit_code, lab::kExitUsage) << r.out;
  r = run_cli("run --no-such-flag");
  EXPECT_EQ(r.exit_code, lab::kExitUsage) << r.out;
  r = run_cli("run --world-size 4 --fail-rank 4");
  EXPECT_EQ(r.exit_code, lab::kExitUsage) << r.out;
  EXPECT_TRUE(contains(r.out, "Invalid rank 4, rank should be in the interval [0, 3]")) << r.out;
}

TEST(Cli, MissingDatasetSaysWhereAndHowToInstall) {
  testutil::TempDir d;
  const auto r = run_cli("run --data-dir " + d.file("nowhere"));
  EXPECT_EQ(r.exit_code, lab::kExitData) << r.out;
  EXPECT_TRUE(contains(r.out, d.file("nowhere"))) << r.out;
}

TEST(Cli, CorruptDatasetFileIsNamedBeforeTraining) {
  DTLAB_REQUIRE_DATASET();
  testutil::TempDir d;
  for (const char* f : {"train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz", "t10k-images-idx3-ubyte.gz",
                        "t10k-labels-idx1-ubyte.gz"})
    std::filesystem::copy_file(std::string(lab::kDefaultDataDir) + "/" + f, d.file(f));
  // Not gzip at all.
  std::ofstream(d.file("t10k-labels-idx1-ubyte.gz"), std::ios::trunc) << "this is not a gzip file";
  auto r = run_cli("run --data-dir " + d.path() + " --out " + d.file("run"));
  EXPECT_EQ(r.exit_code, lab::kExitData) << r.out;
  EXPECT_TRUE(contains(r.out, "t10k-labels-idx1-ubyte.gz")) << r.out;
  EXPECT_FALSE(contains(r.out, "epoch 1")) << "no training may start";
  // A valid gzip whose payload is truncated.
  gzFile g = gzopen(d.file("t10k-labels-idx1-ubyte.gz").c_str(), "wb");
  const unsigned char header[8] = {0, 0, 8, 1, 0, 0, 0x27, 0x10};  // magic 2049, 10000 labels
  gzwrite(g, header, 8);
  gzwrite(g, "\1\2\3", 3);
  gzclose(g);
  r = run_cli("run --data-dir " + d.path());
  EXPECT_EQ(r.exit_code, lab::kExitData) << r.out;
  EXPECT_TRUE(contains(r.out, "t10k-labels-idx1-ubyte.gz")) << r.out;
}

TEST(Cli, UnwritableOutIsAnIoError) {
  DTLAB_REQUIRE_DATASET();
  testutil::TempDir d;
  std::ofstream(d.file("a-file")) << "x";
  const auto r = run_cli("run --limit-train 64 --limit-test 16 --steps 1 --out " + d.file("a-file") + "/run");
  EXPECT_EQ(r.exit_code, lab::kExitIo) << r.out;
  EXPECT_TRUE(contains(r.out, "--out")) << r.out;
  EXPECT_TRUE(contains(r.out, d.file("a-file"))) << r.out;
}

TEST(Cli, ShortRunWritesARunDirectory) {
  DTLAB_REQUIRE_DATASET();
  testutil::TempDir d;
  const auto r = run_cli("run --model mlp --world-size 2 --batch-size 16 --limit-train 128 --limit-test 32 --out " +
                         d.file("run"));
  EXPECT_EQ(r.exit_code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "world_size=2")) << r.out;            // the header echoes the config
  EXPECT_TRUE(contains(r.out, "epoch 1/1")) << r.out;               // one line per epoch (not a TTY)
  EXPECT_TRUE(contains(r.out, "test accuracy")) << r.out;
  EXPECT_TRUE(std::filesystem::exists(d.file("run/final.safetensors")));
}

TEST(Cli, BatchOfOneExitsWithTrainingCodeAndHint) {
  DTLAB_REQUIRE_DATASET();
  const auto r = run_cli("run --model mlp --batch-size 16 --limit-train 33 --limit-test 16");
  EXPECT_EQ(r.exit_code, lab::kExitTraining) << r.out;
  EXPECT_TRUE(contains(r.out, "Expected more than 1 value per channel when training")) << r.out;
  EXPECT_TRUE(contains(r.out, "hint:")) << r.out;
}

TEST(Cli, InjectedFailureExitsAndNamesTheRank) {
  DTLAB_REQUIRE_DATASET();
  const auto r = run_cli("run --model mlp --world-size 3 --batch-size 16 --limit-train 256 --limit-test 16 "
                         "--fail-rank 1 --fail-step 2 --fail-at allreduce --timeout 10");
  EXPECT_EQ(r.exit_code, lab::kExitTraining) << r.out;
  EXPECT_TRUE(contains(r.out, "rank 1 failed")) << r.out;
}

TEST(Cli, AFlagGivenTwiceTakesTheLastValue) {
  DTLAB_REQUIRE_DATASET();
  testutil::TempDir d;
  const auto r = run_cli("run --model cnn --model mlp --epochs 3 --epochs 1 --batch-size 16 --limit-train 64 "
                         "--limit-test 16 --out " + d.file("run"));
  EXPECT_EQ(r.exit_code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "model=mlp")) << r.out;
  EXPECT_TRUE(contains(r.out, "epochs=1")) << r.out;
}

// A setting that has no effect in its configuration is named with the reason (lab/core/
// config_effects.h), and the run goes on.
TEST(Cli, ASettingWithoutEffectIsWarnedAbout) {
  DTLAB_REQUIRE_DATASET();
  const auto r = run_cli("run --model mlp --batch-size 16 --limit-train 64 --limit-test 16 --steps 1 --lr-t-max 5 "
                         "--world-size 2 --threads 2");
  EXPECT_EQ(r.exit_code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "dtlab: warning: --lr-t-max 5 has no effect: --lr-schedule is constant (it applies to cosine)"))
      << r.out;
  EXPECT_TRUE(contains(r.out, "dtlab: warning: --threads 2 has no effect: each of the 2 ranks computes on one thread"))
      << r.out;
  // the same value where it applies: nothing to say
  const auto ok = run_cli("run --model mlp --batch-size 16 --limit-train 64 --limit-test 16 --steps 1 --lr-t-max 5 "
                          "--lr-schedule cosine");
  EXPECT_EQ(ok.exit_code, 0) << ok.out;
  EXPECT_FALSE(contains(ok.out, "warning")) << ok.out;
  // bench train: --threads with several ranks, in the same words
  const auto b = run_cli("bench train --model mlp --world-size 2 --threads 2 --batch-size 8 --seconds 0.01 --rounds 1");
  EXPECT_EQ(b.exit_code, 0) << b.out;
  EXPECT_TRUE(contains(b.out, "dtlab: warning: --threads 2 has no effect: each of the 2 ranks computes on one thread"))
      << b.out;
}

// --nondeterministic where it can change nothing is refused before any training, saying why and
// what would make it take effect; where it runs, the header says what it does.
TEST(Cli, NondeterministicWithoutEffectIsRefusedAndOtherwiseDescribed) {
  auto r = run_cli("run --model mlp --world-size 4 --batch-size 2 --nondeterministic");
  EXPECT_EQ(r.exit_code, lab::kExitUsage) << r.out;
  EXPECT_TRUE(contains(r.out, "dtlab: error: --nondeterministic has no effect: every gradient sum of the mlp")) << r.out;
  EXPECT_TRUE(contains(r.out, "two runs would be bitwise equal")) << r.out;
  EXPECT_TRUE(contains(r.out, "hint: three contributions are the fewest")) << r.out;
  r = run_cli("run --model mlp --fail-step 3");
  EXPECT_EQ(r.exit_code, lab::kExitUsage) << r.out;
  EXPECT_TRUE(contains(r.out, "--fail-step 3 has no effect: no rank is told to fail")) << r.out;
  DTLAB_REQUIRE_DATASET();
  // the configuration of issue 19: twice, different weights
  testutil::TempDir d;
  const std::string cmd = "run --model cnn --world-size 4 --batch-size 16 --steps 3 --limit-train 2000 --limit-test 16 "
                          "--bn sync --seed 2 --nondeterministic --out ";
  r = run_cli(cmd + d.file("a"));
  EXPECT_EQ(r.exit_code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "nondeterministic=on (the gradient sums over the batch (Conv2d's weights")) << r.out;
  EXPECT_FALSE(contains(r.out, "warning")) << r.out;
  const auto r2 = run_cli(cmd + d.file("b"));
  EXPECT_EQ(r2.exit_code, 0) << r2.out;
  EXPECT_NE(testutil::read_file(d.file("a/final.safetensors")), testutil::read_file(d.file("b/final.safetensors")));
}
