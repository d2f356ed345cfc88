// The Benchmark view's data, checked without a window (viz/data/bench_result.h): result.json of
// `bench train` (a sweep, the per-sample comparison) and `bench chain` read into plain structs,
// from hand-built JSON and from the commands themselves; every malformed input an IoError that
// names the file and the field; an order's products from its parentheses; and the lesson checker
// accepting view = "bench" for bench runs only.
#include <gtest/gtest.h>

#include <cstdio>
#include <functional>

#include "bench_chain.h"
#include "bench_result.h"
#include "bench_train.h"
#include "errors.h"
#include "lesson.h"
#include "test_util.h"

namespace {

using nlohmann::json;

bool contains(const std::string& s, const std::string& what) { return s.find(what) != std::string::npos; }

json sweep_json() {
  return json::parse(R"JSON({
    "command": "bench train", "producer": "dtlab 0.1.0", "model": "mlp", "batchnorm": true, "world_size": 1,
    "threads": 1, "sgemm": "openblas", "train_flops_per_sample": 1007104, "batch_sizes": [2, 8, 32],
    "ratio_smallest_largest": 5.0,
    "sweep": [
      {"batch_size": 2, "step_ms": 0.12, "ms_per_sample": 0.06, "samples_per_s": 16666.7, "gflops": 16.8, "speedup_per_sample": 1.0},
      {"batch_size": 8, "step_ms": 0.16, "ms_per_sample": 0.02, "samples_per_s": 50000, "gflops": 50.4, "speedup_per_sample": 3.0},
      {"batch_size": 32, "step_ms": 0.384, "ms_per_sample": 0.012, "samples_per_s": 83333.3, "gflops": 83.9, "speedup_per_sample": 5.0}
    ],
    "per_sample": {"batch_size": 32, "batched_ms": 0.384, "per_sample_ms": 2.56, "ratio": 6.6667,
                   "grad_max_abs_diff": 0.03, "grad_max_rel_diff": 1.0, "grad_max_rel_param": "1.bias",
                   "same_computation_max_abs_diff": 1e-8, "same_computation_max_rel_diff": 7e-7,
                   "batchnorm": "frozen", "batchnorm_note": "frozen statistics", "train_mode_error": "Expected more"}
  })JSON");
}

json chain_json() {
  return json::parse(R"JSON({
    "command": "bench chain", "producer": "dtlab 0.1.0", "sgemm": "openblas", "seed": 0, "dims": [8, 64, 64, 8],
    "threads": [1, 2], "optimal": "((A1 A2) A3)", "optimal_flops": 73728, "tolerance": 0.001,
    "ratio_slowest_fastest": 3.5,
    "orders": [
      {"order": "((A1 A2) A3)", "flops": 73728, "is_optimal": true, "results": [
        {"threads": 1, "time_ms": 0.01, "gflops": 7.4, "max_rel_diff": 0.0, "scaling": 1.0},
        {"threads": 2, "time_ms": 0.01, "gflops": 7.4, "max_rel_diff": 1e-7, "scaling": 1.0}]},
      {"order": "(A1 (A2 A3))", "flops": 73728, "is_optimal": false, "results": [
        {"threads": 1, "time_ms": 0.035, "gflops": 2.1, "max_rel_diff": 2e-7, "scaling": 1.0},
        {"threads": 2, "time_ms": 0.02, "gflops": 3.7, "max_rel_diff": 2e-7, "scaling": 1.75}]}
    ]
  })JSON");
}

// The IoError message of parsing j (as /x/result.json), or "" when it parses.
std::string error_of(const json& j) {
  try {
    viz::parse_bench_result(j.dump(), "/x/result.json");
  } catch (const lab::IoError& e) {
    EXPECT_FALSE(e.hint().empty()) << "a hint says which commands write the file";
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "not an IoError: " << e.what();
    return e.what();
  }
  return "";
}

std::string error_of_text(const std::string& text) {
  try {
    viz::parse_bench_result(text, "/x/result.json");
  } catch (const lab::IoError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(VizBenchResult, ReadsASweepWithItsPerSampleComparison) {
  const viz::BenchResult r = viz::parse_bench_result(sweep_json().dump(), "/x/result.json");
  ASSERT_EQ(r.kind, viz::BenchKind::Train);
  EXPECT_EQ(r.source, "/x/result.json");
  const viz::BenchTrainResult& t = r.train;
  EXPECT_EQ(t.model, "mlp");
  EXPECT_TRUE(t.batchnorm);
  EXPECT_EQ(t.train_flops_per_sample, 1007104);
  ASSERT_EQ(t.sweep.size(), 3u);
  EXPECT_EQ(t.sweep[1].batch_size, 8);
  EXPECT_DOUBLE_EQ(t.sweep[2].ms_per_sample, 0.012);
  EXPECT_DOUBLE_EQ(t.sweep[2].speedup_per_sample, 5.0);
  EXPECT_DOUBLE_EQ(t.ratio_smallest_largest, 5.0);
  ASSERT_TRUE(t.per_sample.has_value());
  EXPECT_EQ(t.per_sample->batch_size, 32);
  EXPECT_DOUBLE_EQ(t.per_sample->per_sample_ms, 2.56);
  EXPECT_EQ(t.per_sample->batchnorm, "frozen");
  ASSERT_TRUE(t.per_sample->same_computation_max_rel_diff.has_value());
  EXPECT_DOUBLE_EQ(*t.per_sample->same_computation_max_rel_diff, 7e-7);
  EXPECT_TRUE(contains(viz::describe_bench(r), "batch sizes 2 to 32")) << viz::describe_bench(r);

  // --per-sample alone (one batch size): no sweep; null where no batched step computes the same
  json j = sweep_json();
  j.erase("sweep");
  j.erase("ratio_smallest_largest");
  j["per_sample"]["same_computation_max_rel_diff"] = nullptr;
  const viz::BenchResult p = viz::parse_bench_result(j.dump(), "p.json");
  EXPECT_TRUE(p.train.sweep.empty());
  ASSERT_TRUE(p.train.per_sample.has_value());
  EXPECT_FALSE(p.train.per_sample->same_computation_max_rel_diff.has_value());
  // a sweep without --per-sample
  j = sweep_json();
  j.erase("per_sample");
  EXPECT_FALSE(viz::parse_bench_result(j.dump(), "s.json").train.per_sample.has_value());
}

TEST(VizBenchResult, ReadsAChainAndTheProductsOfEachOrder) {
  const viz::BenchResult r = viz::parse_bench_result(chain_json().dump(), "/x/result.json");
  ASSERT_EQ(r.kind, viz::BenchKind::Chain);
  const viz::BenchChainResult& c = r.chain;
  EXPECT_EQ(c.dims, (std::vector<int64_t>{8, 64, 64, 8}));
  EXPECT_EQ(c.threads, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(c.optimal, "((A1 A2) A3)");
  ASSERT_EQ(c.orders.size(), 2u);
  EXPECT_TRUE(c.orders[0].is_optimal);
  ASSERT_EQ(c.orders[1].results.size(), 2u);
  EXPECT_EQ(c.orders[1].results[1].threads, 2);
  EXPECT_DOUBLE_EQ(c.orders[1].results[1].scaling, 1.75);
  EXPECT_TRUE(contains(viz::describe_bench(r), "3 matrices")) << viz::describe_bench(r);

  // the products of an order, operands first, and their FLOPs as bench chain counts them
  const std::vector<int64_t> dims = {8, 2048, 2048, 2048, 8};
  const auto ps = viz::chain_products("((A1 (A2 A3)) A4)", dims);
  ASSERT_EQ(ps.size(), 3u);
  EXPECT_EQ(ps[0].m, 2048);
  EXPECT_EQ(ps[0].k, 2048);
  EXPECT_EQ(ps[0].n, 2048);
  EXPECT_EQ(ps[1].m, 8);
  EXPECT_EQ(ps[2].n, 8);
  double flops = 0;
  for (const auto& p : ps) flops += p.flops();
  EXPECT_DOUBLE_EQ(flops, 17247240192.0);  // what `bench chain --dims 8,2048,2048,2048,8` prints
  EXPECT_EQ(viz::chain_products("(((A1 A2) A3) A4)", dims).size(), 3u);
  EXPECT_TRUE(viz::chain_products("A1", {3, 4}).empty()) << "one matrix: no product";
  // not a parenthesization of A1..An over these dims: nothing, never a crash
  for (const std::string bad : {"", "(A1 A3)", "((A1 A2) A3", "(A1 A2) A3", "((A1 A2) A3) x", "(A1 (A2 A3 A4))",
                                "(A2 (A1 A3))", "((A1 A2) (A3 A4))x", "(A1 (A2 (A3 A9999999999)))"})
    EXPECT_TRUE(viz::chain_products(bad, dims).empty()) << bad;
  EXPECT_TRUE(viz::chain_products(std::string(100000, '('), dims).empty()) << "deep nesting is refused";
  EXPECT_TRUE(viz::chain_products("(A1 A2)", {8, 4, 5, 6}).empty()) << "A3 left out";
}

// Wrong types, missing fields, empty arrays, bad ranges: an IoError naming the file and the field.
TEST(VizBenchResult, MalformedInputIsAnErrorNamingTheFileAndTheField) {
  struct Case {
    const char* what;
    std::function<json()> make;
    const char* field;  // the JSON pointer (or words) the message names
  };
  auto sweep = [](std::function<void(json&)> f) {
    return [f] {
      json j = sweep_json();
      f(j);
      return j;
    };
  };
  auto chain = [](std::function<void(json&)> f) {
    return [f] {
      json j = chain_json();
      f(j);
      return j;
    };
  };
  const std::vector<Case> cases = {
      {"not an object", [] { return json::array({1, 2}); }, "expected a JSON object, got an array"},
      {"no command", sweep([](json& j) { j.erase("command"); }), "/command: missing"},
      {"command not a string", sweep([](json& j) { j["command"] = 3; }), "/command: expected a string, got an integer"},
      {"another command", sweep([](json& j) { j["command"] = "bench allreduce"; }), "\"bench allreduce\""},
      {"no model", sweep([](json& j) { j.erase("model"); }), "/model: missing"},
      {"sweep empty", sweep([](json& j) { j["sweep"] = json::array(); }), "/sweep: empty"},
      {"sweep an object", sweep([](json& j) { j["sweep"] = json::object(); }), "/sweep: expected an array, got an object"},
      {"row not an object", sweep([](json& j) { j["sweep"][1] = 5; }), "/sweep/1: expected an object"},
      {"row missing ms_per_sample", sweep([](json& j) { j["sweep"][1].erase("ms_per_sample"); }), "/sweep/1/ms_per_sample: missing"},
      {"ms_per_sample a string", sweep([](json& j) { j["sweep"][2]["ms_per_sample"] = "fast"; }),
       "/sweep/2/ms_per_sample: expected a number, got a string"},
      {"step_ms null (a NaN written by JSON)", sweep([](json& j) { j["sweep"][0]["step_ms"] = nullptr; }),
       "/sweep/0/step_ms: expected a number, got null"},
      {"negative time", sweep([](json& j) { j["sweep"][0]["step_ms"] = -1.0; }), "/sweep/0/step_ms: expected a positive number"},
      {"zero time", sweep([](json& j) { j["sweep"][0]["ms_per_sample"] = 0; }), "/sweep/0/ms_per_sample: expected a positive number"},
      {"absurd time", sweep([](json& j) { j["sweep"][0]["ms_per_sample"] = 1e300; }), "/sweep/0/ms_per_sample: out of range"},
      {"tiny time", chain([](json& j) { j["orders"][1]["results"][0]["time_ms"] = 1e-300; }), "/orders/1/results/0/time_ms: too small"},
      {"batch size 0", sweep([](json& j) { j["sweep"][0]["batch_size"] = 0; }), "/sweep/0/batch_size: expected an integer >= 1"},
      {"batch size 2.5", sweep([](json& j) { j["sweep"][0]["batch_size"] = 2.5; }), "/sweep/0/batch_size: expected an integer, got 2.5"},
      {"batch size 1e300", sweep([](json& j) { j["sweep"][0]["batch_size"] = 1e300; }), "/sweep/0/batch_size: expected an integer"},
      {"batch size huge", sweep([](json& j) { j["sweep"][0]["batch_size"] = 18446744073709551615ull; }), "/sweep/0/batch_size: out of range"},
      {"sizes not increasing", sweep([](json& j) { j["sweep"][2]["batch_size"] = 8; }), "/sweep/2/batch_size: batch sizes must increase"},
      {"no ratio", sweep([](json& j) { j.erase("ratio_smallest_largest"); }), "/ratio_smallest_largest: missing"},
      {"too many rows", sweep([](json& j) { j["sweep"] = json::array(); for (int i = 0; i < 300; ++i) j["sweep"].push_back(json::object()); }),
       "/sweep: 300 elements"},
      {"nothing to plot", sweep([](json& j) { j.erase("sweep"); j.erase("per_sample"); }), "without \"sweep\" or \"per_sample\""},
      {"per_sample an array", sweep([](json& j) { j["per_sample"] = json::array(); }), "/per_sample: expected an object, got an array"},
      {"per_sample missing batched_ms", sweep([](json& j) { j["per_sample"].erase("batched_ms"); }), "/per_sample/batched_ms: missing"},
      {"per_sample batchnorm a number", sweep([](json& j) { j["per_sample"]["batchnorm"] = 1; }), "/per_sample/batchnorm: expected a string"},
      {"batchnorm a string", sweep([](json& j) { j["batchnorm"] = "yes"; }), "/batchnorm: expected true or false, got a string"},
      {"chain without orders", chain([](json& j) { j.erase("orders"); }), "/orders: missing"},
      {"orders empty", chain([](json& j) { j["orders"] = json::array(); }), "/orders: empty"},
      {"order text empty", chain([](json& j) { j["orders"][0]["order"] = ""; }), "/orders/0/order: empty"},
      {"flops a string", chain([](json& j) { j["orders"][1]["flops"] = "many"; }), "/orders/1/flops: expected a number, got a string"},
      {"is_optimal a number", chain([](json& j) { j["orders"][1]["is_optimal"] = 0; }), "/orders/1/is_optimal: expected true or false"},
      {"results empty", chain([](json& j) { j["orders"][0]["results"] = json::array(); }), "/orders/0/results: empty"},
      {"one result short", chain([](json& j) { j["orders"][1]["results"].erase(1); }), "/orders/1/results: 1 results for 2 thread counts"},
      {"threads out of line", chain([](json& j) { j["orders"][1]["results"][1]["threads"] = 4; }), "/orders/1/results/1/threads: 4"},
      {"time null", chain([](json& j) { j["orders"][0]["results"][0]["time_ms"] = nullptr; }), "/orders/0/results/0/time_ms: expected a number, got null"},
      {"scaling zero", chain([](json& j) { j["orders"][0]["results"][1]["scaling"] = 0; }), "/orders/0/results/1/scaling: expected a positive number"},
      {"dims of one", chain([](json& j) { j["dims"] = json::array({8}); }), "/dims: a chain of matrices needs at least two dims"},
      {"dims with a string", chain([](json& j) { j["dims"][2] = "64"; }), "/dims/2: expected an integer, got a string"},
      {"threads empty", chain([](json& j) { j["threads"] = json::array(); }), "/threads: empty"},
      {"threads zero", chain([](json& j) { j["threads"][0] = 0; }), "/threads/0: expected an integer >= 1"},
      {"no optimal", chain([](json& j) { j.erase("optimal"); }), "/optimal: missing"},
  };
  for (const Case& c : cases) {
    const std::string e = error_of(c.make());
    EXPECT_TRUE(contains(e, "/x/result.json")) << c.what << ": the file is named: " << e;
    EXPECT_TRUE(contains(e, c.field)) << c.what << ": expected '" << c.field << "' in: " << e;
  }
  // not JSON at all, or cut short
  for (const std::string text : {"", "{", "not json", "{\"command\": \"bench chain\", \"orders\": [", "\x01\x02\xff"}) {
    const std::string e = error_of_text(text);
    EXPECT_TRUE(contains(e, "/x/result.json: not JSON")) << e;
  }
  // deeply nested JSON is an error or a result without the fields, never a crash
  const std::string deep = "{\"command\": \"bench chain\", \"dims\": " + std::string(10000, '[') + std::string(10000, ']') + "}";
  EXPECT_FALSE(error_of_text(deep).empty());
}

TEST(VizBenchResult, OpensAFileOrADirectoryAndTellsThemFromRunDirectories) {
  testutil::TempDir d;
  std::filesystem::create_directories(d.file("bench"));
  testutil::write_file(d.file("bench/result.json"), chain_json().dump());
  testutil::write_file(d.file("bench/output.txt"), "the table\n");
  EXPECT_TRUE(viz::looks_like_bench_result(d.file("bench")));
  EXPECT_TRUE(viz::looks_like_bench_result(d.file("bench/result.json")));
  const viz::BenchResult r = viz::load_bench_result(d.file("bench"));
  EXPECT_EQ(r.kind, viz::BenchKind::Chain);
  EXPECT_EQ(r.source, d.file("bench/result.json"));
  EXPECT_EQ(viz::load_bench_result(d.file("bench/result.json")).chain.orders.size(), 2u);
  // a run directory (config.toml), an empty or missing one: not a bench result
  std::filesystem::create_directories(d.file("run"));
  testutil::write_file(d.file("run/config.toml"), "model = \"mlp\"\n");
  testutil::write_file(d.file("run/result.json"), "{}");
  EXPECT_FALSE(viz::looks_like_bench_result(d.file("run")));
  std::filesystem::create_directories(d.file("empty"));
  EXPECT_FALSE(viz::looks_like_bench_result(d.file("empty")));
  EXPECT_FALSE(viz::looks_like_bench_result(d.file("nothing-here")));
  // a lesson's bench run that failed before writing its result: said plainly
  std::filesystem::create_directories(d.file("failed"));
  testutil::write_file(d.file("failed/output.txt"), "error\n");
  EXPECT_FALSE(viz::looks_like_bench_result(d.file("failed"))) << "output.txt alone: an mpi run's too";
  testutil::write_file(d.file("failed/outcome.json"), "{\"command\": \"bench chain\", \"exit_code\": 1}");
  EXPECT_TRUE(viz::looks_like_bench_result(d.file("failed")));
  testutil::write_file(d.file("empty/outcome.json"), "{\"command\": \"run\"}");
  EXPECT_FALSE(viz::looks_like_bench_result(d.file("empty")));
  testutil::write_file(d.file("empty/outcome.json"), "not json");
  EXPECT_FALSE(viz::looks_like_bench_result(d.file("empty")));
  try {
    viz::load_bench_result(d.file("failed"));
    ADD_FAILURE() << "no result.json";
  } catch (const lab::IoError& e) {
    EXPECT_TRUE(contains(e.what(), "cannot read " + d.file("failed/result.json"))) << e.what();
  }
  // a file that is no bench result
  testutil::write_file(d.file("summary.json"), "{\"steps\": 10}");
  try {
    viz::load_bench_result(d.file("summary.json"));
    ADD_FAILURE() << "not a bench result";
  } catch (const lab::IoError& e) {
    EXPECT_TRUE(contains(e.what(), d.file("summary.json") + ": /command: missing")) << e.what();
  }
}

// The contract: what the commands write is what the view reads (short timings: figures, not speed).
TEST(VizBenchResult, ReadsWhatTheBenchCommandsWrite) {
  testutil::TempDir d;
  std::FILE* out = std::fopen(d.file("out.txt").c_str(), "w");
  ASSERT_NE(out, nullptr);
  lab::BenchChainOptions c;
  c.dims = {4, 32, 32, 4};
  c.threads = {1, 2};
  c.seconds = 0.001;
  c.rounds = 1;
  c.json_out = d.file("chain.json");
  c.out = out;
  ASSERT_EQ(lab::bench_chain(c), 0);
  lab::BenchTrainOptions t;
  t.model = "mlp";
  t.batch_sizes = {2, 4};
  t.per_sample = true;
  t.seconds = 0.001;
  t.rounds = 1;
  t.json_out = d.file("train.json");
  t.out = out;
  ASSERT_EQ(lab::bench_train(t), 0);
  std::fclose(out);

  const viz::BenchResult rc = viz::load_bench_result(d.file("chain.json"));
  ASSERT_EQ(rc.kind, viz::BenchKind::Chain);
  EXPECT_EQ(rc.chain.orders.size(), 2u);
  EXPECT_EQ(rc.chain.threads, (std::vector<int64_t>{1, 2}));
  int optimal = 0;
  for (const viz::BenchChainOrder& o : rc.chain.orders) {
    optimal += o.is_optimal;
    double flops = 0;
    for (const auto& p : viz::chain_products(o.order, rc.chain.dims)) flops += p.flops();
    EXPECT_DOUBLE_EQ(flops, o.flops) << o.order;
  }
  EXPECT_EQ(optimal, 1);

  const viz::BenchResult rt = viz::load_bench_result(d.file("train.json"));
  ASSERT_EQ(rt.kind, viz::BenchKind::Train);
  ASSERT_EQ(rt.train.sweep.size(), 2u);
  ASSERT_TRUE(rt.train.per_sample.has_value());
  EXPECT_EQ(rt.train.per_sample->batch_size, 4) << "the largest batch of the sweep, one sample at a time";
}

// A lesson may observe a bench train sweep or a bench chain in the bench view, and nothing else there.
TEST(VizBenchResult, LessonObservationsOfBenchRunsUseTheBenchView) {
  const std::string base = R"TOML(format_version = 1
id = "bench-view"
version = 1
title = "Does the order of a matrix chain matter?"
minutes = 5
budget_s = 30

[question]
text = "Does the order of a matrix chain matter?"

[[predict]]
id = "matters"
kind = "choice"
prompt = "Is one order much slower than another?"

[[predict.choices]]
key = "a"
text = "Yes"
correct_if = "ratio > 2"

[[predict.choices]]
key = "b"
text = "No"
correct_if = "ratio <= 2"

[[hint]]
prediction = "matters"
text = "Count the FLOPs of each order."

[runs.chain]
command = "bench chain"
args = "--dims 4,64,64,4 --threads 1 --seconds 0.001 --rounds 1"

[runs.sweep]
command = "bench train"
args = "--model mlp --batch-sizes 2,8 --per-sample --seconds 0.001 --rounds 1"

[runs.one]
command = "bench train"
args = "--model mlp --batch-size 8 --seconds 0.001 --rounds 1"

[runs.train]
args = "--model mlp --limit-train 64 --limit-test 64 --epochs 1"

[quantities]
ratio = { run = "chain", result = "/ratio_slowest_fastest" }

[[check]]
id = "ran"
that = "ratio >= 1"
why = "the slowest is not faster than the fastest"

[explain]
text = "The orders differ in FLOPs: {ratio:.1f}."
)TOML";
  auto problems = [&](const std::string& observe) -> std::string {
    try {
      lessons::parse_lesson(base + observe, "bench-view.toml");
    } catch (const lessons::LessonError& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_EQ(problems("\n[[observe]]\nrun = \"chain\"\nview = \"bench\"\nsay = \"{ratio:.1f}\"\n"), "");
  EXPECT_EQ(problems("\n[[observe]]\nrun = \"sweep\"\nview = \"bench\"\nsay = \"look\"\n"), "");
  EXPECT_EQ(problems("\n[[observe]]\nruns = [\"chain\", \"sweep\"]\nview = \"bench\"\nsay = \"look\"\n"), "");
  std::string e = problems("\n[[observe]]\nrun = \"train\"\nview = \"bench\"\nsay = \"look\"\n");
  EXPECT_TRUE(contains(e, "run 'train' is `dtlab run`: the bench view shows")) << e;
  e = problems("\n[[observe]]\nrun = \"one\"\nview = \"bench\"\nsay = \"look\"\n");
  EXPECT_TRUE(contains(e, "times one batch size")) << e;
  e = problems("\n[[observe]]\nrun = \"chain\"\nview = \"ring\"\nsay = \"look\"\n");
  EXPECT_TRUE(contains(e, "view = \"bench\" shows bench train and bench chain results")) << e;
  e = problems("\n[[observe]]\nrun = \"chain\"\nview = \"bench\"\nstep = 3\nsay = \"look\"\n");
  EXPECT_TRUE(contains(e, "the bench view shows a finished benchmark")) << e;
  e = problems("\n[[observe]]\nrun = \"chain\"\nview = \"plots\"\nsay = \"look\"\n");
  EXPECT_TRUE(contains(e, "unknown view 'plots'")) << e;
  EXPECT_TRUE(contains(e, "traineval, bench")) << "the known views are listed: " << e;
}
