// dtlab bench chain (bench_chain.h says what it measures and prints).
//
// Sections: orders (enumeration, the dynamic program, FLOPs) | evaluation with sgemm | the
// command: validation, timing, tables, JSON
#include "bench_chain.h"
#include "bench_rounds.h"
#include "mutation.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>

#include <nlohmann/json.hpp>

#include "command_line.h"
#include "config.h"
#include "errors.h"
#include "events.h"
#include "gemm.h"
#include "torch_rng.h"

namespace lab {

// ---- orders ----

namespace {

std::string matrix_name(int i) { return "A" + std::to_string(i + 1); }

// Every parenthesization of matrices i..j: for each split k (from the right, so that the first
// one is left to right), every left order times every right order.
std::vector<ChainOrder> orders_of(int i, int j) {
  if (i == j) return {ChainOrder{matrix_name(i), {}}};
  std::vector<ChainOrder> out;
  for (int k = j - 1; k >= i; --k) {
    const std::vector<ChainOrder> left = orders_of(i, k), right = orders_of(k + 1, j);
    for (const ChainOrder& l : left)
      for (const ChainOrder& r : right) {
        ChainOrder o{"(" + l.text + " " + r.text + ")", l.products};
        o.products.insert(o.products.end(), r.products.begin(), r.products.end());
        o.products.push_back({i, k, j});
        out.push_back(std::move(o));
      }
  }
  return out;
}

// The order given by split[i][j] (the k of interval i..j), built recursively.
ChainOrder order_from_splits(const std::vector<std::vector<int>>& split, int i, int j) {
  if (i == j) return {matrix_name(i), {}};
  const int k = split[static_cast<size_t>(i)][static_cast<size_t>(j)];
  const ChainOrder l = order_from_splits(split, i, k), r = order_from_splits(split, k + 1, j);
  ChainOrder o{"(" + l.text + " " + r.text + ")", l.products};
  o.products.insert(o.products.end(), r.products.begin(), r.products.end());
  o.products.push_back({i, k, j});
  return o;
}

}  // namespace

double chain_flops(const ChainOrder& order, const std::vector<long long>& dims) {
  double flops = 0;
  for (const ChainProduct& p : order.products)
    flops += 2.0 * static_cast<double>(dims[static_cast<size_t>(p.i)]) *
             static_cast<double>(dims[static_cast<size_t>(p.k + 1)]) *
             static_cast<double>(dims[static_cast<size_t>(p.j + 1)]);
  return flops;
}

std::vector<ChainOrder> chain_all_orders(int n) {
  assert(n >= 1);
  return orders_of(0, n - 1);
}

long long chain_order_count(int n, long long max_value) {
  // Catalan(m) = Catalan(m - 1) * 2 (2m - 1) / (m + 1), exact in integers.
  long long c = 1;
  for (int m = 1; m <= n - 1; ++m) {
    c = c * 2 * (2 * m - 1) / (m + 1);
    if (c > max_value) return max_value + 1;
  }
  return c;
}

ChainOrder chain_left_to_right(int n) {
  std::vector<std::vector<int>> split(static_cast<size_t>(n), std::vector<int>(static_cast<size_t>(n), 0));
  for (int i = 0; i < n; ++i)
    for (int j = i + 1; j < n; ++j) split[static_cast<size_t>(i)][static_cast<size_t>(j)] = j - 1;
  return order_from_splits(split, 0, n - 1);
}

ChainOrder chain_right_to_left(int n) {
  std::vector<std::vector<int>> split(static_cast<size_t>(n), std::vector<int>(static_cast<size_t>(n), 0));
  for (int i = 0; i < n; ++i)
    for (int j = i + 1; j < n; ++j) split[static_cast<size_t>(i)][static_cast<size_t>(j)] = i;
  return order_from_splits(split, 0, n - 1);
}

ChainOrder chain_optimal_order(const std::vector<long long>& dims) {
  const int n = static_cast<int>(dims.size()) - 1;
  assert(n >= 1);
  const auto d = [&](int i) { return static_cast<double>(dims[static_cast<size_t>(i)]); };
  // cost[i][j]: fewest multiply-adds for matrices i..j (double: exact below 2^53, no overflow)
  std::vector<std::vector<double>> cost(static_cast<size_t>(n), std::vector<double>(static_cast<size_t>(n), 0.0));
  std::vector<std::vector<int>> split(static_cast<size_t>(n), std::vector<int>(static_cast<size_t>(n), 0));
  // a lesson's mutation test (mutation.h): the program made wrong, it keeps the costliest split
  const double sign = mutated("chain-dp-costliest") ? -1.0 : 1.0;
  for (int len = 2; len <= n; ++len)
    for (int i = 0; i + len - 1 < n; ++i) {
      const int j = i + len - 1;
      double best = std::numeric_limits<double>::infinity();
      for (int k = i; k < j; ++k) {
        const double c = cost[static_cast<size_t>(i)][static_cast<size_t>(k)] +
                         cost[static_cast<size_t>(k + 1)][static_cast<size_t>(j)] + d(i) * d(k + 1) * d(j + 1);
        if (sign * c <= best) {  // ties: the largest k, so that of equal orders the one listed first wins
          best = sign * c;
          split[static_cast<size_t>(i)][static_cast<size_t>(j)] = k;
        }
      }
      cost[static_cast<size_t>(i)][static_cast<size_t>(j)] = sign * best;
    }
  return order_from_splits(split, 0, n - 1);
}

// ---- evaluation ----

const Tensor& chain_multiply(const ChainOrder& order, const std::vector<long long>& dims,
                             const std::vector<Tensor>& mats, std::vector<Tensor>& scratch) {
  if (order.products.empty()) return mats.front();
  scratch.resize(order.products.size());
  // Where the product of interval (i, j) lives: an input (i == j) or an earlier product's result.
  std::map<std::pair<int, int>, const Tensor*> value;
  for (size_t i = 0; i < mats.size(); ++i) value[{static_cast<int>(i), static_cast<int>(i)}] = &mats[i];
  for (size_t p = 0; p < order.products.size(); ++p) {
    const ChainProduct& q = order.products[p];
    const Tensor* a = value.at({q.i, q.k});      // (m, kk)
    const Tensor* b = value.at({q.k + 1, q.j});  // (kk, nn)
    const int m = static_cast<int>(dims[static_cast<size_t>(q.i)]);
    const int kk = static_cast<int>(dims[static_cast<size_t>(q.k + 1)]);
    const int nn = static_cast<int>(dims[static_cast<size_t>(q.j + 1)]);
    Tensor& c = scratch[p];  // (m, nn)
    if (c.shape != std::vector<int64_t>{m, nn}) c.resize({m, nn});
    sgemm(false, false, m, nn, kk, 1.0f, a->ptr(), kk, b->ptr(), nn, 0.0f, c.ptr(), nn);
    value[{q.i, q.j}] = &c;
  }
  return scratch.back();
}

double chain_max_rel_diff(const Tensor& c, const Tensor& ref) {
  assert(c.shape == ref.shape);
  double diff = 0, scale = 0;
  for (size_t i = 0; i < c.data.size(); ++i) {
    diff = std::max(diff, std::fabs(static_cast<double>(c.data[i]) - ref.data[i]));
    scale = std::max(scale, std::fabs(static_cast<double>(ref.data[i])));
    if (std::isnan(c.data[i]) != std::isnan(ref.data[i])) diff = std::numeric_limits<double>::infinity();
  }
  return scale > 0 ? diff / scale : diff;
}

// ---- the command ----

namespace {

std::string join_numbers(const std::vector<long long>& v, const char* sep) {
  std::string s;
  for (long long x : v) s += (s.empty() ? "" : sep) + std::to_string(x);
  return s;
}

// Bytes of the largest matrix (input or product result) among the orders, and its description.
std::pair<double, std::string> largest_matrix(const std::vector<ChainOrder>& orders, const std::vector<long long>& dims) {
  std::pair<double, std::string> best{0.0, ""};
  auto consider = [&](int i, int j, const std::string& what) {
    const double bytes = 4.0 * static_cast<double>(dims[static_cast<size_t>(i)]) *
                         static_cast<double>(dims[static_cast<size_t>(j + 1)]);
    if (bytes > best.first)
      best = {bytes, what + " (" + std::to_string(dims[static_cast<size_t>(i)]) + " x " +
                         std::to_string(dims[static_cast<size_t>(j + 1)]) + ")"};
  };
  for (int i = 0; i + 1 < static_cast<int>(dims.size()); ++i) consider(i, i, matrix_name(i));
  for (const ChainOrder& o : orders)
    for (const ChainProduct& p : o.products)
      consider(p.i, p.j, "the product " + matrix_name(p.i) + ".." + matrix_name(p.j) + " of " + o.text);
  return best;
}

// Seconds of one call, median and noise of the rounds: one warm-up call (it also touches every
// page of the results), then `rounds` rounds of about `seconds`, at least one call each.
template <class Fn>
RoundTimes median_seconds(Fn&& fn, double seconds, int rounds, int threads) {
  double t0 = now_seconds();
  fn();
  const double first = now_seconds() - t0;
  const int calls = static_cast<int>(std::max(1.0, std::min(1e6, seconds / std::max(first, 1e-9))));
  std::vector<double> ts;
  const Contention others(threads);
  for (int r = 0; r < rounds; ++r) {
    t0 = now_seconds();
    for (int i = 0; i < calls; ++i) fn();
    ts.push_back((now_seconds() - t0) / calls);
  }
  RoundTimes times = round_times(std::move(ts));
  times.contention = others.cores();
  return times;
}

struct OrderResult {
  double seconds = 0;
  double noise = 0;
  double contention = 0;
  double max_rel_diff = 0;
};

}  // namespace

int bench_chain(const BenchChainOptions& opt) {
  std::FILE* out = opt.out ? opt.out : stdout;
  // ---- validation: every flag and value named ----
  if (opt.dims.size() < 3)
    throw ConfigError("--dims: give at least 3 dims (2 matrices: A1 is d0 x d1, A2 is d1 x d2), got " +
                          std::to_string(opt.dims.size()) + (opt.dims.empty() ? "" : " (" + join_numbers(opt.dims, ",") + ")"),
                      "for example --dims 8,4096,4096,8");
  if (opt.dims.size() > 65) throw ConfigError("--dims: at most 64 matrices (65 dims), got " + std::to_string(opt.dims.size()));
  for (long long d : opt.dims)
    if (d < 1) throw ConfigError("--dims: every dim must be at least 1, got " + std::to_string(d));
  if (opt.threads.empty()) throw ConfigError("--threads: give at least one thread count");
  for (int t : opt.threads)
    if (t < 1 || t > 1024) throw ConfigError("--threads: every thread count must be in 1..1024, got " + std::to_string(t));
  if (opt.rounds < 1) throw ConfigError("--rounds must be at least 1, got " + std::to_string(opt.rounds));
  if (!(opt.seconds > 0)) throw ConfigError("--seconds must be positive, got " + std::to_string(opt.seconds));
  std::vector<int> thread_counts = opt.threads;
  std::sort(thread_counts.begin(), thread_counts.end());
  thread_counts.erase(std::unique(thread_counts.begin(), thread_counts.end()), thread_counts.end());

  const std::vector<long long>& dims = opt.dims;
  const int n = static_cast<int>(dims.size()) - 1;
  const long long count = chain_order_count(n);
  const bool all = count <= kChainMaxOrders;
  const ChainOrder optimal = chain_optimal_order(dims);
  std::vector<ChainOrder> orders;
  if (all) {
    orders = chain_all_orders(n);
  } else {
    for (const ChainOrder& o : {chain_left_to_right(n), chain_right_to_left(n), optimal}) {
      bool seen = false;
      for (const ChainOrder& p : orders) seen = seen || p.text == o.text;
      if (!seen) orders.push_back(o);
    }
  }
  const auto [largest_bytes, largest_what] = largest_matrix(orders, dims);
  auto gib = [](double bytes) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.3g GiB", bytes / (1024.0 * 1024 * 1024));
    return std::string(buf);
  };
  if (largest_bytes > kChainMaxMatrixBytes)
    throw ConfigError("--dims: the largest matrix, " + largest_what + ", would take " + gib(largest_bytes) +
                          "; bench chain allows " + gib(kChainMaxMatrixBytes) + " per matrix",
                      "choose smaller dims");
  // What is held at once: the inputs, one order's products and the reference result.
  double held = 4.0 * static_cast<double>(dims.front()) * static_cast<double>(dims.back());
  for (int i = 0; i + 1 < static_cast<int>(dims.size()); ++i)
    held += 4.0 * static_cast<double>(dims[static_cast<size_t>(i)]) * static_cast<double>(dims[static_cast<size_t>(i + 1)]);
  double most_products = 0;
  for (const ChainOrder& o : orders) {
    double bytes = 0;
    for (const ChainProduct& p : o.products)
      bytes += 4.0 * static_cast<double>(dims[static_cast<size_t>(p.i)]) * static_cast<double>(dims[static_cast<size_t>(p.j + 1)]);
    most_products = std::max(most_products, bytes);
  }
  if (held + most_products > kChainMaxTotalBytes)
    throw ConfigError("--dims: the inputs and one order's products would take " + gib(held + most_products) +
                          " at once; bench chain allows " + gib(kChainMaxTotalBytes),
                      "choose smaller dims or fewer matrices");
  const double optimal_flops = chain_flops(optimal, dims);

  std::string shapes;
  for (int i = 0; i < n; ++i)
    shapes += (i ? ", " : "") + matrix_name(i) + " " + std::to_string(dims[static_cast<size_t>(i)]) + "x" +
              std::to_string(dims[static_cast<size_t>(i + 1)]);
  std::vector<long long> tl(thread_counts.begin(), thread_counts.end());
  std::fprintf(out, "# dtlab %s bench chain dims=%s (%s) threads=%s sgemm=%s seed=%llu\n", kDtlabVersion,
               join_numbers(dims, ",").c_str(), shapes.c_str(), join_numbers(tl, ",").c_str(), gemm_backend_name(),
               static_cast<unsigned long long>(opt.seed));
  std::fprintf(out, "# float32, row-major sgemm; values in [-1, 1]; time: median of %d rounds of ~%g s (at least one "
                    "chain each) after one warm-up chain, intermediates allocated before timing\n",
               opt.rounds, opt.seconds);
  std::fprintf(out, "# max_rel_diff = max |C - C_ref| / max |C_ref|, C_ref = the first order's result at %d thread(s); "
                    "bound %g\n",
               thread_counts.front(), kChainRelTolerance);
  std::fprintf(out, "orders: %zu of %s%s\n", orders.size(),
               all ? std::to_string(count).c_str() : (">" + std::to_string(kChainMaxOrders)).c_str(),
               all ? " (every parenthesization)" : " (left to right, right to left, optimal)");
  std::fprintf(out, "optimal order (dynamic program over the dims, O(n^3) in the %d matrices): %s, %.0f FLOPs\n", n,
               optimal.text.c_str(), optimal_flops);
  std::fflush(out);

  // Inputs, drawn matrix by matrix from one generator.
  TorchGenerator g(opt.seed);
  std::vector<Tensor> mats;
  for (int i = 0; i < n; ++i) {
    mats.emplace_back(std::vector<int64_t>{dims[static_cast<size_t>(i)], dims[static_cast<size_t>(i + 1)]});
    g.uniform_(mats.back().ptr(), mats.back().numel(), -1.0, 1.0);
  }

  size_t width = 5;
  for (const ChainOrder& o : orders) width = std::max(width, o.text.size());
  // results[t][o]
  std::vector<std::vector<OrderResult>> results(thread_counts.size(), std::vector<OrderResult>(orders.size()));
  Tensor reference;
  double worst_diff = 0;
  std::string worst_what;
  for (size_t ti = 0; ti < thread_counts.size(); ++ti) {
    gemm_set_threads(thread_counts[ti]);
    std::fprintf(out, "\nthreads %d\n  %-*s %14s %7s %11s %9s %13s\n", thread_counts[ti], static_cast<int>(width),
                 "order", "GFLOP", "x_opt", "time_ms", "GFLOP/s", "max_rel_diff");
    for (size_t oi = 0; oi < orders.size(); ++oi) {
      const ChainOrder& o = orders[oi];
      std::vector<Tensor> scratch;
      const Tensor* result = nullptr;
      const RoundTimes timed = median_seconds([&] { result = &chain_multiply(o, dims, mats, scratch); }, opt.seconds,
                                              opt.rounds, thread_counts[ti]);
      const double secs = timed.median;
      if (ti == 0 && oi == 0) reference = *result;
      OrderResult& r = results[ti][oi];
      r.seconds = secs;
      r.noise = timed.noise;
      r.contention = timed.contention;
      r.max_rel_diff = chain_max_rel_diff(*result, reference);
      if (!(r.max_rel_diff <= worst_diff)) {
        worst_diff = r.max_rel_diff;
        worst_what = o.text + " at " + std::to_string(thread_counts[ti]) + " thread(s)";
      }
      const double flops = chain_flops(o, dims);
      std::fprintf(out, "%c %-*s %14.4f %7.2f %11.3f %9.1f %13.2e\n", o.text == optimal.text ? '*' : ' ',
                   static_cast<int>(width), o.text.c_str(), flops / 1e9, flops / optimal_flops, secs * 1e3,
                   flops / secs / 1e9, r.max_rel_diff);
      std::fflush(out);
    }
    size_t slow = 0, fast = 0;
    for (size_t oi = 0; oi < orders.size(); ++oi) {
      if (results[ti][oi].seconds > results[ti][slow].seconds) slow = oi;
      if (results[ti][oi].seconds < results[ti][fast].seconds) fast = oi;
    }
    std::fprintf(out, "  (* the dynamic program's order) fastest %s, slowest %s: %.2fx\n", orders[fast].text.c_str(),
                 orders[slow].text.c_str(), results[ti][slow].seconds / results[ti][fast].seconds);
  }

  if (thread_counts.size() > 1) {
    std::fprintf(out, "\nthread scaling: time at %d thread(s) / time at N\n  %-*s", thread_counts.front(),
                 static_cast<int>(width), "order");
    for (size_t ti = 1; ti < thread_counts.size(); ++ti) std::fprintf(out, " %10s", ("N=" + std::to_string(thread_counts[ti])).c_str());
    std::fprintf(out, "\n");
    for (size_t oi = 0; oi < orders.size(); ++oi) {
      std::fprintf(out, "%c %-*s", orders[oi].text == optimal.text ? '*' : ' ', static_cast<int>(width),
                   orders[oi].text.c_str());
      for (size_t ti = 1; ti < thread_counts.size(); ++ti)
        std::fprintf(out, " %9.2fx", results[0][oi].seconds / results[ti][oi].seconds);
      std::fprintf(out, "\n");
    }
  }

  double slowest = 0, fastest = std::numeric_limits<double>::infinity();
  for (const OrderResult& r : results.front()) {
    slowest = std::max(slowest, r.seconds);
    fastest = std::min(fastest, r.seconds);
  }
  const double ratio = slowest / fastest;
  double noise = 0, contention = 0;
  for (const auto& per_threads : results)
    for (const OrderResult& r : per_threads) {
      noise = std::max(noise, r.noise);
      contention = std::max(contention, r.contention);
    }

  if (!opt.json_out.empty()) {
    nlohmann::json jorders = nlohmann::json::array();
    for (size_t oi = 0; oi < orders.size(); ++oi) {
      const double flops = chain_flops(orders[oi], dims);
      nlohmann::json jo = {{"order", orders[oi].text},
                           {"flops", flops < 9e15 ? nlohmann::json(static_cast<long long>(flops)) : nlohmann::json(flops)},
                           {"is_optimal", orders[oi].text == optimal.text}};
      for (size_t ti = 0; ti < thread_counts.size(); ++ti) {
        const OrderResult& r = results[ti][oi];
        jo["results"].push_back({{"threads", thread_counts[ti]},
                                 {"time_ms", r.seconds * 1e3},
                                 {"gflops", flops / r.seconds / 1e9},
                                 {"max_rel_diff", r.max_rel_diff},
                                 {"scaling", results[0][oi].seconds / r.seconds},
                                 {"noise", r.noise},
                                 {"contention", r.contention}});
      }
      jorders.push_back(jo);
    }
    // the dynamic program's order's time at the first thread count (a lesson compares it with the fastest)
    double optimal_ms = 0;
    for (size_t oi = 0; oi < orders.size(); ++oi)
      if (orders[oi].text == optimal.text) optimal_ms = results[0][oi].seconds * 1e3;
    write_result_json(opt.json_out, {{"command", "bench chain"},
                                     {"producer", std::string("dtlab ") + kDtlabVersion},
                                     {"sgemm", gemm_backend_name()},
                                     {"seed", opt.seed},
                                     {"dims", dims},
                                     {"threads", thread_counts},
                                     {"optimal", optimal.text},
                                     {"optimal_flops", optimal_flops < 9e15 ? nlohmann::json(static_cast<long long>(optimal_flops))
                                                                            : nlohmann::json(optimal_flops)},
                                     {"optimal_time_ms", optimal_ms},
                                     {"tolerance", kChainRelTolerance},
                                     {"ratio_slowest_fastest", ratio},
                                     {"noise", noise},
                                     {"contention", contention},
                                     {"orders", jorders}});
  }
  if (!(worst_diff <= kChainRelTolerance))
    throw Error("bench chain: " + worst_what + " differs from the first order's result by max_rel_diff " +
                    std::to_string(worst_diff) + ", above the rounding bound " + std::to_string(kChainRelTolerance),
                "the orders compute the same product; a difference beyond rounding is a bug in sgemm or in the "
                "chain's evaluation (please report it)");
  std::fprintf(out, "ratio slowest/fastest order %.2f\n", ratio);
  return kExitOk;
}

}  // namespace lab
