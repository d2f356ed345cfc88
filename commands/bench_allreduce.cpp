// dtlab bench allreduce: see bench_allreduce.h for what is measured and how.
//
// Supported: transport threads (N emulated ranks, one std::thread each, in this process). The
// per-rank body (bench_allreduce_rank) uses only the Transport interface, a Communicator without
// an EventLog (recording events would distort the timing) and the dissemination barrier below,
// so a process-per-rank transport can run it unchanged under mpirun, rank 0 printing.
//
// Inputs are built so that every result can be checked exactly: rank r's element i is
// (i mod 1021) + 1024 r, so element i of the sum is N (i mod 1021) + 1024 N(N-1)/2, an integer
// below 2^24 for N <= 64 whatever the summation order. Every element is checked on every rank,
// once before and once after the timed batches (#wrong = elements that differ, over all ranks).
// The timed calls run on zeros, so repeated in-place sums stay finite and the time does not
// depend on the values.
#include "bench_allreduce.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <thread>

#include <nlohmann/json.hpp>

#include "command_line.h"
#include "config.h"
#include "device.h"
#include "device_memory.h"
#include "executor.h"
#include "model.h"
#include "errors.h"
#include "events.h"
#include "mutation.h"
#include "sharded_collectives.h"
#include "threads/transport_threads.h"

namespace lab {

namespace {

// Raw messages of the benchmark (barriers, the #wrong reduction) use tags far above the op_seq
// tags of the Communicator's collectives, so the two can never be matched with each other.
constexpr uint64_t kBenchTagBase = uint64_t{1} << 62;

constexpr int kPatternPeriod = 1021;  // a prime: chunk boundaries rarely line up with it
constexpr float kRankStride = 1024.0f;

// Barrier and a sum of counters to rank 0, over raw transport messages.
class BenchSync {
 public:
  explicit BenchSync(Transport& t) : m_t(t) {}

  // Dissemination barrier: in round k (distance d = 2^k) every rank signals r + d and waits for
  // r - d; after ceil(log2 N) rounds every rank has heard, indirectly, from every other.
  void barrier() {
    const int n = m_t.world_size();
    const int r = m_t.rank();
    const uint64_t tag = next_tag();
    for (int d = 1; d < n; d *= 2) m_t.sendrecv((r + d) % n, nullptr, 0, (r - d + n) % n, nullptr, 0, tag);
  }

  // Rank 0 gets the sum over ranks of `v`; other ranks get their own `v` back.
  uint64_t sum_to_root(uint64_t v) {
    const int n = m_t.world_size();
    const uint64_t tag = next_tag();
    if (m_t.rank() != 0) {
      m_t.send(0, &v, sizeof v, tag);
      return v;
    }
    uint64_t total = v;
    for (int src = 1; src < n; ++src) {
      uint64_t x = 0;
      m_t.recv(src, &x, sizeof x, tag);
      total += x;
    }
    return total;
  }

 private:
  uint64_t next_tag() { return kBenchTagBase + m_calls++; }
  Transport& m_t;
  uint64_t m_calls = 0;
};

struct FreeDeleter {
  void operator()(float* p) const { std::free(p); }
};
using FloatBuffer = std::unique_ptr<float[], FreeDeleter>;

FloatBuffer aligned_floats(size_t count) {
  const size_t bytes = std::max<size_t>(64, (count * sizeof(float) + 63) / 64 * 64);
  auto* p = static_cast<float*>(std::aligned_alloc(64, bytes));
  if (!p) throw Error("bench allreduce: cannot allocate " + std::to_string(bytes) + " bytes");
  return FloatBuffer(p);
}

void fill_pattern(float* data, size_t count, int rank) {
  const float base = kRankStride * static_cast<float>(rank);
  int j = 0;
  for (size_t i = 0; i < count; ++i) {
    data[i] = static_cast<float>(j) + base;
    if (++j == kPatternPeriod) j = 0;
  }
}

// Elements [begin, end) of the sum over n ranks of fill_pattern's buffers that differ from it.
uint64_t count_wrong(const float* data, size_t begin, size_t end, int n) {
  const float base = kRankStride * static_cast<float>(n * (n - 1) / 2);
  uint64_t wrong = 0;
  int j = static_cast<int>(begin % kPatternPeriod);
  for (size_t i = begin; i < end; ++i) {
    wrong += data[i] != static_cast<float>(n * j) + base;
    if (++j == kPatternPeriod) j = 0;
  }
  return wrong;
}

// Elements of an allgathered buffer of n blocks that differ from block b = rank b's pattern.
uint64_t count_wrong_gathered(const float* data, size_t block, int n) {
  uint64_t wrong = 0;
  for (int b = 0; b < n; ++b) {
    const float base = kRankStride * static_cast<float>(b);
    for (size_t i = b * block, j = i % kPatternPeriod; i < (b + 1) * block; ++i) {
      wrong += data[i] != static_cast<float>(j) + base;
      if (++j == kPatternPeriod) j = 0;
    }
  }
  return wrong;
}

// Seconds per call of `call`, the way the MPI peer times MPI_Allreduce: warm-up, calibrate m on
// rank 0 (one call between barriers) and share it, then `batches` batches of m calls between
// barriers; the median of batch time / m. Every rank returns its own figure; rank 0's is reported.
double time_calls(BenchSync& sync, Communicator& comm, const AllreduceBenchPlan& plan,
                  const std::function<void()>& call) {
  for (int i = 0; i < plan.warmup; ++i) call();
  sync.barrier();
  const double t0 = now_seconds();
  call();
  sync.barrier();
  const double one = now_seconds() - t0;
  int32_t m = static_cast<int32_t>(std::min<double>(plan.max_calls, plan.batch_seconds / std::max(one, 1e-7)));
  m = std::max<int32_t>(m, 1);
  comm.broadcast(&m, sizeof m, 0, CollectiveInfo{"bench calls", -1});  // every rank runs rank 0's m
  std::vector<double> per_call;
  for (int b = 0; b < plan.batches; ++b) {
    sync.barrier();
    const double s = now_seconds();
    for (int i = 0; i < m; ++i) call();
    sync.barrier();
    per_call.push_back((now_seconds() - s) / m);
  }
  std::sort(per_call.begin(), per_call.end());
  return per_call[per_call.size() / 2];
}

double bus_factor_of(BenchCollective c, int n) {
  if (n <= 1) return 0.0;
  return c == BenchCollective::Allreduce ? 2.0 * (n - 1) / n : 1.0 * (n - 1) / n;
}

std::string join(const std::vector<std::string>& v, const char* sep) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? sep : "") + v[i];
  return s;
}

void print_table_header(std::FILE* out, int n, const std::vector<AllreduceAlgorithm>& algos) {
  std::fprintf(out, "#\n# world size %d\n", n);
  std::fprintf(out, "# %29s", "");
  for (AllreduceAlgorithm a : algos) std::fprintf(out, "  %-36s", allreduce_algorithm_name(a));
  std::fprintf(out, "  %s\n", "copy floor");
  std::fprintf(out, "# %10s %10s %5s %5s", "size", "count", "type", "redop");
  for (size_t i = 0; i < algos.size(); ++i) std::fprintf(out, "  %9s %7s %7s %9s", "time(us)", "algbw", "busbw", "#wrong");
  std::fprintf(out, "  %9s %7s %5s %s\n", "time(us)", "algbw", "eff", "best");
  std::fflush(out);
}

void print_row(std::FILE* out, int n, BenchCollective c, const std::vector<AllreduceAlgorithm>& algos,
               const AllreduceBenchRow& row) {
  const double s = static_cast<double>(row.bytes);
  const double bus_factor = bus_factor_of(c, n);
  std::fprintf(out, "  %10llu %10llu %5s %5s", static_cast<unsigned long long>(row.bytes),
              static_cast<unsigned long long>(row.bytes / sizeof(float)), "float",
              c == BenchCollective::Allgather ? "none" : "sum");
  size_t best = 0;
  for (size_t i = 0; i < algos.size(); ++i) {
    const double t = row.seconds[i];
    const double algbw = s / t / 1e9;
    std::fprintf(out, "  %9.1f %7.3f %7.3f %9llu", t * 1e6, algbw, algbw * bus_factor,
                static_cast<unsigned long long>(row.wrong[i]));
    if (t < row.seconds[best]) best = i;
  }
  std::fprintf(out, "  %9.1f %7.3f %5.2f %s\n", row.floor_seconds * 1e6, s / row.floor_seconds / 1e9,
              row.floor_seconds / row.seconds[best], allreduce_algorithm_name(algos[best]));
  std::fflush(out);
}

}  // namespace

std::vector<AllreduceBenchRow> bench_allreduce_rank(Transport& t, int world_size, const AllreduceBenchPlan& plan,
                                                    const std::function<void(const AllreduceBenchRow&)>& on_row,
                                                    DeviceMemory* mem) {
  const int n = world_size;
  const int r = t.rank();
  Communicator comm(t, nullptr);  // no EventLog: bookkeeping would distort the timing
  BenchSync sync(t);
  uint64_t max_bytes = 0;
  for (uint64_t b : plan.sizes) max_bytes = std::max(max_bytes, b);
  const size_t max_count = max_bytes / sizeof(float);
  FloatBuffer host = aligned_floats(max_count);  // the buffer, or on a device the pattern's way there and back
  FloatBuffer copy = aligned_floats(max_count);  // the copy floor's destination
  std::memset(copy.get(), 0, max_count * sizeof(float));
  // On a device: the rank's buffer and the floor's destination there (freed on every path out)
  std::unique_ptr<void, std::function<void(void*)>> dev_data(nullptr, [mem](void* p) { mem->release(p); });
  std::unique_ptr<void, std::function<void(void*)>> dev_copy(nullptr, [mem](void* p) { mem->release(p); });
  if (mem) {
    dev_data.reset(mem->allocate(max_bytes));
    dev_copy.reset(mem->allocate(max_bytes));
  }
  float* data = mem ? static_cast<float*>(dev_data.get()) : host.get();
  const auto set_pattern = [&](size_t count) {
    fill_pattern(host.get(), count, r);
    if (mem) mem->upload(data, host.get(), count * sizeof(float));
  };
  const auto set_zero = [&](size_t count) {
    std::memset(host.get(), 0, count * sizeof(float));
    if (mem) mem->upload(data, host.get(), count * sizeof(float));
  };
  const auto wrong_of = [&](size_t count) {
    if (mem) mem->download(host.get(), data, count * sizeof(float));
    return count_wrong(host.get(), 0, count, n);
  };

  const auto download = [&](size_t count) {
    if (mem) mem->download(host.get(), data, count * sizeof(float));
  };
  std::vector<AllreduceBenchRow> rows;
  for (uint64_t bytes : plan.sizes) {
    const size_t count = bytes / sizeof(float);
    const size_t block = count / n;  // reduce_scatter and allgather: the plan's sizes hold n whole blocks
    AllreduceBenchRow row;
    row.bytes = bytes;
    // One call of the collective on the whole buffer, and the check of what it leaves: every
    // element of the allreduce, this rank's block of the reduce-scatter, every block gathered.
    const auto call = [&](CollectiveInfo info) {
      switch (plan.collective) {
        case BenchCollective::Allreduce: return comm.allreduce_sum(data, count, info, mem);
        case BenchCollective::ReduceScatter: return comm.reduce_scatter_sum(data, block, info, mem);
        case BenchCollective::Allgather: return comm.allgather_in_place(data, block, info, mem);
      }
    };
    const auto checked_call = [&](int k) {
      if (plan.collective == BenchCollective::Allgather) {  // rank r's block, garbage elsewhere
        for (size_t i = 0; i < count; ++i) host[i] = -1.0f;
        // the pattern counts from the buffer's start, as count_wrong_gathered does
        for (size_t i = r * block, j = i % kPatternPeriod; i < (r + 1) * block; ++i) {
          host[i] = static_cast<float>(j) + kRankStride * static_cast<float>(r);
          if (++j == kPatternPeriod) j = 0;
        }
        if (mem) mem->upload(data, host.get(), count * sizeof(float));
        call(CollectiveInfo{"bench check", k});
        download(count);
        return count_wrong_gathered(host.get(), block, n);
      }
      set_pattern(count);
      call(CollectiveInfo{"bench check", k});
      if (plan.collective == BenchCollective::Allreduce) return wrong_of(count);
      download(count);
      return count_wrong(host.get(), r * block, (r + 1) * block, n);
    };
    for (AllreduceAlgorithm algo : plan.algorithms) {
      comm.set_allreduce_algorithm(algo);
      uint64_t wrong = checked_call(0);
      set_zero(count);
      const double secs = time_calls(sync, comm, plan, [&] { call(CollectiveInfo{"bench", -1}); });
      wrong += checked_call(1);
      row.seconds.push_back(secs);
      row.wrong.push_back(sync.sum_to_root(wrong));
    }
    float* src = data;
    float* dst = mem ? static_cast<float*>(dev_copy.get()) : copy.get();
    row.floor_seconds = time_calls(sync, comm, plan, [&] {
      if (mem) return mem->copy(dst, src, bytes);  // device to device, complete when it returns
      std::memcpy(dst, src, bytes);
      asm volatile("" : : "r"(dst) : "memory");  // the copy is the point: keep it
    });
    if (r == 0 && on_row) on_row(row);
    rows.push_back(row);
  }
  return rows;
}

const char* bench_collective_name(BenchCollective c) {
  switch (c) {
    case BenchCollective::Allreduce: return "allreduce";
    case BenchCollective::ReduceScatter: return "reduce_scatter";
    case BenchCollective::Allgather: return "allgather";
  }
  return "?";
}

BenchCollective parse_bench_collective(const std::string& name) {
  for (BenchCollective c : {BenchCollective::Allreduce, BenchCollective::ReduceScatter, BenchCollective::Allgather})
    if (name == bench_collective_name(c)) return c;
  throw ConfigError("--collective: unknown collective '" + name + "'",
                    "choose allreduce, reduce_scatter (block r summed onto rank r) or allgather (every rank's block "
                    "to every rank)");
}

int bench_allreduce(const BenchAllreduceOptions& opt) {
  std::FILE* out = opt.out ? opt.out : stdout;
  const BenchCollective collective = parse_bench_collective(opt.collective);
  const bool blocks = collective != BenchCollective::Allreduce;
  if (opt.comm != "threads")
    throw ConfigError("--comm: bench allreduce supports the threads transport in this build, got '" + opt.comm + "'");
  if (opt.world_sizes.empty()) throw ConfigError("--world-sizes: give at least one world size");
  for (int n : opt.world_sizes) {
    if (n == 1)
      throw ConfigError("--world-sizes 1: an allreduce over one rank moves no bytes, so there is nothing to time",
                        "give world sizes of 2 or more, e.g. --world-sizes 2,4,8");
    if (n < 2 || n > kMaxWorldSize)
      throw ConfigError("--world-sizes: each must be in 2.." + std::to_string(kMaxWorldSize) + ", got " +
                        std::to_string(n));
  }
  const DeviceSpec device = parse_device(opt.device);
  ComputeOptions compute;
  compute.device = opt.device;
  AllreduceBenchPlan plan;
  std::vector<std::string> names;
  for (const std::string& a : opt.algorithms) {
    const AllreduceAlgorithm algo = parse_allreduce_algorithm(a);
    if (algo == AllreduceAlgorithm::Native)
      throw ConfigError("--algorithms: mpi needs --comm mpi (a transport with its own allreduce)");
    if (algo == AllreduceAlgorithm::Tree && blocks)
      for (int n : opt.world_sizes)
        if (!tree_collectives_fit(n))
          throw ConfigError("--algorithms tree with --collective " + opt.collective +
                                " needs power-of-two world sizes, got " + std::to_string(n),
                            "recursive halving/doubling gives a block to each rank of a power-of-two world only: "
                            "drop tree or the world size " + std::to_string(n));
    plan.algorithms.push_back(algo);
    names.push_back(allreduce_algorithm_name(algo));
  }
  if (plan.algorithms.empty()) throw ConfigError("--algorithms: give at least one algorithm");
  if (opt.min_bytes < sizeof(float) || opt.min_bytes % sizeof(float) != 0 || opt.max_bytes % sizeof(float) != 0 ||
      opt.max_bytes < opt.min_bytes)
    throw ConfigError("--min-bytes/--max-bytes: sizes must be positive multiples of 4 with min <= max");
  if (opt.step_factor < 2) throw ConfigError("--step-factor must be at least 2");
  if (opt.warmup < 0 || opt.batches < 1 || opt.max_calls < 1 || !(opt.batch_seconds > 0) || !(opt.timeout_s > 0))
    throw ConfigError("--warmup >= 0, --batches >= 1, --max-calls >= 1, --batch-seconds and --timeout > 0");
  for (uint64_t b = opt.min_bytes; b <= opt.max_bytes; b *= opt.step_factor) {
    plan.sizes.push_back(b);
    if (b > opt.max_bytes / opt.step_factor) break;
  }
  plan.collective = collective;
  if (blocks) {  // N whole blocks: each world size's sizes rounded down to a multiple of 4N (nccl-tests)
    for (int n : opt.world_sizes)
      if (opt.min_bytes < sizeof(float) * static_cast<uint64_t>(n))
        throw ConfigError("--min-bytes " + std::to_string(opt.min_bytes) + ": a " + opt.collective + " over " +
                          std::to_string(n) + " ranks needs at least one float per rank (" +
                          std::to_string(4 * n) + " bytes)");
  }
  plan.warmup = opt.warmup;
  plan.batches = opt.batches;
  plan.batch_seconds = opt.batch_seconds;
  plan.max_calls = opt.max_calls;

  std::vector<std::string> sizes;
  for (int n : opt.world_sizes) sizes.push_back(std::to_string(n));
  if (!blocks) {
    std::fprintf(out, "# dtlab %s bench allreduce: float32 sum, in place; time in us, algbw and busbw in GB/s\n",
                kDtlabVersion);
    std::fprintf(out, "#   algbw = S / time, busbw = algbw x 2(N-1)/N (nccl-tests)\n");
  } else {
    std::fprintf(out, "# dtlab %s bench allreduce --collective %s: float32%s, in place (N blocks of S/N); time in us, "
                "algbw and busbw in GB/s\n",
                kDtlabVersion, opt.collective.c_str(), collective == BenchCollective::ReduceScatter ? " sum" : "");
    std::fprintf(out, "#   S = every rank's whole buffer (rounded down to N whole floats per block); algbw = S / time, "
                "busbw = algbw x (N-1)/N (nccl-tests)\n");
  }
  std::fprintf(out, "#   world sizes: %s | algorithms: %s | transport: %s (emulated ranks, one thread each; %u cores)\n",
              join(sizes, " ").c_str(), join(names, " ").c_str(), opt.comm.c_str(),
              std::max(1u, std::thread::hardware_concurrency()));
  std::fprintf(out, "#   sizes: %llu .. %llu bytes, x%llu | warm-up %d calls | %d batches of ~%g ms (at most %d calls), "
              "median, barrier-bracketed, timed on rank 0\n",
              static_cast<unsigned long long>(plan.sizes.front()), static_cast<unsigned long long>(plan.sizes.back()),
              static_cast<unsigned long long>(opt.step_factor), opt.warmup, opt.batches, opt.batch_seconds * 1e3,
              opt.max_calls);
  if (collective == BenchCollective::Allgather)
    std::fprintf(out, "#   #wrong: elements of block b that differ from rank b's (element i = (i mod %d) + %g b), "
                "over all ranks, checked before and after timing\n",
                kPatternPeriod, kRankStride);
  else
    std::fprintf(out, "#   #wrong: elements %sthat differ from the exact sum (rank r's element i = (i mod %d) + %g r), "
                "over all ranks, checked before and after timing\n",
                blocks ? "of each rank's own block " : "", kPatternPeriod, kRankStride);
  if (device.is_cpu())
    std::fprintf(out, "#   copy floor: every rank memcpy's its buffer once (same buffers, threads and timing); "
                "eff = floor time / best algorithm's time\n");
  else
    std::fprintf(out, "#   buffers: on %s, every rank's; the ring's copies device-to-device and its adds the device's, "
                "naive and tree staged through host memory (one download, one upload per call); copy floor: a "
                "device-to-device copy of the buffer per rank; eff = floor time / best algorithm's time\n",
                opt.device.c_str());
  std::fprintf(out, "#   events: not recorded | sgemm: not used (irrelevant) | timeout %g s\n", opt.timeout_s);
  std::fflush(out);

  // --json: {"results": {"<N>": {"<algorithm>": [per size: {bytes, time_us, algbw_gbps, busbw_gbps,
  // wrong}], "copy_floor": [per size: {bytes, time_us, algbw_gbps}], "best": [algorithm per size]}}}
  nlohmann::json results = nlohmann::json::object();
  const bool own_traffic = lab::mutated("bench-busbw-own-traffic");  // a lesson's mutation test
  for (int n : opt.world_sizes) {
    AllreduceBenchPlan plan_n = plan;
    if (blocks)
      for (uint64_t& b : plan_n.sizes) b = b / (sizeof(float) * n) * (sizeof(float) * n);
    print_table_header(out, n, plan.algorithms);
    nlohmann::json& per_n = results[std::to_string(n)];
    auto on_row = [&](const AllreduceBenchRow& row) {
      print_row(out, n, collective, plan.algorithms, row);
      const double s = static_cast<double>(row.bytes);
      const double bus_factor = bus_factor_of(collective, n);
      size_t best = 0;
      for (size_t i = 0; i < plan.algorithms.size(); ++i) {
        const double t = row.seconds[i];
        // The mutation bench-busbw-own-traffic (mutation.h): naive's busbw from its rank 0's traffic.
        const double factor = own_traffic && names[i] == "naive" ? 2.0 * (n - 1) : bus_factor;
        per_n[names[i]].push_back({{"bytes", row.bytes}, {"time_us", t * 1e6}, {"algbw_gbps", s / t / 1e9},
                                   {"busbw_gbps", s / t / 1e9 * factor}, {"wrong", row.wrong[i]}});
        if (t < row.seconds[best]) best = i;
      }
      per_n["copy_floor"].push_back(
          {{"bytes", row.bytes}, {"time_us", row.floor_seconds * 1e6}, {"algbw_gbps", s / row.floor_seconds / 1e9}});
      per_n["best"].push_back(names[best]);
    };
    // On a device: every rank's memory there, through its executor (a model each, as in a run)
    std::vector<std::unique_ptr<Model>> models;
    std::vector<DeviceMemory*> mems(static_cast<size_t>(n), nullptr);
    if (!device.is_cpu())
      for (int rank = 0; rank < n; ++rank) {
        ModelOptions mo;
        mo.name = "mlp";
        models.push_back(build_model(mo, 0));
        attach_executor(*models.back(), compute, rank, n, "threads");
        mems[static_cast<size_t>(rank)] = models.back()->executor()->device_memory();
        if (!mems[static_cast<size_t>(rank)])
          throw ConfigError("--device " + opt.device + ": this device has no memory the collectives can work in");
      }
    ThreadsWorld world(n);
    std::vector<std::exception_ptr> errors(static_cast<size_t>(n));
    std::vector<std::thread> threads;
    for (int rank = 0; rank < n; ++rank) {
      world.transport(rank).set_timeout(opt.timeout_s);
      threads.emplace_back([&, rank] {
        try {
          bench_allreduce_rank(world.transport(rank), n, plan_n, on_row, mems[static_cast<size_t>(rank)]);
        } catch (...) {
          errors[static_cast<size_t>(rank)] = std::current_exception();
          try {
            throw;
          } catch (const std::exception& e) {
            world.transport(rank).abort(e.what());
          } catch (...) {
            world.transport(rank).abort("unknown exception");
          }
        }
      });
    }
    for (auto& th : threads) th.join();
    for (const auto& e : errors)
      if (e) std::rethrow_exception(e);
  }
  if (!opt.json_out.empty()) {
    std::vector<uint64_t> sizes_bytes(plan.sizes.begin(), plan.sizes.end());
    write_result_json(opt.json_out, {{"command", "bench allreduce"},
                                     {"collective", opt.collective},
                                     {"producer", std::string("dtlab ") + kDtlabVersion},
                                     {"world_sizes", opt.world_sizes},
                                     {"algorithms", names},
                                     {"sizes", sizes_bytes},
                                     {"transport", opt.comm},
                                     {"device", opt.device},
                                     {"cores", std::max(1u, std::thread::hardware_concurrency())},
                                     {"results", results},
                                     {"what", std::string("time_us: median seconds per call x 1e6; algbw = bytes / "
                                                          "time; busbw = algbw x ") +
                                                  (blocks ? "(N-1)/N" : "2(N-1)/N") +
                                                  " (nccl-tests); wrong: elements off the exact result"}});
  }
  return kExitOk;
}

}  // namespace lab
