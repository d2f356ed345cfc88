// BenchResult: the result.json of `dtlab bench train` (a sweep over batch sizes, and the same
// batch one sample at a time) or `dtlab bench chain` (every parenthesization of a matrix chain),
// read into plain structs for the lab window's Benchmark view (viz/panel_bench.cpp). The file is
// the contract: this reads what commands/bench_train.cpp and commands/bench_chain.cpp write (their headers
// list the keys), and refuses anything else with an error naming the file and the field.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace viz {

// ---- bench train ----

// One batch size of the sweep (--batch-sizes): one training step (forward, backward, SGD) on B
// samples per rank.
struct BenchSweepRow {
  int64_t batch_size = 0;
  double step_ms = 0;
  double ms_per_sample = 0;       // step_ms / (B x world_size)
  double samples_per_s = 0;
  double gflops = 0;              // samples/s x training FLOPs per sample
  double speedup_per_sample = 0;  // the smallest size's ms_per_sample / this one's
};

// --per-sample: one batched step of B samples against B passes of one sample each (gradients
// accumulated x 1/B, one SGD step), at the same initial weights.
struct BenchPerSample {
  int64_t batch_size = 0;
  double batched_ms = 0, per_sample_ms = 0;
  double ratio = 0;                     // per_sample_ms / batched_ms
  std::optional<double> grad_max_rel_diff;
  std::string grad_max_rel_param;       // the parameter where it is largest
  std::optional<double> same_computation_max_rel_diff;  // absent (null) where no batched step computes the same
  std::string batchnorm;                // none | frozen | train
  std::string batchnorm_note, train_mode_error;
};

struct BenchTrainResult {
  std::string model, sgemm, producer;
  bool batchnorm = true;
  int64_t world_size = 1, threads = 1;
  int64_t train_flops_per_sample = 0;   // 0: not written
  std::vector<BenchSweepRow> sweep;     // increasing batch size; empty without --batch-sizes
  double ratio_smallest_largest = 0;    // with a sweep: the smallest size's ms per sample / the largest's
  std::optional<BenchPerSample> per_sample;
};

// ---- bench chain ----

struct BenchChainTiming {
  int64_t threads = 1;
  double time_ms = 0, gflops = 0;
  double max_rel_diff = 0;              // against the first order's result at the first thread count
  double scaling = 1;                   // time at the first thread count / this one's
};

struct BenchChainOrder {
  std::string order;                    // "((A1 A2) A3)"
  double flops = 0;                     // 2 m n k summed over its products
  bool is_optimal = false;              // the dynamic program's order
  std::vector<BenchChainTiming> results;  // one per thread count, in BenchChainResult::threads' order
};

struct BenchChainResult {
  std::string sgemm, producer;
  std::vector<int64_t> dims;            // A_i is dims[i-1] x dims[i]
  std::vector<int64_t> threads;         // the thread counts, as run
  std::string optimal;                  // the dynamic program's order
  double optimal_flops = 0;
  double tolerance = 0;                 // the bound on max_rel_diff (0: not written)
  double ratio_slowest_fastest = 0;     // at the first thread count
  std::vector<BenchChainOrder> orders;
};

// One product of an order: (m x k) times (k x n), 2 m k n FLOPs.
struct ChainProductShape {
  int64_t m = 0, k = 0, n = 0;
  double flops() const { return 2.0 * static_cast<double>(m) * static_cast<double>(k) * static_cast<double>(n); }
};
// The products of an order such as "((A1 (A2 A3)) A4)" over dims, in evaluation order (operands
// first): what makes one order cost more than another. Empty when the text is not a
// parenthesization of A1..An for these dims (a hand-edited file): the view then shows less.
std::vector<ChainProductShape> chain_products(const std::string& order, const std::vector<int64_t>& dims);

// ---- either ----

enum class BenchKind { None, Train, Chain };

struct BenchResult {
  BenchKind kind = BenchKind::None;
  std::string source;                   // the file it was read from
  BenchTrainResult train;               // kind == Train
  BenchChainResult chain;               // kind == Chain
};

// What a file may hold at most (a bench run writes far fewer: kChainMaxOrders orders).
constexpr size_t kBenchMaxRows = 256;

// Reads a result.json, or the directory holding one (a lesson's bench run: result.json and
// output.txt). Throws lab::IoError naming the file and the field at fault ("/orders/2/time_ms:
// expected a number, got a string"), with a hint that says which commands write such a file.
BenchResult load_bench_result(const std::string& path);
// The same from text; `path` is only used in messages.
BenchResult parse_bench_result(const std::string& text, const std::string& path);
// Whether --open PATH means a bench result rather than a run directory: a regular file, or a
// directory without config.toml that holds result.json, or whose outcome.json says it is a
// lesson's bench run (which may have failed before writing its result: load_bench_result then
// says so).
bool looks_like_bench_result(const std::string& path);
// One line for people: "bench chain: 5 orders of 8x2048 ... at 1, 2 threads".
std::string describe_bench(const BenchResult& r);

}  // namespace viz
