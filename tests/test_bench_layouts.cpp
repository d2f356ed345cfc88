// dtlab bench layouts (commands/bench_layouts.h): every dp x pp x tp layout of N ranks on one global
// batch, the refused ones named, and each layout's bytes per kind of group as the collectives'
// arithmetic says they must be (the times are the machine's and are only checked to exist).
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "backends.h"
#include "bench_layouts.h"
#include "command_line.h"
#include "errors.h"
#include "model.h"
#include "test_util.h"

namespace {

lab::BenchLayoutsOptions mlp_on_four() {
  lab::BenchLayoutsOptions o;
  o.base.model = "mlp";
  o.base.world_size = 4;
  o.base.threads = 1;
  o.global_batch = 32;
  o.steps = 2;
  o.microbatches = 2;
  return o;
}

const lab::LayoutResult& find(const std::vector<lab::LayoutResult>& v, int dp, int pp, int tp) {
  for (const lab::LayoutResult& l : v)
    if (l.dp == dp && l.pp == pp && l.tp == tp) return l;
  throw std::runtime_error("no layout " + std::to_string(dp) + " x " + std::to_string(pp) + " x " + std::to_string(tp));
}

}  // namespace

// Four ranks: 4 x 1 x 1 (DDP), 2 x 1 x 2, 2 x 2 x 1, 1 x 1 x 4, 1 x 2 x 2, 1 x 4 x 1; the last is
// refused in the pipeline's words (the mlp has three layers with matrix products). Each is the run
// its axes make: the batch per replica is the global batch over dp.
TEST(BenchLayouts, EveryFactorizationIsALayoutAndTheRefusedOnesSayWhy) {
  const std::vector<lab::LayoutResult> v = lab::plan_layouts(mlp_on_four());
  ASSERT_EQ(v.size(), 6u);
  EXPECT_EQ(find(v, 4, 1, 1).cfg.mode, "ddp");
  EXPECT_EQ(find(v, 4, 1, 1).cfg.batch_size, 8);
  EXPECT_EQ(find(v, 2, 1, 2).cfg.mode, "tensor");
  EXPECT_EQ(find(v, 2, 1, 2).cfg.batch_size, 16);
  EXPECT_EQ(find(v, 1, 2, 2).cfg.mode, "pipeline");
  EXPECT_EQ(find(v, 1, 2, 2).cfg.tp, 2);
  EXPECT_EQ(find(v, 1, 2, 2).cfg.microbatches, 2);
  for (const lab::LayoutResult& l : v) {
    if (l.dp == 1 && l.pp == 4) continue;
    EXPECT_EQ(l.refused, "") << l.dp << " x " << l.pp << " x " << l.tp;
  }
  EXPECT_NE(find(v, 1, 4, 1).refused.find("the mlp has 3 layers with matrix products"), std::string::npos)
      << find(v, 1, 4, 1).refused;
  // a global batch the replicas cannot share evenly
  lab::BenchLayoutsOptions o = mlp_on_four();
  o.global_batch = 30;
  EXPECT_EQ(find(lab::plan_layouts(o), 4, 1, 1).refused, "--global-batch 30 is not a multiple of 4 data-parallel replicas");
  o.global_batch = 0;
  EXPECT_THROW(lab::plan_layouts(o), lab::ConfigError);
}

// What each layout moves per iteration, over every rank. DDP on N ranks: a ring allreduce sends
// 2 (N - 1) / N of the gradients from every rank, 2 (N - 1) x the model's bytes in all, and the
// broadcast of rank 0's buffers before the forward (broadcast_buffers) N - 1 copies of them. Tensor
// parallelism over 4 ranks: g's allreduce of fc2's output (32 x 128 floats) in forward, and none in
// backward (fc1's input is data): 2 (4 - 1) x its bytes. A pipeline moves activations between
// stages and its replicas' gradients over dp.
TEST(BenchLayouts, EachLayoutsBytesAreItsCollectivesArithmetic) {
  DTLAB_REQUIRE_DATASET();
  std::vector<lab::LayoutResult> v = lab::plan_layouts(mlp_on_four());
  lab::LayoutResult& ddp = const_cast<lab::LayoutResult&>(find(v, 4, 1, 1));
  lab::LayoutResult& tensor = const_cast<lab::LayoutResult&>(find(v, 1, 1, 4));
  lab::LayoutResult& grid = const_cast<lab::LayoutResult&>(find(v, 2, 2, 1));
  for (lab::LayoutResult* l : {&ddp, &tensor, &grid}) lab::measure_layout(*l, lab::make_world);
  int64_t params = 0, buffers = 0;
  const std::unique_ptr<lab::Model> model = lab::build_model(lab::model_options(ddp.cfg), 0);  // (kept: entries point into it)
  for (const lab::StateEntry& e : model->state_dict()) {
    if (e.param) params += e.param->value.numel() * 4;
    else buffers += e.buffer->is_int64 ? 8 : e.buffer->value.numel() * 4;
  }
  EXPECT_DOUBLE_EQ(ddp.bytes_by_group.at("dp"), 2.0 * 3 * params + 3.0 * buffers);
  EXPECT_EQ(ddp.bytes_by_group.count("tp"), 0u);
  EXPECT_DOUBLE_EQ(tensor.bytes_by_group.at("tp"), 2.0 * 3 * 32 * 128 * 4);
  EXPECT_GT(grid.bytes_by_group.at("pp"), 0.0);
  EXPECT_GT(grid.bytes_by_group.at("dp"), 0.0);
  for (const lab::LayoutResult* l : {&ddp, &tensor, &grid}) EXPECT_GT(l->ms_per_iteration, 0.0);
  EXPECT_EQ(ddp.wire_ms, 0.0);  // no link given: no wire time
}

// The command: the table, the refused layout, and the ratio as the last line; with a link, the
// busiest rank's wire time is its bytes through it.
TEST(BenchLayouts, TheCommandPrintsEveryLayoutAndTheRatioLast) {
  DTLAB_REQUIRE_DATASET();
  testutil::TempDir d;
  const auto r = testutil::run_cli("bench layouts --model mlp --world-size 4 --global-batch 32 --steps 2 "
                                   "--microbatches 2 --link-gbps 10 --link-latency-us 5 --json " + d.file("l.json"));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const size_t refused = r.out.find("\n1 x 4 x 1");
  ASSERT_NE(refused, std::string::npos) << r.out;
  EXPECT_NE(r.out.substr(refused).find("refused: "), std::string::npos) << r.out;
  const std::string last = r.out.substr(r.out.rfind("ratio slowest/fastest layout"));
  EXPECT_EQ(last.find('\n'), last.size() - 1) << "the ratio must be the last line:\n" << r.out;
  const auto j = nlohmann::json::parse(testutil::read_file(d.file("l.json")));
  EXPECT_EQ(j.at("layouts").size(), 6u);
  for (const auto& l : j.at("layouts")) {
    if (!l.at("refused").get<std::string>().empty()) continue;
    EXPECT_DOUBLE_EQ(l.at("wire_ms").get<double>(), 1e3 * l.at("busiest_rank_bytes").get<double>() * 8 / 10e9);
  }
}
