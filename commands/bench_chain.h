// dtlab bench chain: "does matrix-chain order matter, and does a matrix product use every core?"
// The chain A1 A2 ... An, Ai of dims[i-1] x dims[i] (row-major float32, deterministic
// pseudo-random values in [-1, 1] from TorchGenerator(seed), drawn matrix by matrix), multiplied
// with the lab's sgemm in every parenthesization (Catalan(n-1) of them; when there are more than
// kChainMaxOrders: left to right, right to left and the optimal one), at every thread count of
// --threads (sgemm's threads, gemm_set_threads).
//
// Per order and thread count: FLOPs (2 m n k summed over its products), time (median of `rounds`
// rounds of about `seconds`, at least one multiplication each, after one warm-up
// multiplication; every intermediate is allocated before timing, so the time is the products'),
// GFLOP/s, and max_rel_diff = max |C - C_ref| / max |C_ref| against the first order's result at
// the first thread count (relative to the largest element: an element that cancels to almost zero
// would make an elementwise relative difference meaningless). Every result must agree to
// rounding: max_rel_diff above kChainRelTolerance is an error (exit 1, after the tables).
// The optimal order is the classic O(n^3) dynamic program over the dims (cost: multiply-adds).
// With several thread counts it prints each order's scaling, time at the first (smallest) count /
// time at N. The last line printed is `ratio slowest/fastest order <x>` at the smallest count.
//
// --json: {"command": "bench chain", "producer", "sgemm", "seed", "dims": [...], "threads": [...],
//   "optimal": "((A1 A2) A3)", "optimal_flops", "optimal_time_ms" (its time at the first thread
//   count; 0 when it is not among the orders timed), "tolerance", "ratio_slowest_fastest", "noise",
//   "contention", "orders": [{"order": "...", "flops": ..., "is_optimal": bool (the dynamic
//     program's order), "results": [{"threads": 1, "time_ms", "gflops", "max_rel_diff",
//     "scaling", "noise", "contention"}]}]}
//   ("scaling": time at the first thread count / this one's; 1 for the first; "noise": (slowest
//   round - fastest) / median; "contention": cores' worth of CPU other programs took from the
//   cores it needed (bench_rounds.h); the top-level ones are the largest of them).
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "tensor.h"

namespace lab {

struct BenchChainOptions {
  std::vector<long long> dims = {8, 4096, 4096, 4096, 8};  // A_i is dims[i-1] x dims[i]
  std::vector<int> threads = {1};                         // sgemm threads; every order runs at each
  double seconds = 0.3;
  int rounds = 5;
  uint64_t seed = 0;
  std::string json_out;      // also write the figures here as JSON
  std::FILE* out = nullptr;  // where the figures are printed (nullptr: stdout)
};

// Returns an exit code; throws ConfigError for bad flags, Error when results disagree.
int bench_chain(const BenchChainOptions& opt);

// Beyond this many parenthesizations only left to right, right to left and the optimal run.
constexpr int kChainMaxOrders = 20;
// The largest matrix (input, intermediate or result) a chain may need, in bytes.
constexpr double kChainMaxMatrixBytes = 1024.0 * 1024 * 1024;
// What a chain may hold at once: the inputs, one order's products and the reference result.
constexpr double kChainMaxTotalBytes = 4.0 * 1024 * 1024 * 1024;
// Bound on max_rel_diff between orders. A float32 sum of k products is off by at most about k u
// relative to the sum of magnitudes (u = 2^-24 = 6e-8: 2.4e-4 for k = 4096), typically by
// sqrt(k) u (4e-6); a few chained products add their errors. 1e-3 flags a real mistake (a wrong
// operand, a transposed matrix: differences of order 1) and never rounding at these sizes.
constexpr double kChainRelTolerance = 1e-3;

// One product of an order: (the product of matrices i..k) x (the product of k+1..j), 0-based and
// inclusive; its result is dims[i] x dims[j + 1].
struct ChainProduct {
  int i = 0, k = 0, j = 0;
};

struct ChainOrder {
  std::string text;                    // "((A1 A2) A3)"; one matrix: "A1"
  std::vector<ChainProduct> products;  // in evaluation order: operands before the products using them
};

// 2 m n k summed over the order's products (double: exact below 2^53, never overflows).
double chain_flops(const ChainOrder& order, const std::vector<long long>& dims);
// Every parenthesization of n >= 1 matrices (Catalan(n-1) of them), left to right first.
std::vector<ChainOrder> chain_all_orders(int n);
// The number of parenthesizations of n matrices, Catalan(n-1), saturated at max_value + 1.
long long chain_order_count(int n, long long max_value = kChainMaxOrders);
ChainOrder chain_left_to_right(int n);  // (((A1 A2) A3) A4)
ChainOrder chain_right_to_left(int n);  // (A1 (A2 (A3 A4)))
// The classic dynamic program: m[i][j] = min over k of m[i][k] + m[k+1][j] + d_i d_(k+1) d_(j+1)
// multiply-adds, O(n^3); ties go to the largest k, so that of orders with equal FLOPs the one
// chain_all_orders lists first is chosen (left to right where it is optimal).
ChainOrder chain_optimal_order(const std::vector<long long>& dims);
// The product of the chain in this order with sgemm. mats[i]: (dims[i], dims[i + 1]).
// scratch: one tensor per product (resized here; reuse it across calls so that timing sees no
// allocation). Returns scratch.back() (dims[0], dims[n]), or mats[0] for a chain of one.
const Tensor& chain_multiply(const ChainOrder& order, const std::vector<long long>& dims,
                             const std::vector<Tensor>& mats, std::vector<Tensor>& scratch);
// max |c - ref| / max |ref| (max |c - ref| when ref is all zeros). c, ref: the same shape.
double chain_max_rel_diff(const Tensor& c, const Tensor& ref);

}  // namespace lab
