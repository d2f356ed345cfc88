// --mode fsdp: FullyShardedDataParallel (lab/modes/fsdp.h, mode_fsdp.cpp). The flat parameters,
// shards, padding and gradient scaling are PyTorch's (PARALLELISM.md's facts, measured on 1.13
// and read from its source); the numbers are DDP's bits for two ranks, where one addition has no
// order, and DDP's to rounding for more (FSDP's reduce-scatter adds in NCCL's ring order, dtlab's
// DDP in gloo's); the bytes are 3(N-1)/N of the flat parameters per rank and step for
// full_shard, 2(N-1)/N for shard_grad_op and no_shard.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "backends.h"
#include "errors.h"
#include "fsdp.h"
#include "model.h"
#include "run.h"
#include "test_util.h"

namespace {

struct Sizes {
  std::vector<std::string> names;
  std::vector<int64_t> numels;
};

Sizes sizes_of(const std::string& model) {
  lab::ModelOptions mo;
  mo.name = model;
  auto m = lab::build_model(mo, 0);
  Sizes s;
  s.names = lab::param_names(*m);
  s.numels = lab::param_numels(*m);
  return s;
}

lab::RunConfig fsdp_config(const std::string& mode, int world, const std::string& out) {
  lab::RunConfig c = testutil::small_run("mlp", world, out, 0);
  c.mode = mode;
  c.steps = 5;
  c.epochs = 0;
  c.momentum = 0.9;
  c.weight_decay = 1e-4;
  c.broadcast_buffers = false;  // FSDP broadcasts no buffer: DDP without it is the same experiment
  return c;
}

// Every element of every parameter and buffer of every rank: the largest difference over the
// tensor's largest value, and how many elements differ in their bits.
struct Apart {
  double rel = 0;
  size_t differ = 0;
};

Apart apart(lab::Run& a, lab::Run& b, int world) {
  Apart out;
  for (int r = 0; r < world; ++r) {
    const auto x = a.replica(r).state_dict(), y = b.replica(r).state_dict();
    for (size_t i = 0; i < x.size(); ++i) {
      if (x[i].buffer && x[i].buffer->is_int64) continue;
      const std::vector<float>& u = x[i].param ? x[i].param->value.data : x[i].buffer->value.data;
      const std::vector<float>& v = y[i].param ? y[i].param->value.data : y[i].buffer->value.data;
      double big = 0, worst = 0;
      for (size_t k = 0; k < u.size(); ++k) {
        big = std::max(big, std::fabs(static_cast<double>(v[k])));
        worst = std::max(worst, std::fabs(static_cast<double>(u[k]) - v[k]));
        out.differ += u[k] != v[k];
      }
      if (big > 0) out.rel = std::max(out.rel, worst / big);
    }
  }
  return out;
}

}  // namespace

// Flat parameters of N elements cut into W shards of ceil(N/W), the last padded: both models pad 2
// elements on 4 ranks and 6 on 8 (PARALLELISM.md); --fsdp-wrap layer makes a unit of each module.
TEST(FsdpUnits, ShardsOfCeilNOverWPaddedAtTheEnd) {
  const Sizes mlp = sizes_of("mlp"), cnn = sizes_of("cnn");
  for (const auto& [s, n] : {std::pair<const Sizes&, int64_t>{mlp, 235914}, {cnn, 421738}}) {
    for (const auto& [w, pad] : {std::pair<int, int64_t>{4, 2}, {8, 6}, {2, 0}}) {
      const auto units = lab::fsdp_units(s.names, s.numels, "model", w);
      ASSERT_EQ(units.size(), 1u);
      EXPECT_EQ(units[0].numel, n);
      EXPECT_EQ(units[0].shard, (n + w - 1) / w);
      EXPECT_EQ(units[0].padding(w), pad) << n << " on " << w;
      EXPECT_EQ(units[0].params.size(), s.names.size());
    }
  }
  const auto layers = lab::fsdp_units(mlp.names, mlp.numels, "layer", 3);
  std::vector<std::string> names;
  int64_t total = 0;
  for (const lab::FsdpUnit& u : layers) {
    names.push_back(u.name);
    total += u.numel;
    EXPECT_EQ(u.shard, (u.numel + 2) / 3);
    for (int i : u.params) EXPECT_EQ(mlp.names[static_cast<size_t>(i)].substr(0, u.name.size() + 1), u.name + ".");
  }
  EXPECT_EQ(names, (std::vector<std::string>{"1", "2", "4", "5", "7"}));
  EXPECT_EQ(total, 235914);
}

// _get_gradient_predivide_factor: f doubles while W % f == 0 and W / f > f.
TEST(FsdpUnits, GradientPredivideFactorIsPyTorchs) {
  EXPECT_EQ(lab::fsdp_predivide_factor(1), 1);
  EXPECT_EQ(lab::fsdp_predivide_factor(2), 2);
  EXPECT_EQ(lab::fsdp_predivide_factor(3), 2);  // then divided by 1.5
  EXPECT_EQ(lab::fsdp_predivide_factor(4), 2);
  EXPECT_EQ(lab::fsdp_predivide_factor(6), 4);  // then 1.5
  EXPECT_EQ(lab::fsdp_predivide_factor(8), 4);
  EXPECT_EQ(lab::fsdp_predivide_factor(16), 4);
}

// Two ranks: every strategy, both wraps, SGD with momentum and Adam, with no_sync too: DDP's bits
// on every rank (DDP without broadcast_buffers: FSDP broadcasts none).
TEST(FsdpMode, TwoRanksGiveDdpsBitsForEveryStrategy) {
  DTLAB_REQUIRE_DATASET();
  for (const char* optimizer : {"sgd", "adam"})
    for (int64_t no_sync : {0, 1}) {
      auto config = [&](const std::string& mode, const std::string& out) {
        lab::RunConfig c = fsdp_config(mode, 2, out);
        c.optimizer = optimizer;
        if (c.optimizer == "adam") c.lr = 1e-3;
        c.no_sync_steps = no_sync;
        return c;
      };
      testutil::TempDir d0;
      lab::Run ddp(config("ddp", d0.path()), lab::make_world);
      ddp.run();
      for (const char* strategy : {"full_shard", "shard_grad_op", "no_shard"})
        for (const char* wrap : {"model", "layer"}) {
          testutil::TempDir d1;
          lab::RunConfig c = config("fsdp", d1.path());
          c.sharding_strategy = strategy;
          c.fsdp_wrap = wrap;
          lab::Run fsdp(c, lab::make_world);
          fsdp.run();
          const Apart a = apart(ddp, fsdp, 2);
          EXPECT_EQ(a.differ, 0u) << strategy << ", wrap " << wrap << ", " << optimizer << ", no_sync " << no_sync
                                  << ": " << a.differ << " elements differ, largest " << a.rel;
        }
    }
}

// Three and four ranks: another order of additions (and for three, dividing by 2 then 1.5 instead
// of multiplying by 1/3), so not DDP's bits, but DDP's numbers to float32 rounding.
TEST(FsdpMode, MoreRanksAreDdpToRounding) {
  DTLAB_REQUIRE_DATASET();
  for (int world : {3, 4}) {
    testutil::TempDir d0, d1;
    lab::Run ddp(fsdp_config("ddp", world, d0.path()), lab::make_world);
    ddp.run();
    lab::RunConfig c = fsdp_config("fsdp", world, d1.path());
    lab::Run fsdp(c, lab::make_world);
    fsdp.run();
    const Apart a = apart(ddp, fsdp, world);
    EXPECT_GT(a.differ, 0u) << world << " ranks: the same bits as DDP, which adds in another order";
    EXPECT_LT(a.rel, 1e-4) << world << " ranks";
  }
}

// Bytes per step: full_shard all-gathers every flat parameter twice (before forward and before
// backward) and reduce-scatters the gradient once; shard_grad_op gathers once; each collective
// sends (N-1)/N of the padded flat buffer from every rank. no_shard allreduces: 2(N-1)/N.
TEST(FsdpMode, FullShardMovesOneAndAHalfTimesWhatShardGradOpMoves) {
  DTLAB_REQUIRE_DATASET();
  const int world = 4;
  const int64_t padded = 4 * 4 * ((235914 + 3) / 4);  // bytes: 4 shards of 58979 floats
  for (const char* strategy : {"full_shard", "shard_grad_op", "no_shard"}) {
    testutil::TempDir d;
    lab::RunConfig c = fsdp_config("fsdp", world, d.path());
    c.sharding_strategy = strategy;
    c.steps = 3;
    c.limit_train = 256;  // 4 batches of 16 per rank: the 3 steps stay in epoch 0
    lab::Run(c, lab::make_world).run();
    const nlohmann::json s = nlohmann::json::parse(testutil::read_file(d.file("summary.json")));
    const auto& by = s.at("traffic").at("by_what");
    const std::string st = strategy;
    // the collectives run on the rank's thread between the units' modules: none is hidden behind
    // backward (the compute events stop where a collective starts)
    EXPECT_GT(s.at("communication").at("comm_seconds").get<double>(), 0.0) << strategy;
    EXPECT_EQ(s.at("communication").at("hidden_seconds").get<double>(), 0.0) << strategy;
    if (st == "no_shard") {
      EXPECT_FALSE(by.contains("fsdp params"));
      EXPECT_EQ(by.at("fsdp grads").at("bytes_moved").get<int64_t>(), int64_t{3} * 2 * (world - 1) * 235914 * 4)
          << "3 steps x N ranks x 2(N-1)/N of the unpadded flat gradient";
      continue;
    }
    // per collective: N ranks x (N-1)/N of the padded buffer
    EXPECT_EQ(by.at("fsdp grads").at("bytes_moved").get<int64_t>(), 3 * (world - 1) * padded) << strategy;
    const int gathers = st == "full_shard" ? 2 : 1;
    EXPECT_EQ(by.at("fsdp params").at("bytes_moved").get<int64_t>(), 3 * gathers * (world - 1) * padded) << strategy;
    EXPECT_EQ(s.at("fsdp").at("units").at(0).at("padding").get<int64_t>(), 2);
  }
}

TEST(FsdpMode, WhatItCannotDoIsRefusedByName) {
  testutil::TempDir d;
  auto refused = [&](const std::function<void(lab::RunConfig&)>& set, const std::string& words) {
    lab::RunConfig c = fsdp_config("fsdp", 3, d.path());
    set(c);
    try {
      lab::validate(c);
      ADD_FAILURE() << "not refused: " << words;
    } catch (const lab::ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what() << " | wanted: " << words;
    }
  };
  refused([](lab::RunConfig& c) { c.sharding_strategy = "hybrid"; }, "--sharding-strategy: unknown strategy 'hybrid'");
  refused([](lab::RunConfig& c) { c.fsdp_wrap = "block"; }, "--fsdp-wrap: unknown policy 'block'");
  refused([](lab::RunConfig& c) { c.allreduce = "tree"; }, "--allreduce tree needs a power-of-two world size, not 3");
  refused([](lab::RunConfig& c) { c.compute.device = "sim"; }, "--mode fsdp runs on the CPU reference only");
}

// --eval-every: rank 0 evaluates its own model between steps; FSDP gathers the parameters first,
// so the figures are those of the whole model after the step (DDP's, with two ranks).
TEST(FsdpMode, PeriodicEvaluationSeesTheWholeModel) {
  DTLAB_REQUIRE_DATASET();
  testutil::TempDir d0, d1;
  lab::RunConfig a = fsdp_config("ddp", 2, d0.path()), b = fsdp_config("fsdp", 2, d1.path());
  for (lab::RunConfig* c : {&a, &b}) {
    c->eval_every = 2;
    c->eval_samples = 64;
  }
  lab::Run(a, lab::make_world).run();
  lab::Run(b, lab::make_world).run();
  auto evals = [](const std::string& metrics) {  // the "eval" records of metrics.jsonl
    std::vector<nlohmann::json> out;
    std::stringstream in(metrics);
    for (std::string line; std::getline(in, line);) {
      nlohmann::json j = nlohmann::json::parse(line);
      if (j.value("kind", "") == "eval") out.push_back(j);
    }
    return out;
  };
  const auto ea = evals(testutil::read_file(d0.file("metrics.jsonl")));
  const auto eb = evals(testutil::read_file(d1.file("metrics.jsonl")));
  ASSERT_GE(ea.size(), 2u);
  ASSERT_EQ(ea.size(), eb.size());
  for (size_t i = 0; i < ea.size(); ++i) {
    EXPECT_EQ(ea[i]["steps"], eb[i]["steps"]) << i;
    EXPECT_EQ(ea[i]["eval_mode"], eb[i]["eval_mode"]) << "evaluation " << i;
    EXPECT_EQ(ea[i]["train_mode"], eb[i]["train_mode"]) << "evaluation " << i;
  }
}
