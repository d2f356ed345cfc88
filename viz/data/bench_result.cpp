// load_bench_result: result.json of `dtlab bench train` / `dtlab bench chain` into BenchResult.
// Every field the view draws is checked for presence, type and range (a time is a positive finite
// number, a batch size an integer >= 1, arrays are not empty and the chain's results line up with
// its thread counts), so that a damaged or hand-edited file is an error naming the field, never a
// crash or a chart of nonsense.
#include "bench_result.h"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "errors.h"

namespace viz {

namespace {

using nlohmann::json;

const char* kHint =
    "the Benchmark view reads the --json file of `dtlab bench train --batch-sizes 2,8,32,128,512 [--per-sample]` "
    "(or --per-sample alone) and of `dtlab bench chain`";

const char* type_name(const json& j) {
  switch (j.type()) {
    case json::value_t::null: return "null";
    case json::value_t::boolean: return "a boolean";
    case json::value_t::string: return "a string";
    case json::value_t::array: return "an array";
    case json::value_t::object: return "an object";
    case json::value_t::number_integer:
    case json::value_t::number_unsigned: return "an integer";
    case json::value_t::number_float: return "a number";
    default: return "something else";
  }
}

// What a number must be.
enum class Range { Any, NonNegative, Positive };

// Reads fields of one file; every error names the file and the field's JSON pointer.
class Reader {
 public:
  explicit Reader(std::string file) : m_file(std::move(file)) {}

  [[noreturn]] void fail(const std::string& ptr, const std::string& what) const {
    throw lab::IoError(m_file + ": " + (ptr.empty() ? "" : ptr + ": ") + what, kHint);
  }

  const json& field(const json& obj, const std::string& ptr, const char* key) const {
    auto it = obj.find(key);
    if (it == obj.end()) fail(ptr + "/" + key, "missing");
    return *it;
  }
  bool has(const json& obj, const char* key) const { return obj.find(key) != obj.end(); }

  const json& object(const json& obj, const std::string& ptr, const char* key) const {
    const json& v = field(obj, ptr, key);
    if (!v.is_object()) fail(ptr + "/" + key, std::string("expected an object, got ") + type_name(v));
    return v;
  }

  // A non-empty array of at most kBenchMaxRows elements.
  const json& array(const json& obj, const std::string& ptr, const char* key) const {
    const json& v = field(obj, ptr, key);
    const std::string p = ptr + "/" + key;
    if (!v.is_array()) fail(p, std::string("expected an array, got ") + type_name(v));
    if (v.empty()) fail(p, "empty: nothing to show");
    if (v.size() > kBenchMaxRows)
      fail(p, std::to_string(v.size()) + " elements, more than the " + std::to_string(kBenchMaxRows) + " a bench run writes");
    return v;
  }

  std::string str(const json& obj, const std::string& ptr, const char* key) const {
    const json& v = field(obj, ptr, key);
    if (!v.is_string()) fail(ptr + "/" + key, std::string("expected a string, got ") + type_name(v));
    return v.get<std::string>();
  }
  std::string str_or(const json& obj, const std::string& ptr, const char* key, const std::string& fallback) const {
    return has(obj, key) ? str(obj, ptr, key) : fallback;
  }

  bool boolean(const json& obj, const std::string& ptr, const char* key) const {
    const json& v = field(obj, ptr, key);
    if (!v.is_boolean()) fail(ptr + "/" + key, std::string("expected true or false, got ") + type_name(v));
    return v.get<bool>();
  }

  // Beyond what any measurement here can be (and where a chart's log axis would need hundreds of
  // decades): refused.
  static constexpr double kMax = 1e30, kMinPositive = 1e-30;

  double number_of(const json& v, const std::string& p, Range range) const {
    if (!v.is_number()) fail(p, std::string("expected a number, got ") + type_name(v));
    const double x = v.get<double>();
    if (!std::isfinite(x)) fail(p, "not a finite number");
    if (std::fabs(x) > kMax) fail(p, "out of range: " + v.dump());
    if (range == Range::Positive && x > 0 && x < kMinPositive) fail(p, "too small to be a measurement: " + v.dump());
    if (range == Range::Positive && !(x > 0)) fail(p, "expected a positive number, got " + v.dump());
    if (range == Range::NonNegative && !(x >= 0)) fail(p, "expected a number >= 0, got " + v.dump());
    return x;
  }
  double number(const json& obj, const std::string& ptr, const char* key, Range range) const {
    return number_of(field(obj, ptr, key), ptr + "/" + key, range);
  }
  std::optional<double> number_or_null(const json& obj, const std::string& ptr, const char* key, Range range) const {
    if (!has(obj, key) || obj.at(key).is_null()) return std::nullopt;
    return number(obj, ptr, key, range);
  }

  // An integer >= min (a float that holds one exactly is accepted, as JSON does not tell them apart).
  int64_t integer_of(const json& v, const std::string& p, int64_t min) const {
    if (!v.is_number()) fail(p, std::string("expected an integer, got ") + type_name(v));
    if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) fail(p, "out of range: " + v.dump());
    int64_t x = 0;
    if (v.is_number_float()) {
      const double d = v.get<double>();
      if (!(std::fabs(d) < 9.0e15) || d != std::floor(d)) fail(p, "expected an integer, got " + v.dump());
      x = static_cast<int64_t>(d);
    } else {
      x = v.get<int64_t>();
    }
    if (x < min) fail(p, "expected an integer >= " + std::to_string(min) + ", got " + v.dump());
    return x;
  }
  int64_t integer(const json& obj, const std::string& ptr, const char* key, int64_t min) const {
    return integer_of(field(obj, ptr, key), ptr + "/" + key, min);
  }
  int64_t integer_or(const json& obj, const std::string& ptr, const char* key, int64_t min, int64_t fallback) const {
    return has(obj, key) ? integer(obj, ptr, key, min) : fallback;
  }

 private:
  std::string m_file;
};

std::string at(const std::string& ptr, size_t i) { return ptr + "/" + std::to_string(i); }

BenchPerSample read_per_sample(const Reader& rd, const json& p) {
  const std::string ptr = "/per_sample";
  BenchPerSample s;
  s.batch_size = rd.integer(p, ptr, "batch_size", 1);
  s.batched_ms = rd.number(p, ptr, "batched_ms", Range::Positive);
  s.per_sample_ms = rd.number(p, ptr, "per_sample_ms", Range::Positive);
  s.ratio = rd.number(p, ptr, "ratio", Range::Positive);
  s.batchnorm = rd.str(p, ptr, "batchnorm");
  s.grad_max_rel_diff = rd.number_or_null(p, ptr, "grad_max_rel_diff", Range::NonNegative);
  s.grad_max_rel_param = rd.str_or(p, ptr, "grad_max_rel_param", "");
  s.same_computation_max_rel_diff = rd.number_or_null(p, ptr, "same_computation_max_rel_diff", Range::NonNegative);
  s.batchnorm_note = rd.str_or(p, ptr, "batchnorm_note", "");
  s.train_mode_error = rd.str_or(p, ptr, "train_mode_error", "");
  return s;
}

BenchTrainResult read_train(const Reader& rd, const json& j) {
  BenchTrainResult t;
  t.model = rd.str(j, "", "model");
  t.sgemm = rd.str_or(j, "", "sgemm", "");
  t.producer = rd.str_or(j, "", "producer", "");
  if (rd.has(j, "batchnorm")) t.batchnorm = rd.boolean(j, "", "batchnorm");
  t.world_size = rd.integer_or(j, "", "world_size", 1, 1);
  t.threads = rd.integer_or(j, "", "threads", 1, 1);
  t.train_flops_per_sample = rd.integer_or(j, "", "train_flops_per_sample", 0, 0);
  if (rd.has(j, "sweep")) {
    const json& rows = rd.array(j, "", "sweep");
    for (size_t i = 0; i < rows.size(); ++i) {
      const std::string ptr = at("/sweep", i);
      const json& r = rows[i];
      if (!r.is_object()) rd.fail(ptr, std::string("expected an object, got ") + type_name(r));
      BenchSweepRow row;
      row.batch_size = rd.integer(r, ptr, "batch_size", 1);
      row.step_ms = rd.number(r, ptr, "step_ms", Range::Positive);
      row.ms_per_sample = rd.number(r, ptr, "ms_per_sample", Range::Positive);
      row.samples_per_s = rd.number(r, ptr, "samples_per_s", Range::Positive);
      row.gflops = rd.number(r, ptr, "gflops", Range::NonNegative);
      row.speedup_per_sample = rd.number(r, ptr, "speedup_per_sample", Range::Positive);
      if (!t.sweep.empty() && row.batch_size <= t.sweep.back().batch_size)
        rd.fail(ptr + "/batch_size", "batch sizes must increase row by row (" + std::to_string(t.sweep.back().batch_size) +
                                         ", then " + std::to_string(row.batch_size) + ")");
      t.sweep.push_back(row);
    }
    t.ratio_smallest_largest = rd.number(j, "", "ratio_smallest_largest", Range::Positive);
  }
  if (rd.has(j, "per_sample")) t.per_sample = read_per_sample(rd, rd.object(j, "", "per_sample"));
  if (t.sweep.empty() && !t.per_sample)
    rd.fail("", "a `bench train` result without \"sweep\" or \"per_sample\": one batch size has nothing to plot "
                "(run it with --batch-sizes 2,8,32,128,512 and/or --per-sample)");
  return t;
}

BenchChainResult read_chain(const Reader& rd, const json& j) {
  BenchChainResult c;
  c.sgemm = rd.str_or(j, "", "sgemm", "");
  c.producer = rd.str_or(j, "", "producer", "");
  const json& dims = rd.array(j, "", "dims");
  if (dims.size() < 2) rd.fail("/dims", "a chain of matrices needs at least two dims");
  for (size_t i = 0; i < dims.size(); ++i) c.dims.push_back(rd.integer_of(dims[i], at("/dims", i), 1));
  const json& threads = rd.array(j, "", "threads");
  for (size_t i = 0; i < threads.size(); ++i) c.threads.push_back(rd.integer_of(threads[i], at("/threads", i), 1));
  c.optimal = rd.str(j, "", "optimal");
  c.optimal_flops = rd.number(j, "", "optimal_flops", Range::NonNegative);
  if (rd.has(j, "tolerance")) c.tolerance = rd.number(j, "", "tolerance", Range::NonNegative);
  c.ratio_slowest_fastest = rd.number(j, "", "ratio_slowest_fastest", Range::Positive);
  const json& orders = rd.array(j, "", "orders");
  for (size_t i = 0; i < orders.size(); ++i) {
    const std::string ptr = at("/orders", i);
    const json& o = orders[i];
    if (!o.is_object()) rd.fail(ptr, std::string("expected an object, got ") + type_name(o));
    BenchChainOrder order;
    order.order = rd.str(o, ptr, "order");
    if (order.order.empty()) rd.fail(ptr + "/order", "empty");
    order.flops = rd.number(o, ptr, "flops", Range::NonNegative);
    order.is_optimal = rd.boolean(o, ptr, "is_optimal");
    const json& results = rd.array(o, ptr, "results");
    if (results.size() != c.threads.size())
      rd.fail(ptr + "/results", std::to_string(results.size()) + " results for " + std::to_string(c.threads.size()) +
                                    " thread counts (\"threads\"): one per thread count");
    for (size_t k = 0; k < results.size(); ++k) {
      const std::string rp = at(ptr + "/results", k);
      const json& r = results[k];
      if (!r.is_object()) rd.fail(rp, std::string("expected an object, got ") + type_name(r));
      BenchChainTiming t;
      t.threads = rd.integer(r, rp, "threads", 1);
      if (t.threads != c.threads[k])
        rd.fail(rp + "/threads", std::to_string(t.threads) + ", but \"threads\" lists " + std::to_string(c.threads[k]) +
                                     " in this place");
      t.time_ms = rd.number(r, rp, "time_ms", Range::Positive);
      t.gflops = rd.number(r, rp, "gflops", Range::NonNegative);
      t.max_rel_diff = rd.number(r, rp, "max_rel_diff", Range::NonNegative);
      t.scaling = rd.number(r, rp, "scaling", Range::Positive);
      order.results.push_back(t);
    }
    c.orders.push_back(std::move(order));
  }
  return c;
}

// Recursive descent over "(X Y)" and "A<i>": returns the rows and columns of the product, or false.
struct OrderParser {
  OrderParser(const std::string& text, const std::vector<int64_t>& d) : s(text), dims(d) {}
  const std::string& s;
  const std::vector<int64_t>& dims;
  size_t pos = 0, next_matrix = 1, depth = 0;
  std::vector<ChainProductShape> products;

  void skip() {
    while (pos < s.size() && s[pos] == ' ') ++pos;
  }
  bool term(int64_t& rows, int64_t& cols) {
    skip();
    if (pos >= s.size() || ++depth > 64) return false;
    if (s[pos] == 'A') {
      ++pos;
      size_t i = 0;
      const size_t start = pos;
      while (pos < s.size() && s[pos] >= '0' && s[pos] <= '9' && pos - start < 6) i = i * 10 + static_cast<size_t>(s[pos++] - '0');
      if (pos == start || i != next_matrix || i >= dims.size()) return false;  // A1, A2, ... in order
      ++next_matrix;
      rows = dims[i - 1];
      cols = dims[i];
    } else if (s[pos] == '(') {
      ++pos;
      int64_t r1 = 0, c1 = 0, r2 = 0, c2 = 0;
      if (!term(r1, c1) || !term(r2, c2)) return false;
      skip();
      if (pos >= s.size() || s[pos] != ')' || c1 != r2) return false;
      ++pos;
      products.push_back({r1, c1, c2});
      rows = r1;
      cols = c2;
    } else {
      return false;
    }
    --depth;
    return true;
  }
};

std::string join(const std::vector<int64_t>& v, const char* sep) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? sep : "") + std::to_string(v[i]);
  return s;
}

}  // namespace

BenchResult parse_bench_result(const std::string& text, const std::string& path) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    throw lab::IoError(path + ": not JSON: " + e.what(), kHint);
  }
  Reader rd(path);
  if (!j.is_object()) rd.fail("", std::string("expected a JSON object, got ") + type_name(j));
  BenchResult r;
  r.source = path;
  const std::string command = rd.str(j, "", "command");
  try {
    if (command == "bench train") {
      r.kind = BenchKind::Train;
      r.train = read_train(rd, j);
    } else if (command == "bench chain") {
      r.kind = BenchKind::Chain;
      r.chain = read_chain(rd, j);
    } else {
      rd.fail("/command", "\"" + command + "\": the Benchmark view shows `bench train` and `bench chain` results");
    }
  } catch (const json::exception& e) {  // not expected (every access is checked): still an error, never a crash
    rd.fail("", std::string("bad result: ") + e.what());
  }
  return r;
}

bool looks_like_bench_result(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_regular_file(path, ec)) return true;
  if (!std::filesystem::is_directory(path, ec) || std::filesystem::exists(path + "/config.toml", ec)) return false;
  if (std::filesystem::exists(path + "/result.json", ec)) return true;
  // a lesson's run directory says which command ran in outcome.json (lessons/runner/lesson_runs.h)
  std::ifstream f(path + "/outcome.json");
  if (!f) return false;
  try {
    const json j = json::parse(f);
    const auto it = j.find("command");
    return it != j.end() && it->is_string() && it->get<std::string>().rfind("bench ", 0) == 0;
  } catch (const json::exception&) {
    return false;
  }
}

BenchResult load_bench_result(const std::string& path) {
  std::error_code ec;
  const std::string file = std::filesystem::is_directory(path, ec) ? path + "/result.json" : path;
  std::ifstream f(file, std::ios::binary);
  if (!f) throw lab::IoError("cannot read " + file, kHint);
  std::stringstream text;
  text << f.rdbuf();
  if (f.bad()) throw lab::IoError("cannot read " + file, kHint);
  return parse_bench_result(text.str(), file);
}

std::vector<ChainProductShape> chain_products(const std::string& order, const std::vector<int64_t>& dims) {
  OrderParser p(order, dims);
  int64_t rows = 0, cols = 0;
  if (!p.term(rows, cols)) return {};
  p.skip();
  if (p.pos != order.size() || p.next_matrix != dims.size()) return {};  // every matrix, nothing after
  return p.products;
}

std::string describe_bench(const BenchResult& r) {
  char buf[256];
  if (r.kind == BenchKind::Train) {
    const BenchTrainResult& t = r.train;
    std::string what;
    if (!t.sweep.empty()) {
      what = "batch sizes " + std::to_string(t.sweep.front().batch_size) + " to " + std::to_string(t.sweep.back().batch_size);
      if (t.per_sample) what += ", and the batch of " + std::to_string(t.per_sample->batch_size) + " one sample at a time";
    } else if (t.per_sample) {
      what = "a batch of " + std::to_string(t.per_sample->batch_size) + " at once and one sample at a time";
    }
    std::snprintf(buf, sizeof buf, "bench train: %s (BatchNorm %s), %s; %lld rank%s, %lld thread%s%s%s", t.model.c_str(),
                  t.batchnorm ? "on" : "off", what.c_str(), static_cast<long long>(t.world_size),
                  t.world_size == 1 ? "" : "s", static_cast<long long>(t.threads), t.threads == 1 ? "" : "s",
                  t.sgemm.empty() ? "" : ", sgemm ", t.sgemm.c_str());
    return buf;
  }
  if (r.kind == BenchKind::Chain) {
    const BenchChainResult& c = r.chain;
    std::snprintf(buf, sizeof buf, "bench chain: %zu matri%s (dims %s), %zu order%s at %s thread%s%s%s", c.dims.size() - 1,
                  c.dims.size() == 2 ? "x" : "ces", join(c.dims, ", ").c_str(), c.orders.size(),
                  c.orders.size() == 1 ? "" : "s", join(c.threads, ", ").c_str(),
                  c.threads.size() == 1 && c.threads[0] == 1 ? "" : "s", c.sgemm.empty() ? "" : ", sgemm ", c.sgemm.c_str());
    return buf;
  }
  return "no benchmark result";
}

}  // namespace viz
