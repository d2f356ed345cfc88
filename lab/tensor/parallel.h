// Intra-op parallelism for a rank that has more than one core (one process, --threads N): the
// layers split their work over a small pool of compute threads with parallel_for. Ranks emulated
// as threads get one compute thread each (everything inline), as they get one BLAS thread.
//
// Determinism: parallel_for cuts [0, count) into the same contiguous slices for a given thread
// count, and the layers only split work whose results do not depend on the cut (independent
// outputs, or partial sums over fixed blocks combined in block order): a run gives the same bits
// with 1 or N compute threads.
//
// The pool is process-wide, like OpenBLAS's: set_compute_threads() sizes it (and leaves BLAS with
// one thread, since the layers call sgemm from inside parallel_for). One caller at a time uses
// it; a second concurrent caller, and any nested call, runs its loop inline.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

namespace lab {

// Threads that parallel_for may use, the caller's included (>= 1).
void set_compute_threads(int threads);
int compute_threads();

// --nondeterministic (a teaching aid, off by default): the gradient reductions add their partial
// sums in an order that changes from run to run (arrival_order below), and over several compute
// threads with atomic adds, in whatever order the threads get there, as GPU kernels with atomicAdd
// do. Float addition is not associative, so the bits then differ between runs. Process-wide, like
// the pool.
void set_nondeterministic(bool on);
bool nondeterministic();
// *p += v as one atomic read-modify-write (a compare-and-swap loop, like CUDA's atomicAdd on float).
void atomic_add(float* p, float v);

// --nondeterministic in the rank's own backward, whatever the number of threads. A GPU computes a
// reduction over many contributions (a gradient summed over the batch) as partial sums, one per
// thread block, and adds each partial into the result with an atomic add when its block finishes:
// in an order that changes from run to run. The layers emulate that as a split-K reduction: they
// cut the contributions into partials (blocks of samples; of positions too where a sample has
// many), sum each partial in a fixed order, and add the partials in the order this draws: a
// permutation of 0 .. count - 1, order[i] the partial added i-th, drawn per call from a
// per-thread generator seeded from std::random_device and the clock, so two runs draw different
// orders. Two contributions add the same either way (a + b == b + a in IEEE float): only a
// reduction of three or more partials can change.
void arrival_order(int64_t count, std::vector<int64_t>& order);

// The partials of a reduction over `samples` samples of `positions` contributions each (1 for a
// Linear layer or BatchNorm1d, H*W for Conv2d and BatchNorm2d): samples >= 3, at most max_partials
// blocks of whole samples; fewer samples, each sample's positions in kPositionChunks chunks, so
// that a batch of one still has several partials where its positions allow.
struct ReductionSplit {
  static constexpr int64_t kMaxPartials = 8;
  static constexpr int64_t kPositionChunks = 4;
  int64_t sample_blocks = 1;    // blocks of whole samples (when chunks == 1)
  int64_t chunks = 1;           // position chunks per sample (> 1: one partial per sample and chunk)
  int64_t samples = 0, positions = 1;
  int64_t count() const { return chunks > 1 ? samples * chunks : sample_blocks; }
  // partial p covers samples [s0, s1) and, within each, positions [i0, i1)
  void range(int64_t p, int64_t& s0, int64_t& s1, int64_t& i0, int64_t& i1) const;
};
ReductionSplit split_reduction(int64_t samples, int64_t positions,
                               int64_t max_partials = ReductionSplit::kMaxPartials);

// The pool's size and --nondeterministic for as long as it lives, then the values it found: a run
// sets both for its ranks (Run::start) and must not leave them to whatever runs next in the same
// process (the app's next run, an evaluation, the next test of a test binary). Scopes nest; one
// let go while a newer one lives (the app lets go of a finished run after starting the next)
// restores nothing, and the newer one gives back, in its turn, what this one found.
class ComputeSettingsScope {
 public:
  ComputeSettingsScope(int threads, bool nondeterministic);
  ~ComputeSettingsScope();
  ComputeSettingsScope(const ComputeSettingsScope&) = delete;
  ComputeSettingsScope& operator=(const ComputeSettingsScope&) = delete;

 private:
  int m_threads;             // what it found
  bool m_nondeterministic;
};

// Calls fn(begin, end, slot) for contiguous slices of [0, count), one slice per compute thread
// (slot = 0 .. compute_threads() - 1, for per-thread scratch space), and returns when all are
// done. Empty slices (count < threads) are not called. An exception from fn is rethrown here.
void parallel_for(int64_t count, const std::function<void(int64_t begin, int64_t end, int slot)>& fn);

}  // namespace lab
