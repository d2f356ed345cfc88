// The rules of lab/core/config_effects.h: which settings have no effect in a configuration, which
// of those validate() refuses, and that the lab window, the CLI and bench train say the same.
#include <gtest/gtest.h>

#include <functional>

#include "bench_train.h"
#include "config_effects.h"
#include "errors.h"
#include "settings_check.h"

namespace {

bool has(const std::string& s, const std::string& what) { return s.find(what) != std::string::npos; }

const lab::IneffectiveSetting* find(const std::vector<lab::IneffectiveSetting>& v, const std::string& setting) {
  for (const auto& e : v)
    if (e.setting == setting) return &e;
  return nullptr;
}

// validate()'s message and hint, or "" when it accepts c.
std::string refusal(const lab::RunConfig& c) {
  try {
    lab::validate(c);
  } catch (const lab::ConfigError& e) {
    return std::string(e.what()) + " | hint: " + e.hint();
  }
  return "";
}

}  // namespace

TEST(ConfigEffects, DefaultsHaveNothingToSay) {
  EXPECT_TRUE(lab::ineffective_settings(lab::RunConfig{}).empty());
  // a setting equal to its default is not reported, even where it would have no effect
  lab::RunConfig c;
  c.world_size = 1;
  c.mode = "ddp";
  EXPECT_TRUE(lab::ineffective_settings(c).empty());
  // nor a value that asks for what the configuration does anyway: one thread per rank
  c.world_size = 4;
  c.threads = 1;
  EXPECT_TRUE(lab::ineffective_settings(c).empty());
}

// Each warning: a non-default value in a configuration that ignores it is reported by name, with
// the flag as typed and the reason; validate() accepts the run. The same value where it applies
// is not reported.
TEST(ConfigEffects, EveryWarnedSettingNamesItsFlagAndItsReason) {
  struct Case {
    std::string setting;
    std::function<void(lab::RunConfig&)> set;       // the non-default value, in a configuration that ignores it
    std::string message;                            // expected in IneffectiveSetting::message()
    std::function<void(lab::RunConfig&)> applies;   // a change that gives it an effect
  };
  const std::vector<Case> cases = {
      {"lr_t_max", [](lab::RunConfig& c) { c.lr_t_max = 5; },
       "--lr-t-max 5 has no effect: --lr-schedule is constant (it applies to cosine)",
       [](lab::RunConfig& c) { c.lr_schedule = "cosine"; }},
      {"lr_min", [](lab::RunConfig& c) { c.lr_min = 0.001; }, "--lr-min 0.001 has no effect: --lr-schedule is constant",
       [](lab::RunConfig& c) { c.lr_schedule = "cosine"; }},
      {"lr_step_size", [](lab::RunConfig& c) { c.lr_step_size = 3; c.lr_schedule = "cosine"; },
       "--lr-step-size 3 has no effect: --lr-schedule is cosine (it applies to step)",
       [](lab::RunConfig& c) { c.lr_schedule = "step"; }},
      {"lr_gamma", [](lab::RunConfig& c) { c.lr_gamma = 0.5; }, "--lr-gamma 0.5 has no effect",
       [](lab::RunConfig& c) { c.lr_schedule = "step"; }},
      {"average_every", [](lab::RunConfig& c) { c.average_every = 8; },
       "--average-every 8 has no effect: a setting of --mode local-sgd", [](lab::RunConfig& c) {
         c.mode = "local-sgd";
         c.world_size = 4;
       }},
      {"warmup_steps", [](lab::RunConfig& c) { c.warmup_steps = 2; c.mode = "local-sgd"; },
       "--warmup-steps 2 has no effect: with one rank there is nothing to average",
       [](lab::RunConfig& c) { c.world_size = 2; }},
      {"async_schedule", [](lab::RunConfig& c) { c.async_schedule = "seeded"; },
       "--async-schedule seeded has no effect: a setting of --mode async", [](lab::RunConfig& c) {
         c.mode = "async";
         c.world_size = 2;
       }},
      {"async_seed", [](lab::RunConfig& c) { c.async_seed = 7; c.mode = "async"; c.world_size = 2; },
       "--async-seed 7 has no effect: --async-schedule is free (it applies to seeded)",
       [](lab::RunConfig& c) { c.async_schedule = "seeded"; }},
      {"link_latency_us", [](lab::RunConfig& c) { c.link_latency_us = 20; },
       "--link-latency-us 20 has no effect: with one rank there are no messages", [](lab::RunConfig& c) {
         c.world_size = 2;
       }},
      {"link_gbps", [](lab::RunConfig& c) { c.link_gbps = 1; c.mode = "dp"; }, "--link-gbps 1 has no effect",
       [](lab::RunConfig& c) { c.world_size = 2; }},
      {"eval_samples", [](lab::RunConfig& c) { c.eval_samples = 200; },
       "--eval-samples 200 has no effect: --eval-every is 0 (off)", [](lab::RunConfig& c) { c.eval_every = 4; }},
      {"overlap", [](lab::RunConfig& c) { c.overlap = false; },
       "--no-overlap has no effect: with one rank there is no allreduce", [](lab::RunConfig& c) { c.world_size = 2; }},
      {"overlap", [](lab::RunConfig& c) { c.overlap = false; c.world_size = 4; c.mode = "local-sgd"; },
       "--no-overlap has no effect: --mode local-sgd with --warmup-steps 0 never allreduces gradients",
       [](lab::RunConfig& c) { c.warmup_steps = 2; }},
      {"allreduce", [](lab::RunConfig& c) { c.allreduce = "tree"; c.world_size = 4; c.mode = "dp"; },
       "--allreduce tree has no effect: DataParallel has no allreduce", [](lab::RunConfig& c) { c.mode = "ddp"; }},
      {"bucket_cap_mb", [](lab::RunConfig& c) { c.bucket_cap_mb = 1; }, "--bucket-cap-mb 1 has no effect",
       [](lab::RunConfig& c) { c.world_size = 2; }},
      {"broadcast_buffers", [](lab::RunConfig& c) { c.broadcast_buffers = false; c.world_size = 2; c.track_running_stats = false; },
       "--no-broadcast-buffers has no effect: BatchNorm keeps no running statistics",
       [](lab::RunConfig& c) { c.track_running_stats = true; }},
      {"bn", [](lab::RunConfig& c) { c.bn = "sync"; },
       "--bn sync has no effect: with one rank the global batch is the only rank's batch",
       [](lab::RunConfig& c) { c.world_size = 2; }},
      {"bn_momentum", [](lab::RunConfig& c) { c.bn_momentum.reset(); c.track_running_stats = false; },
       "--bn-momentum none has no effect", [](lab::RunConfig& c) { c.track_running_stats = true; }},
      {"threads", [](lab::RunConfig& c) { c.threads = 2; c.world_size = 4; },
       "--threads 2 has no effect: each of the 4 ranks computes on one thread of its own",
       [](lab::RunConfig& c) { c.world_size = 1; }},
      {"trace_steps", [](lab::RunConfig& c) { c.trace_steps = -1; },
       "--trace-steps -1 has no effect: there is no run directory to write it into: give --out DIR",
       [](lab::RunConfig& c) { c.out_dir = "/tmp/x"; }},
      {"record_bn", [](lab::RunConfig& c) { c.record_bn = "all"; }, "--record-bn all has no effect",
       [](lab::RunConfig& c) { c.out_dir = "/tmp/x"; }},
      {"sampler_drop_last", [](lab::RunConfig& c) { c.sampler_drop_last = true; },
       "--sampler-drop-last has no effect: with one rank", [](lab::RunConfig& c) { c.world_size = 2; }},
      {"uneven_data", [](lab::RunConfig& c) { c.uneven_data = true; }, "--uneven-data has no effect: with one rank",
       [](lab::RunConfig& c) { c.world_size = 2; }},
      {"join", [](lab::RunConfig& c) { c.join = true; }, "--join has no effect: with one rank",
       [](lab::RunConfig& c) { c.world_size = 2; }},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(k.setting + ": " + k.message);
    lab::RunConfig c;
    c.world_size = 1;
    k.set(c);
    ASSERT_EQ(refusal(c), "") << "a warning, not a refusal";
    const auto none = lab::ineffective_settings(c);
    const lab::IneffectiveSetting* e = find(none, k.setting);
    ASSERT_NE(e, nullptr);
    EXPECT_FALSE(e->refused);
    EXPECT_TRUE(has(e->message(), k.message)) << e->message();
    EXPECT_EQ(none.size(), 1u) << none.back().message();
    // the controls grey the setting out with the same reason
    EXPECT_EQ(lab::no_effect_reason(c, k.setting), e->reason);
    k.applies(c);
    EXPECT_EQ(find(lab::ineffective_settings(c), k.setting), nullptr) << "it takes effect after the change";
  }
}

// Failure injection that can never fire is refused: the user asked to see a failure.
TEST(ConfigEffects, FailureInjectionThatCannotFireIsRefused) {
  lab::RunConfig c;
  c.world_size = 4;
  c.fail_step = 3;
  std::string why = refusal(c);
  EXPECT_TRUE(has(why, "--fail-step 3 has no effect: no rank is told to fail")) << why;
  EXPECT_TRUE(has(why, "hint: give --fail-rank R")) << why;
  c.fail_step = -1;
  c.fail_at = "hang";
  EXPECT_TRUE(has(refusal(c), "--fail-at hang has no effect")) << refusal(c);
  c.fail_rank = 1;
  EXPECT_EQ(refusal(c), "");
  c.steps = 5;
  c.fail_step = 5;
  EXPECT_TRUE(has(refusal(c), "--steps 5 ends the run before iteration 5")) << refusal(c);
  c.fail_step = 4;
  EXPECT_EQ(refusal(c), "");
  c.fail_at = "allreduce";
  c.mode = "local-sgd";
  c.warmup_steps = 2;
  EXPECT_TRUE(has(refusal(c), "allreduces gradients only in its first --warmup-steps 2 iterations")) << refusal(c);
  c.mode = "ddp";
  c.no_sync_steps = 1;  // iterations 1, 3, 5 synchronize
  EXPECT_TRUE(has(refusal(c), "iteration 4 runs under no_sync")) << refusal(c);
  c.fail_step = 3;
  EXPECT_EQ(refusal(c), "");
  c = lab::RunConfig{};
  c.fail_rank = 0;
  c.fail_at = "allreduce";
  EXPECT_TRUE(has(refusal(c), "with one rank there is no gradient allreduce")) << refusal(c);
}

// Which reductions --nondeterministic can reorder: the mlp sums over the rank's samples only, so
// a local batch of two leaves nothing to reorder (a + b == b + a); the cnn's sums also run over
// the image's positions.
TEST(ConfigEffects, NondeterministicIsRefusedWhereEverySumHasTwoContributions) {
  lab::RunConfig c;
  c.model = "mlp";
  c.world_size = 4;
  c.batch_size = 2;
  c.nondeterministic = true;
  std::string why = refusal(c);
  EXPECT_TRUE(has(why, "--nondeterministic has no effect: every gradient sum of the mlp")) << why;
  EXPECT_TRUE(has(why, "at most 2 here")) << why;
  EXPECT_TRUE(has(why, "a + b == b + a")) << why;
  EXPECT_TRUE(has(why, "hint: three contributions are the fewest")) << why;
  EXPECT_TRUE(has(why, "--batch-size 3 or more")) << why;
  c.batch_size = 3;
  EXPECT_EQ(refusal(c), "");
  EXPECT_TRUE(lab::nondeterministic_no_effect(c).empty());
  c.batch_size = 1;
  c.model = "cnn";  // 28 x 28 positions per sample: a batch of one still has many contributions
  EXPECT_EQ(refusal(c), "");
  // the rank's share of --limit-train is its largest batch: 8 samples over 4 ranks
  c.model = "mlp";
  c.batch_size = 16;
  c.limit_train = 8;
  EXPECT_EQ(lab::largest_local_batch(c), 2);
  EXPECT_TRUE(has(refusal(c), "at most 2 here")) << refusal(c);
  c.limit_train = 12;
  EXPECT_EQ(refusal(c), "");
  // DataParallel chunks the global batch: 8 over 4 devices is 2 each; 9 is 3, 3, 3
  c = lab::RunConfig{};
  c.model = "mlp";
  c.mode = "dp";
  c.world_size = 4;
  c.batch_size = 8;
  c.nondeterministic = true;
  why = refusal(c);
  EXPECT_TRUE(has(why, "--mode dp chunks the global batch of 8 over 4 devices")) << why;
  EXPECT_TRUE(has(why, "a global --batch-size of at least 9")) << why;
  c.batch_size = 9;
  EXPECT_EQ(refusal(c), "");
  // the naive allreduce's gather over 3 or more ranks may still reorder: a warning, not a refusal
  c = lab::RunConfig{};
  c.model = "mlp";
  c.world_size = 4;
  c.batch_size = 2;
  c.allreduce = "naive";
  c.nondeterministic = true;
  EXPECT_EQ(refusal(c), "");
  const auto none = lab::ineffective_settings(c);
  const lab::IneffectiveSetting* e = find(none, "nondeterministic");
  ASSERT_NE(e, nullptr);
  EXPECT_FALSE(e->refused);
  EXPECT_TRUE(has(e->message(), "--nondeterministic may have no effect:")) << e->message();
  EXPECT_TRUE(has(e->message(), "which timing alone decides: two runs may be bitwise equal")) << e->message();
  c.world_size = 2;  // two buffers on rank 0: x0 + x1 either way
  EXPECT_TRUE(has(refusal(c), "two runs would be bitwise equal")) << refusal(c);
}

TEST(ConfigEffects, TheHeaderSaysWhatNondeterministicDoesHere) {
  lab::RunConfig c;
  c.model = "cnn";
  c.nondeterministic = true;
  std::string d = lab::describe_nondeterministic(c);
  EXPECT_TRUE(has(d, "Conv2d's weights, BatchNorm2d's sums, Linear's weights and biases")) << d;
  EXPECT_TRUE(has(d, "in an order drawn per call")) << d;
  EXPECT_TRUE(has(d, "with several compute threads Conv2d adds each sample's weight gradient atomically")) << d;
  c.threads = 1;
  EXPECT_FALSE(has(lab::describe_nondeterministic(c), "atomically"));
  c.model = "mlp";
  c.world_size = 4;
  c.allreduce = "naive";
  d = lab::describe_nondeterministic(c);
  EXPECT_TRUE(has(d, "Linear's weights and biases, BatchNorm1d's sums")) << d;
  EXPECT_TRUE(has(d, "the naive allreduce adds the ranks' buffers on rank 0 in arrival order")) << d;
}

// One set of rules: the lab window's notes are the CLI's warnings, word for word, and its
// greyed-out controls give the same reason.
TEST(ConfigEffects, TheLabWindowSaysWhatTheCliSays) {
  lab::RunConfig c;
  c.model = "mlp";
  c.world_size = 1;
  c.bn = "sync";
  c.overlap = false;
  c.lr_t_max = 3;
  const auto none = lab::ineffective_settings(c);
  ASSERT_EQ(none.size(), 3u);
  const auto checks = viz::check_settings(c, 60000);
  for (const auto& e : none) {
    const viz::SettingCheck* n = viz::find_check(checks, e.setting, viz::Severity::Note);
    ASSERT_NE(n, nullptr) << e.setting;
    EXPECT_EQ(n->message, e.message());
  }
  EXPECT_EQ(viz::unavailable_reason(c, "overlap", "true"), lab::no_effect_reason(c, "overlap"));
}

TEST(ConfigEffects, BenchTrainWarnsWithTheSameRules) {
  lab::BenchTrainOptions o;
  EXPECT_TRUE(lab::bench_train_ineffective(o).empty());
  o.world_size = 4;
  o.threads = 2;
  auto none = lab::bench_train_ineffective(o);
  ASSERT_EQ(none.size(), 1u);
  lab::RunConfig c;
  c.world_size = 4;
  c.threads = 2;
  EXPECT_EQ(none[0].message(), find(lab::ineffective_settings(c), "threads")->message());
  o = lab::BenchTrainOptions{};
  o.per_sample_bn = "train";
  none = lab::bench_train_ineffective(o);
  ASSERT_EQ(none.size(), 1u);
  EXPECT_TRUE(has(none[0].message(), "--per-sample-bn train has no effect")) << none[0].message();
  o.per_sample = true;
  EXPECT_TRUE(lab::bench_train_ineffective(o).empty());
  o = lab::BenchTrainOptions{};
  o.batch_size = 32;
  o.batch_sizes = {2, 8};
  none = lab::bench_train_ineffective(o);
  ASSERT_EQ(none.size(), 1u);
  EXPECT_TRUE(has(none[0].message(), "--batch-size 32 has no effect: --batch-sizes runs the sweep")) << none[0].message();
}

// A finished run's config.toml opens (the app, dtlab eval --run) even with a setting validate()
// now refuses; starting a run from it (--resume) is refused.
TEST(ConfigEffects, AFinishedRunsConfigurationStillOpens) {
  lab::RunConfig c;
  c.fail_step = 3;
  const lab::RunConfig back = lab::config_from_toml(lab::to_toml(c, {}), "config.toml");
  EXPECT_EQ(back.fail_step, 3);
  EXPECT_THROW(lab::validate(back), lab::ConfigError);
}
