// The compute pool behind parallel_for: threads - 1 workers and the caller.
//
// Protocol: the caller publishes the job (fn, count, threads) and bumps `generation`; each worker
// runs its slice and decrements `remaining`; the caller runs slice 0, then waits for `remaining`
// to reach 0. Workers wait for the next generation by spinning for kSpinSeconds (the layers of one
// training step call parallel_for back to back), then sleep on a condition variable.
#include "parallel.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <memory>
#include <mutex>
#include <numeric>
#include <random>
#include <thread>
#include <vector>

#include "gemm.h"
#include "mutation.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace lab {

namespace {

constexpr double kSpinSeconds = 200e-6;

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#endif
}

double seconds_now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

thread_local bool t_inside = false;  // this thread is running a slice (nested calls run inline)

class Pool {
 public:
  ~Pool() { resize(1); }

  int threads() const { return m_threads; }

  void resize(int threads) {
    std::lock_guard<std::mutex> use(m_use);
    if (threads == m_threads) return;
    {
      std::lock_guard<std::mutex> lock(m_mu);
      m_stop = true;
      m_generation.fetch_add(1, std::memory_order_release);
    }
    m_cv.notify_all();
    for (auto& t : m_workers) t.join();
    m_workers.clear();
    m_stop = false;
    m_threads = threads;
    // A worker waits for the generation after this one: read it here, not in the new thread,
    // which may start after the first job was already posted.
    const uint64_t now = m_generation.load(std::memory_order_acquire);
    for (int slot = 1; slot < threads; ++slot) m_workers.emplace_back([this, slot, now] { work(slot, now); });
  }

  void run(int64_t count, const std::function<void(int64_t, int64_t, int)>& fn) {
    std::unique_lock<std::mutex> use(m_use, std::try_to_lock);
    // m_threads only once m_use is held: resize() writes it under m_use (another Run's thread may
    // be resizing the pool; ThreadSanitizer found the race)
    if (!use.owns_lock() || t_inside || m_threads <= 1 || count <= 1) {
      if (count > 0) fn(0, count, 0);
      return;
    }
    m_fn = &fn;
    m_count = count;
    m_error = nullptr;
    m_remaining.store(m_threads - 1, std::memory_order_relaxed);
    {
      std::lock_guard<std::mutex> lock(m_mu);
      m_generation.fetch_add(1, std::memory_order_release);
    }
    m_cv.notify_all();
    slice(0);
    for (int spins = 0; m_remaining.load(std::memory_order_acquire) != 0; ++spins) {
      if (spins < 4096) cpu_relax();
      else std::this_thread::yield();  // a worker without a core of its own: let it run
    }
    m_fn = nullptr;
    if (m_error) std::rethrow_exception(m_error);
  }

 private:
  void slice(int slot) {
    const int64_t begin = m_count * slot / m_threads, end = m_count * (slot + 1) / m_threads;
    t_inside = true;
    try {
      if (begin < end) (*m_fn)(begin, end, slot);
    } catch (...) {
      std::lock_guard<std::mutex> lock(m_mu);
      if (!m_error) m_error = std::current_exception();
    }
    t_inside = false;
  }

  void work(int slot, uint64_t seen) {
    for (;;) {
      // Spin a while for the next job, then sleep.
      const double until = seconds_now() + kSpinSeconds;
      int spins = 0;
      while (m_generation.load(std::memory_order_acquire) == seen) {
        cpu_relax();
        if (++spins % 64 == 0 && seconds_now() > until) {
          std::unique_lock<std::mutex> lock(m_mu);
          m_cv.wait(lock, [&] { return m_generation.load(std::memory_order_acquire) != seen; });
        }
      }
      seen = m_generation.load(std::memory_order_acquire);
      if (m_stop) return;
      slice(slot);
      m_remaining.fetch_sub(1, std::memory_order_acq_rel);
    }
  }

  std::mutex m_use;  // one caller at a time
  std::mutex m_mu;   // guards the sleep and m_error
  std::condition_variable m_cv;
  std::vector<std::thread> m_workers;
  int m_threads = 1;
  bool m_stop = false;
  std::atomic<uint64_t> m_generation{0};
  std::atomic<int> m_remaining{0};
  const std::function<void(int64_t, int64_t, int)>* m_fn = nullptr;
  int64_t m_count = 0;
  std::exception_ptr m_error;
};

Pool& pool() {
  static Pool p;
  return p;
}

}  // namespace

void set_compute_threads(int threads) {
  gemm_set_threads(1);  // the layers call sgemm from inside their slices
  pool().resize(std::max(1, threads));
}

int compute_threads() { return pool().threads(); }

namespace {
std::atomic<bool> g_nondeterministic{false};
}  // namespace

void set_nondeterministic(bool on) {
  if (mutated("nondeterministic-ignored")) on = false;  // a lesson's mutation test (mutation.h)
  g_nondeterministic.store(on, std::memory_order_relaxed);
}
bool nondeterministic() { return g_nondeterministic.load(std::memory_order_relaxed); }

void atomic_add(float* p, float v) {
  float expected;
  __atomic_load(p, &expected, __ATOMIC_RELAXED);
  float desired = expected + v;
  while (!__atomic_compare_exchange(p, &expected, &desired, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
    desired = expected + v;
}

void arrival_order(int64_t count, std::vector<int64_t>& order) {
  // One generator per thread (ranks are threads), seeded once from the device and the clock: the
  // draws differ between runs, and no two threads share state.
  thread_local std::mt19937_64 gen([] {
    std::random_device device;
    std::seed_seq seq{device(), device(), static_cast<unsigned>(std::chrono::steady_clock::now().time_since_epoch().count()),
                      static_cast<unsigned>(std::hash<std::thread::id>()(std::this_thread::get_id()))};
    return std::mt19937_64(seq);
  }());
  order.resize(static_cast<size_t>(count));
  std::iota(order.begin(), order.end(), int64_t{0});
  std::shuffle(order.begin(), order.end(), gen);
}

ReductionSplit split_reduction(int64_t samples, int64_t positions, int64_t max_partials) {
  ReductionSplit s;
  s.samples = samples;
  s.positions = positions;
  if (samples >= 3 || positions < 2) {
    s.sample_blocks = std::max<int64_t>(1, std::min(samples, max_partials));
  } else {
    s.chunks = std::min(positions, ReductionSplit::kPositionChunks);
  }
  return s;
}

void ReductionSplit::range(int64_t p, int64_t& s0, int64_t& s1, int64_t& i0, int64_t& i1) const {
  if (chunks > 1) {
    s0 = p / chunks;
    s1 = s0 + 1;
    const int64_t k = p % chunks;
    i0 = positions * k / chunks;
    i1 = positions * (k + 1) / chunks;
    return;
  }
  s0 = samples * p / sample_blocks;
  s1 = samples * (p + 1) / sample_blocks;
  i0 = 0;
  i1 = positions;
}

void parallel_for(int64_t count, const std::function<void(int64_t, int64_t, int)>& fn) { pool().run(count, fn); }

namespace {
std::mutex g_scopes_mu;
std::vector<ComputeSettingsScope*> g_scopes;  // the live scopes, oldest first
}  // namespace

ComputeSettingsScope::ComputeSettingsScope(int threads, bool nondeterministic) {
  std::lock_guard<std::mutex> lock(g_scopes_mu);
  m_threads = compute_threads();
  m_nondeterministic = lab::nondeterministic();
  set_compute_threads(threads);
  set_nondeterministic(nondeterministic);
  g_scopes.push_back(this);
}

ComputeSettingsScope::~ComputeSettingsScope() {
  std::lock_guard<std::mutex> lock(g_scopes_mu);
  const auto it = std::find(g_scopes.begin(), g_scopes.end(), this);
  if (it + 1 == g_scopes.end()) {  // the newest: what it found comes back
    set_compute_threads(m_threads);
    set_nondeterministic(m_nondeterministic);
  } else {  // a newer scope's settings stand; it will give back what this one found
    (*(it + 1))->m_threads = m_threads;
    (*(it + 1))->m_nondeterministic = m_nondeterministic;
  }
  g_scopes.erase(it);
}

}  // namespace lab
