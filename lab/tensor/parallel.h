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

namespace lab {

// Threads that parallel_for may use, the caller's included (>= 1).
void set_compute_threads(int threads);
int compute_threads();

// --nondeterministic (a teaching aid, off by default): reductions over compute threads add each
// contribution as it is ready, with atomic adds, in whatever order the threads get there, as GPU
// kernels with atomicAdd do. Float addition is not associative, so the bits then depend on timing.
// Process-wide, like the pool.
void set_nondeterministic(bool on);
bool nondeterministic();
// *p += v as one atomic read-modify-write (a compare-and-swap loop, like CUDA's atomicAdd on float).
void atomic_add(float* p, float v);

// Calls fn(begin, end, slot) for contiguous slices of [0, count), one slice per compute thread
// (slot = 0 .. compute_threads() - 1, for per-thread scratch space), and returns when all are
// done. Empty slices (count < threads) are not called. An exception from fn is rethrown here.
void parallel_for(int64_t count, const std::function<void(int64_t begin, int64_t end, int slot)>& fn);

}  // namespace lab
