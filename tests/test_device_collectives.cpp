// Collectives on buffers that live on a device (lab/comm/device_memory.h): the ring on a
// device-aware transport (the threads transport, with or without the simulated link) moves and
// adds every chunk with the device's own calls, and any other algorithm, or a transport that is
// not device-aware, has the buffer staged through host memory; the bits are the host's either way.
//
// The device here scrambles its memory (every float's bits XOR a mask), so a transport that read
// device memory as host floats, or added with the CPU's add, or a staging step that forgot to
// download, gives garbage instead of the host's bits.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>
#include <vector>

#include "bench_allreduce.h"
#include "communicator.h"
#include "device_memory.h"
#include "link_model.h"
#include "rank_threads.h"
#include "sim_backend.h"
#include "test_util.h"
#include "sim/sim_executor.h"
#include "threads/transport_threads.h"

namespace {

using lab::AllreduceAlgorithm;

class ScrambledMemory final : public lab::DeviceMemory {
 public:
  static constexpr uint32_t kMask = 0x5a5a5a5au;
  static uint32_t enc(float f) {
    uint32_t b;
    std::memcpy(&b, &f, 4);
    return b ^ kMask;
  }
  static float dec(uint32_t b) {
    b ^= kMask;
    float f;
    std::memcpy(&f, &b, 4);
    return f;
  }
  std::string name() const override { return "scrambled"; }
  void copy(void* dst, const void* src, size_t bytes) override {
    std::memcpy(dst, src, bytes);
    copied += bytes;
  }
  void add(float* acc, const float* in, size_t count) override {
    auto* a = reinterpret_cast<uint32_t*>(acc);
    const auto* b = reinterpret_cast<const uint32_t*>(in);
    for (size_t i = 0; i < count; ++i) a[i] = enc(dec(a[i]) + dec(b[i]));
    added += count * 4;
  }
  void download(void* host, const void* device, size_t bytes) override {
    auto* h = static_cast<float*>(host);
    const auto* d = static_cast<const uint32_t*>(device);
    for (size_t i = 0; i < bytes / 4; ++i) h[i] = dec(d[i]);
    downloaded += bytes;
  }
  void upload(void* device, const void* host, size_t bytes) override {
    auto* d = static_cast<uint32_t*>(device);
    const auto* h = static_cast<const float*>(host);
    for (size_t i = 0; i < bytes / 4; ++i) d[i] = enc(h[i]);
    uploaded += bytes;
  }
  void scale(float* x, float k, size_t count) override {
    auto* a = reinterpret_cast<uint32_t*>(x);
    for (size_t i = 0; i < count; ++i) a[i] = enc(dec(a[i]) * k);
  }
  void divide(float* x, float d, size_t count) override {
    auto* a = reinterpret_cast<uint32_t*>(x);
    for (size_t i = 0; i < count; ++i) a[i] = enc(dec(a[i]) / d);
  }
  bool all_finite(const float* x, size_t count) override {
    const auto* a = reinterpret_cast<const uint32_t*>(x);
    for (size_t i = 0; i < count; ++i)
      if (!std::isfinite(dec(a[i]))) return false;
    return true;
  }
  void* allocate(size_t bytes) override { return ::operator new(bytes > 0 ? bytes : 1); }
  void release(void* p) override { ::operator delete(p); }
  std::atomic<uint64_t> copied{0}, added{0}, downloaded{0}, uploaded{0};
};

// Rank r's input: values of very different magnitudes, so that the order of additions shows in
// the bits.
std::vector<float> input_of(int r, size_t count) {
  std::mt19937 g(1234u + static_cast<unsigned>(r));
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(count);
  for (size_t i = 0; i < count; ++i) v[i] = u(g) * (i % 3 == 0 ? 1e4f : i % 3 == 1 ? 1.0f : 1e-4f);
  return v;
}

std::vector<uint32_t> bits_of(const std::vector<float>& v) {
  std::vector<uint32_t> b(v.size());
  if (!v.empty()) std::memcpy(b.data(), v.data(), v.size() * 4);
  return b;
}

// Every rank's result of allreduce_sum on host buffers, and on the device's (downloaded), in a
// world from make_world.
struct Results {
  std::vector<std::vector<uint32_t>> host, device;
  size_t host_events = 0, device_events = 0;
};

Results run_both(const std::function<std::unique_ptr<lab::World>()>& make_world, int n, size_t count,
                 AllreduceAlgorithm algo, lab::DeviceMemory& mem) {
  Results out;
  out.host.resize(static_cast<size_t>(n));
  out.device.resize(static_cast<size_t>(n));
  for (const bool on_device : {false, true}) {
    std::unique_ptr<lab::World> world = make_world();
    std::vector<lab::EventLog> logs(static_cast<size_t>(n));
    std::vector<std::unique_ptr<lab::Communicator>> comms;
    for (int r = 0; r < n; ++r) {
      world->transport(r).set_timeout(20);
      comms.emplace_back(new lab::Communicator(world->transport(r), &logs[static_cast<size_t>(r)]));
      comms.back()->set_allreduce_algorithm(algo);
    }
    std::vector<std::exception_ptr> errors(static_cast<size_t>(n));
    std::vector<std::thread> threads;
    for (int r = 0; r < n; ++r)
      threads.emplace_back([&, r] {
        try {
          std::vector<float> v = input_of(r, count);
          if (!on_device) {
            comms[static_cast<size_t>(r)]->allreduce_sum(v.data(), count, lab::CollectiveInfo{"grad bucket", 0});
            out.host[static_cast<size_t>(r)] = bits_of(v);
            return;
          }
          std::vector<float> dev(count);  // the device's buffer: scrambled until downloaded
          mem.upload(dev.data(), v.data(), count * 4);
          comms[static_cast<size_t>(r)]->allreduce_sum(dev.data(), count, lab::CollectiveInfo{"grad bucket", 0}, &mem);
          std::vector<float> back(count);
          mem.download(back.data(), dev.data(), count * 4);
          out.device[static_cast<size_t>(r)] = bits_of(back);
        } catch (...) {
          errors[static_cast<size_t>(r)] = std::current_exception();
        }
      });
    for (auto& t : threads) t.join();
    for (int r = 0; r < n; ++r) EXPECT_EQ(labtest::message_of(errors[static_cast<size_t>(r)]), "") << "rank " << r;
    std::vector<lab::Event> ev;
    logs[0].copy_since(0, ev);
    (on_device ? out.device_events : out.host_events) = ev.size();
  }
  return out;
}

std::unique_ptr<lab::World> threads_world(int n) { return std::make_unique<lab::ThreadsWorld>(n); }

}  // namespace

TEST(DeviceCollectives, TheRingOnTheThreadsTransportStaysOnTheDeviceWithTheHostsBits) {
  for (int n : {2, 3, 4})
    for (size_t count : {size_t{0}, size_t{1}, size_t{997}, (size_t{1} << 18) + 5}) {
      ScrambledMemory mem;
      const Results r = run_both([n] { return threads_world(n); }, n, count, AllreduceAlgorithm::Ring, mem);
      for (int k = 0; k < n; ++k) EXPECT_EQ(r.device[static_cast<size_t>(k)], r.host[static_cast<size_t>(k)]) << n << " ranks, " << count;
      EXPECT_EQ(r.device_events, r.host_events) << "the same chunks, steps and events";
      // nothing staged: only the test's own upload and download of each rank's buffer
      EXPECT_EQ(mem.downloaded.load(), uint64_t{4} * count * n) << n << " ranks, " << count;
      EXPECT_EQ(mem.uploaded.load(), uint64_t{4} * count * n);
      // reduce-scatter adds (N-1)/N of the buffer on each rank, the allgather copies as much
      if (count >= static_cast<size_t>(n)) {
        EXPECT_GT(mem.added.load(), 0u);
        EXPECT_GT(mem.copied.load(), 0u);
      }
    }
}

TEST(DeviceCollectives, TheSimulatedLinkForwardsDeviceBuffers) {
  const lab::LinkModelOptions link = lab::link_model_options(5, 10);
  ScrambledMemory mem;
  const size_t count = 50000;
  const Results r = run_both([&] { return std::make_unique<lab::LinkModelWorld>(threads_world(4), link); }, 4, count,
                             AllreduceAlgorithm::Ring, mem);
  for (int k = 0; k < 4; ++k) EXPECT_EQ(r.device[static_cast<size_t>(k)], r.host[static_cast<size_t>(k)]);
  EXPECT_EQ(mem.downloaded.load(), uint64_t{4} * count * 4) << "no staging";
}

// The tree and the naive gather are written over host memory: a device buffer goes down once and
// up once per rank and collective, and the bits are the algorithm's own.
TEST(DeviceCollectives, OtherAlgorithmsStageTheBufferThroughTheHost) {
  for (AllreduceAlgorithm algo : {AllreduceAlgorithm::Naive, AllreduceAlgorithm::Tree}) {
    ScrambledMemory mem;
    const size_t count = 4099;
    const Results r = run_both([] { return threads_world(3); }, 3, count, algo, mem);
    for (int k = 0; k < 3; ++k) EXPECT_EQ(r.device[static_cast<size_t>(k)], r.host[static_cast<size_t>(k)]) << lab::allreduce_algorithm_name(algo);
    EXPECT_EQ(mem.downloaded.load(), uint64_t{4} * count * 3 * 2) << "the test's download and the staging's";
    EXPECT_EQ(mem.uploaded.load(), uint64_t{4} * count * 3 * 2);
    EXPECT_EQ(mem.added.load(), 0u);
  }
}

// The simulated GPU's memory (backends/sim), which `--device sim` runs hand to the collectives:
// the ring stays there, and its counts say so.
TEST(DeviceCollectives, TheSimulatedGpusMemoryGivesTheHostsBits) {
  lab::SimDeviceMemory mem;
  const size_t count = 70001;
  const Results r = run_both([] { return threads_world(4); }, 4, count, AllreduceAlgorithm::Ring, mem);
  for (int k = 0; k < 4; ++k) EXPECT_EQ(r.device[static_cast<size_t>(k)], r.host[static_cast<size_t>(k)]);
  EXPECT_EQ(mem.downloaded(), uint64_t{4} * count * 4);
  // each rank: (N-1)/N of the buffer added in, (N-1)/N copied in by the allgather
  EXPECT_EQ(mem.device_bytes(), uint64_t{4} * count * 4 * 2 * 3 / 4);
}

// dtlab bench allreduce --device: every rank's buffer in the device's memory. The ring adds and
// copies there (the simulated GPU's counters), naive and tree are staged through the host, every
// result is the exact sum (#wrong 0), and the copy floor is a copy on the device. The command
// reaches the same memory through the device's executors (--device sim).
TEST(DeviceCollectives, BenchAllreduceWorksInTheDevicesMemory) {
  lab::AllreduceBenchPlan plan;
  plan.sizes = {4096, 65536};
  plan.algorithms = {AllreduceAlgorithm::Ring, AllreduceAlgorithm::Naive, AllreduceAlgorithm::Tree};
  plan.warmup = 1;
  plan.batches = 2;
  plan.batch_seconds = 0.001;
  plan.max_calls = 4;
  const int n = 3;
  lab::SimDeviceMemory mem;
  lab::ThreadsWorld world(n);
  std::vector<lab::AllreduceBenchRow> rows;
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      std::vector<lab::AllreduceBenchRow> mine = lab::bench_allreduce_rank(world.transport(r), n, plan, {}, &mem);
      if (r == 0) rows = mine;
    });
  for (auto& t : threads) t.join();
  ASSERT_EQ(rows.size(), 2u);
  for (const lab::AllreduceBenchRow& row : rows) {
    for (uint64_t w : row.wrong) EXPECT_EQ(w, 0u) << row.bytes;
    EXPECT_GT(row.floor_seconds, 0.0);
  }
  EXPECT_GT(mem.device_bytes(), uint64_t{2} * 65536) << "the ring's adds and copies, and the floor's copies";
  EXPECT_GT(mem.downloaded(), 0u);

  testutil::SimBackend backend(/*resident=*/true);
  testutil::TempDir dir;
  lab::BenchAllreduceOptions opt;
  opt.device = "sim";
  opt.world_sizes = {2};
  opt.min_bytes = opt.max_bytes = 4096;
  opt.warmup = 1;
  opt.batches = 2;
  opt.batch_seconds = 0.001;
  opt.json_out = dir.file("result.json");
  std::FILE* out = std::tmpfile();
  opt.out = out;
  EXPECT_EQ(lab::bench_allreduce(opt), 0);
  std::fclose(out);
  const nlohmann::json j = nlohmann::json::parse(testutil::read_file(dir.file("result.json")));
  EXPECT_EQ(j["device"], "sim");
  for (const char* a : {"ring", "naive", "tree"}) EXPECT_EQ(j["results"]["2"][a][0]["wrong"], 0) << a;
}

// Reduce-scatter then allgather, in place (sharded_collectives.h), on the device's buffers: the
// ring moves and adds there with the host's bits and nothing staged; the naive and tree versions
// stage each collective's whole buffer down and up, with their own bits.
TEST(DeviceCollectives, ReduceScatterAndAllgatherOnTheDeviceGiveTheHostsBits) {
  const int n = 4;
  const size_t count = 30011;  // per block
  const size_t all = n * count;
  for (AllreduceAlgorithm algo : {AllreduceAlgorithm::Ring, AllreduceAlgorithm::Naive, AllreduceAlgorithm::Tree}) {
    ScrambledMemory mem;
    std::vector<std::vector<uint32_t>> host(n), dev(n), host_rs(n), dev_rs(n);
    for (const bool on_device : {false, true}) {
      labtest::RankWorld w(n);
      auto errors = w.run([&](int r, lab::Communicator& comm) {
        comm.set_allreduce_algorithm(algo);
        std::vector<float> v = input_of(r, all);
        float* data = v.data();
        std::vector<float> d(all);
        if (on_device) {
          mem.upload(d.data(), v.data(), all * 4);
          data = d.data();
        }
        auto bits = [&] {
          std::vector<float> back(all);
          if (on_device) mem.download(back.data(), d.data(), all * 4);
          else back = v;
          return bits_of(back);
        };
        comm.reduce_scatter_sum(data, count, {"shard", 0}, on_device ? &mem : nullptr);
        const std::vector<uint32_t> b = bits();
        (on_device ? dev_rs : host_rs)[r].assign(b.begin() + r * count, b.begin() + (r + 1) * count);
        comm.allgather_in_place(data, count, {"shard", 0}, on_device ? &mem : nullptr);
        (on_device ? dev : host)[r] = bits();
      });
      for (int r = 0; r < n; ++r) EXPECT_EQ(labtest::message_of(errors[r]), "") << "rank " << r;
    }
    const std::string name = lab::allreduce_algorithm_name(algo);
    for (int r = 0; r < n; ++r) {
      EXPECT_EQ(dev_rs[r], host_rs[r]) << name << " rank " << r << "'s block";
      EXPECT_EQ(dev[r], host[r]) << name << " rank " << r;
      EXPECT_EQ(dev[r], dev[0]) << name << ": every rank holds the same buffer";
    }
    const uint64_t test_io = uint64_t{4} * all * n * 2;  // the test's two downloads per rank
    if (algo == AllreduceAlgorithm::Ring) {
      EXPECT_EQ(mem.downloaded.load(), test_io) << "nothing staged";
      EXPECT_EQ(mem.added.load(), uint64_t{4} * count * (n - 1) * n) << "each rank adds N-1 blocks in";
    } else {
      EXPECT_EQ(mem.downloaded.load(), test_io + uint64_t{4} * all * n * 2) << name << ": each collective staged";
      EXPECT_EQ(mem.added.load(), 0u) << name;
    }
  }
}
