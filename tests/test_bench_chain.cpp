// dtlab bench chain: the orders and their FLOPs (exact, against brute force and the textbook
// example), the products' agreement across orders (exact on integer inputs, to rounding on random
// ones), the dynamic program's order being fast where the FLOP gap is large, the JSON's keys and
// the flags' errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <random>
#include <set>

#include "bench_chain.h"
#include "command_line.h"
#include "errors.h"
#include "gemm.h"
#include "test_util.h"
#include "torch_rng.h"

namespace {

// Runs the command in this process with its table in a file; returns the JSON, `printed` gets
// the table.
nlohmann::json run_chain(lab::BenchChainOptions o, std::string* printed = nullptr) {
  testutil::TempDir tmp;
  o.json_out = tmp.file("result.json");
  std::FILE* f = std::fopen(tmp.file("out.txt").c_str(), "w");
  o.out = f;
  const int code = lab::bench_chain(o);
  std::fclose(f);
  EXPECT_EQ(code, 0);
  if (printed) *printed = testutil::read_file(tmp.file("out.txt"));
  return nlohmann::json::parse(testutil::read_file(o.json_out));
}

std::string last_line(const std::string& text) {
  std::string t = text;
  while (!t.empty() && t.back() == '\n') t.pop_back();
  const size_t nl = t.rfind('\n');
  return nl == std::string::npos ? t : t.substr(nl + 1);
}

std::vector<lab::Tensor> random_chain(const std::vector<long long>& dims, uint64_t seed) {
  lab::TorchGenerator g(seed);
  std::vector<lab::Tensor> mats;
  for (size_t i = 0; i + 1 < dims.size(); ++i) {
    mats.emplace_back(std::vector<int64_t>{dims[i], dims[i + 1]});
    g.uniform_(mats.back().ptr(), mats.back().numel(), -1.0, 1.0);
  }
  return mats;
}

// The product of the chain left to right in double, the yardstick of the float32 orders.
std::vector<double> chain_in_double(const std::vector<long long>& dims, const std::vector<lab::Tensor>& mats) {
  std::vector<double> acc(mats[0].data.begin(), mats[0].data.end());  // (dims[0], dims[1])
  for (size_t m = 1; m < mats.size(); ++m) {
    const long long rows = dims[0], inner = dims[m], cols = dims[m + 1];
    std::vector<double> next(static_cast<size_t>(rows * cols), 0.0);
    for (long long r = 0; r < rows; ++r)
      for (long long k = 0; k < inner; ++k)
        for (long long c = 0; c < cols; ++c)
          next[static_cast<size_t>(r * cols + c)] +=
              acc[static_cast<size_t>(r * inner + k)] * mats[m].data[static_cast<size_t>(k * cols + c)];
    acc = std::move(next);
  }
  return acc;
}

}  // namespace

TEST(BenchChain, OrdersAreEveryParenthesization) {
  const long long catalan[] = {1, 1, 2, 5, 14, 42, 132};
  for (int n = 1; n <= 7; ++n) {
    const std::vector<lab::ChainOrder> orders = lab::chain_all_orders(n);
    EXPECT_EQ(static_cast<long long>(orders.size()), catalan[n - 1]) << n << " matrices";
    EXPECT_EQ(lab::chain_order_count(n, 1000), catalan[n - 1]);
    std::set<std::string> texts;
    for (const auto& o : orders) {
      texts.insert(o.text);
      EXPECT_EQ(o.products.size(), static_cast<size_t>(n - 1)) << o.text;
    }
    EXPECT_EQ(texts.size(), orders.size()) << "orders repeat for " << n << " matrices";
    EXPECT_EQ(orders.front().text, lab::chain_left_to_right(n).text);
    EXPECT_EQ(orders.back().text, lab::chain_right_to_left(n).text);
  }
  const auto three = lab::chain_all_orders(3);
  ASSERT_EQ(three.size(), 2u);
  EXPECT_EQ(three[0].text, "((A1 A2) A3)");
  EXPECT_EQ(three[1].text, "(A1 (A2 A3))");
  EXPECT_EQ(lab::chain_left_to_right(4).text, "(((A1 A2) A3) A4)");
  EXPECT_EQ(lab::chain_right_to_left(4).text, "(A1 (A2 (A3 A4)))");
  EXPECT_EQ(lab::chain_order_count(6), 21);  // 42 saturates just above kChainMaxOrders = 20
}

TEST(BenchChain, FlopsAreTwoMnkSummed) {
  // 8x4096 4096x4096 4096x8: left to right 2 (8*4096*4096 + 8*4096*8), right to left
  // 2 (4096*4096*8 + 8*4096*8): the same here; with a fourth matrix the orders split by 64x.
  const std::vector<long long> dims = {8, 4096, 4096, 8};
  EXPECT_EQ(lab::chain_flops(lab::chain_left_to_right(3), dims), 2.0 * (8.0 * 4096 * 4096 + 8.0 * 4096 * 8));
  EXPECT_EQ(lab::chain_flops(lab::chain_right_to_left(3), dims), 2.0 * (4096.0 * 4096 * 8 + 8.0 * 4096 * 8));
  const std::vector<long long> four = {8, 4096, 4096, 4096, 8};
  const auto orders = lab::chain_all_orders(4);
  double lo = 1e300, hi = 0;
  for (const auto& o : orders) {
    lo = std::min(lo, lab::chain_flops(o, four));
    hi = std::max(hi, lab::chain_flops(o, four));
  }
  EXPECT_EQ(hi, 2.0 * (4096.0 * 4096 * 4096 + 8.0 * 4096 * 4096 + 8.0 * 4096 * 8));
  EXPECT_GT(hi / lo, 200.0);
}

TEST(BenchChain, DynamicProgramHasTheFewestFlops) {
  // The textbook example (Cormen et al., section 15.2): 15125 multiply-adds.
  const std::vector<long long> clrs = {30, 35, 15, 5, 10, 20, 25};
  const lab::ChainOrder best = lab::chain_optimal_order(clrs);
  EXPECT_EQ(best.text, "((A1 (A2 A3)) ((A4 A5) A6))");
  EXPECT_EQ(lab::chain_flops(best, clrs), 2.0 * 15125);
  // Ties: the order listed first (left to right when it is among the cheapest).
  EXPECT_EQ(lab::chain_optimal_order({8, 4096, 4096, 4096, 8}).text, "(((A1 A2) A3) A4)");
  EXPECT_EQ(lab::chain_optimal_order({5, 5, 5, 5}).text, "((A1 A2) A3)");
  // Brute force over every order of random chains of 2 to 7 matrices.
  std::mt19937 rng(12345);
  for (int trial = 0; trial < 300; ++trial) {
    const int n = 2 + static_cast<int>(rng() % 6);
    std::vector<long long> dims;
    for (int i = 0; i <= n; ++i) dims.push_back(1 + static_cast<long long>(rng() % 60));
    double fewest = 1e300;
    std::set<std::string> texts;
    for (const auto& o : lab::chain_all_orders(n)) {
      fewest = std::min(fewest, lab::chain_flops(o, dims));
      texts.insert(o.text);
    }
    const lab::ChainOrder dp = lab::chain_optimal_order(dims);
    EXPECT_EQ(lab::chain_flops(dp, dims), fewest) << "trial " << trial;
    EXPECT_EQ(texts.count(dp.text), 1u) << dp.text;
    for (const auto& o : lab::chain_all_orders(n)) {  // the first of the cheapest in listing order
      if (lab::chain_flops(o, dims) != fewest) continue;
      EXPECT_EQ(o.text, dp.text) << "trial " << trial;
      break;
    }
  }
}

TEST(BenchChain, ResultsAreExactOnIntegerInputs) {
  // Small integers: every partial sum is an integer far below 2^24, so every order must give the
  // same bits.
  lab::gemm_set_threads(1);
  const std::vector<long long> dims = {5, 17, 9, 13, 6};
  std::mt19937 rng(7);
  std::vector<lab::Tensor> mats;
  for (size_t i = 0; i + 1 < dims.size(); ++i) {
    mats.emplace_back(std::vector<int64_t>{dims[i], dims[i + 1]});
    for (float& v : mats.back().data) v = static_cast<float>(static_cast<int>(rng() % 5) - 2);
  }
  const auto orders = lab::chain_all_orders(4);
  std::vector<lab::Tensor> scratch;
  const lab::Tensor first = lab::chain_multiply(orders[0], dims, mats, scratch);
  ASSERT_EQ(first.shape, (std::vector<int64_t>{5, 6}));
  for (const auto& o : orders) {
    std::vector<lab::Tensor> s;
    EXPECT_EQ(lab::chain_multiply(o, dims, mats, s).data, first.data) << o.text;
  }
}

TEST(BenchChain, ResultsAgreeToRoundingAcrossOrders) {
  // Random values in [-1, 1], sums of up to 300 products: each order is within a few sqrt(k) u
  // (u = 6e-8, sqrt(300) u = 1e-6) of the exact product, computed here in double. Measured:
  // 3.5e-7 to 4.4e-7 from the exact product, up to 7.3e-7 between orders; 1e-5 is the bound.
  lab::gemm_set_threads(1);
  const std::vector<long long> dims = {7, 300, 200, 150, 5};
  const auto mats = random_chain(dims, 3);
  const std::vector<double> exact = chain_in_double(dims, mats);
  double scale = 0;
  for (double v : exact) scale = std::max(scale, std::fabs(v));
  std::vector<lab::Tensor> scratch;
  const lab::Tensor first = lab::chain_multiply(lab::chain_all_orders(4)[0], dims, mats, scratch);
  for (const auto& o : lab::chain_all_orders(4)) {
    std::vector<lab::Tensor> s;
    const lab::Tensor& c = lab::chain_multiply(o, dims, mats, s);
    double diff = 0;
    for (size_t i = 0; i < exact.size(); ++i) diff = std::max(diff, std::fabs(c.data[i] - exact[i]));
    EXPECT_LT(diff / scale, 1e-5) << o.text;
    EXPECT_LT(lab::chain_max_rel_diff(c, first), 1e-5) << o.text;
  }
}

TEST(BenchChain, MaxRelDiffIsRelativeToTheLargestElement) {
  lab::Tensor ref({1, 3}), c({1, 3});
  ref.data = {4.0f, -2.0f, 0.0f};
  c.data = {4.0f, -2.0f, 0.5f};  // 0.5 off where the reference is 0: 0.5 / 4
  EXPECT_DOUBLE_EQ(lab::chain_max_rel_diff(c, ref), 0.125);
  EXPECT_DOUBLE_EQ(lab::chain_max_rel_diff(ref, ref), 0.0);
}

TEST(BenchChain, DynamicProgramOrderIsFastWhereTheFlopGapIsLarge) {
  // 4x512 512x512 512x512 512x4: the orders that multiply the two square matrices first do 64x
  // the FLOPs of the others. A timing test on a shared 2-core machine: a generous margin, and
  // only on this gap (the cheap orders may differ among themselves by their shapes' efficiency).
  lab::BenchChainOptions o;
  o.dims = {4, 512, 512, 512, 4};
  o.threads = {1};
  o.seconds = 0.02;
  o.rounds = 5;
  const nlohmann::json j = run_chain(o);
  double fewest = 1e300, most = 0, t_opt = 0, t_fast = 1e300, t_slow = 0;
  for (const auto& ord : j["orders"]) {
    const double flops = ord["flops"].get<double>();
    const double t = ord["results"][0]["time_ms"].get<double>();
    fewest = std::min(fewest, flops);
    most = std::max(most, flops);
    t_fast = std::min(t_fast, t);
    t_slow = std::max(t_slow, t);
    if (ord["is_optimal"].get<bool>()) t_opt = t;
  }
  ASSERT_GE(most / fewest, 50.0);
  EXPECT_LT(t_opt * 5, t_slow) << "the optimal order is not clearly faster than the slowest";
  EXPECT_LT(t_opt, 3 * t_fast) << "the optimal order is far from the fastest";
}

TEST(BenchChain, JsonHasTheDocumentedKeys) {
  lab::BenchChainOptions o;
  o.dims = {3, 40, 50, 6};
  o.threads = {2, 1, 2};  // sorted and deduplicated: 1, 2
  o.seconds = 0.001;
  o.rounds = 1;
  std::string printed;
  const nlohmann::json j = run_chain(o, &printed);
  EXPECT_EQ(j["command"], "bench chain");
  EXPECT_EQ(j["dims"], (std::vector<long long>{3, 40, 50, 6}));
  EXPECT_EQ(j["threads"], (std::vector<int>{1, 2}));
  EXPECT_EQ(j["optimal"], lab::chain_optimal_order(o.dims).text);
  EXPECT_EQ(j["tolerance"].get<double>(), lab::kChainRelTolerance);
  EXPECT_TRUE(j["ratio_slowest_fastest"].get<double>() >= 1.0);
  ASSERT_EQ(j["orders"].size(), 2u);
  int optimal = 0;
  for (const auto& ord : j["orders"]) {
    for (const char* k : {"order", "flops", "is_optimal", "results"}) EXPECT_TRUE(ord.contains(k)) << k;
    optimal += ord["is_optimal"].get<bool>() ? 1 : 0;
    ASSERT_EQ(ord["results"].size(), 2u);
    for (const auto& r : ord["results"])
      for (const char* k : {"threads", "time_ms", "gflops", "max_rel_diff", "scaling"}) EXPECT_TRUE(r.contains(k)) << k;
    EXPECT_EQ(ord["results"][0]["threads"], 1);
    EXPECT_EQ(ord["results"][1]["threads"], 2);
    EXPECT_LT(ord["results"][1]["max_rel_diff"].get<double>(), 1e-5);
  }
  EXPECT_EQ(optimal, 1);
  // A JSON pointer as a lesson would read it.
  EXPECT_EQ(j.at(nlohmann::json::json_pointer("/orders/0/order")), "((A1 A2) A3)");
  EXPECT_NE(printed.find("thread scaling"), std::string::npos);
  EXPECT_EQ(last_line(printed).rfind("ratio slowest/fastest order ", 0), 0u) << last_line(printed);
}

TEST(BenchChain, BadFlagsGiveClearErrors) {
  auto error_of = [](const std::vector<std::string>& args) -> std::string {
    try {
      commands::CommandSpec spec = commands::parse_command("bench chain", args);
      spec.bench_chain.seconds = 0.001;
      spec.bench_chain.rounds = 1;
      testutil::TempDir tmp;
      std::FILE* f = std::fopen(tmp.file("out.txt").c_str(), "w");
      spec.bench_chain.out = f;
      try {
        lab::bench_chain(spec.bench_chain);
      } catch (...) {
        std::fclose(f);
        throw;
      }
      std::fclose(f);
    } catch (const lab::ConfigError& e) {
      return e.what();
    }
    return "";
  };
  std::string e = error_of({"--dims", "8,4096"});
  EXPECT_NE(e.find("--dims"), std::string::npos) << e;
  EXPECT_NE(e.find("at least 3 dims"), std::string::npos) << e;
  e = error_of({"--dims", "8,0,8"});
  EXPECT_NE(e.find("--dims"), std::string::npos) << e;
  EXPECT_NE(e.find("got 0"), std::string::npos) << e;
  e = error_of({"--dims", "1,100000,100000,1"});  // A2 alone: 37 GiB
  EXPECT_NE(e.find("--dims"), std::string::npos) << e;
  EXPECT_NE(e.find("A2 (100000 x 100000)"), std::string::npos) << e;
  e = error_of({"--dims", "20000,2,20000,2"});  // inputs of 156 KiB, but (A1 A2) is 20000 x 20000: 1.49 GiB
  EXPECT_NE(e.find("the product A1..A2"), std::string::npos) << e;
  e = error_of({"--dims", "8,8,8", "--threads", "1,0"});
  EXPECT_NE(e.find("--threads"), std::string::npos) << e;
  e = error_of({"--dims", "8,x,8"});
  EXPECT_NE(e.find("--dims"), std::string::npos) << e;
  // On the command line: exit 2 and the message.
  const testutil::CliResult r = testutil::run_cli("bench chain --dims 8,-3,8");
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("--dims: every dim must be at least 1, got -3"), std::string::npos) << r.out;
}

TEST(BenchChain, RunsFromTheCommandLineAndForLessons) {
  const auto& cmds = commands::lesson_commands();
  EXPECT_NE(std::find(cmds.begin(), cmds.end(), "bench chain"), cmds.end());
  const testutil::CliResult r = testutil::run_cli("bench chain --dims 4,64,64,64,4 --seconds 0.005 --rounds 1");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("* "), std::string::npos) << r.out;  // the optimal order is marked
  EXPECT_EQ(last_line(r.out).rfind("ratio slowest/fastest order ", 0), 0u) << r.out;
}
