// The grid modes' threads, small enough for ThreadSanitizer (the tsan suites, tests/CMakeLists.txt):
// a pipeline of 2 stages x 2 tensor slices x 2 replicas (8 ranks, 1F1B with 2 micro-batches in
// flight, f and g over the tp groups, the dp averaging, the stage sends) and tensor parallelism
// with replicas (4 ranks), each for two iterations and an evaluation, ending with every replica
// holding the same model. The whole runs' numbers are tested in test_pipeline.cpp and
// test_tensor_parallel.cpp; here the point is that their ranks meet without a data race.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "run.h"
#include "test_util.h"
#include "backends.h"
#include "model_compare.h"

namespace {

lab::RunConfig tiny(const std::string& mode, int world, const std::string& out) {
  lab::RunConfig c = testutil::small_run("mlp", world, out, 2);
  c.mode = mode;
  c.batch_size = 8;
  c.limit_train = 64;
  c.limit_test = 16;
  c.eval_every = 1;
  c.eval_samples = 16;
  return c;
}

TEST(GridThreads, APipelineGridOfEightRanksRunsToTheEnd) {
  DTLAB_REQUIRE_DATASET();
  testutil::TempDir d;
  lab::RunConfig c = tiny("pipeline", 8, d.path());
  c.stages = 2;
  c.tp = 2;
  c.dp = 2;
  c.microbatches = 2;
  c.schedule = "1f1b";
  lab::Run run(c, lab::make_world);
  run.run();
  const auto j = nlohmann::json::parse(testutil::read_file(d.file("summary.json")));
  EXPECT_EQ(j.at("steps"), 2);
  for (const char* kind : {"dp", "pp", "tp"})
    EXPECT_GT(j.at("grid").at("bytes_per_iteration_by_group").at(kind).get<double>(), 0.0) << kind;
}

TEST(GridThreads, TensorParallelReplicasRunToTheEnd) {
  DTLAB_REQUIRE_DATASET();
  testutil::TempDir d;
  lab::RunConfig c = tiny("tensor", 4, d.path());
  c.tp = 2;
  c.dp = 2;
  lab::Run run(c, lab::make_world);
  run.run();
  // ranks 0 and 1 are the two slices of replica 0: gathered into whole models before the
  // evaluations, the same bits, BatchNorm's statistics too (both normalized the same batch)
  EXPECT_EQ(testutil::apart(run.replica(0), run.replica(1)).differ, 0u);
}

}  // namespace
