// CommWorker: one rank's communication thread, as DDP has one (the process group's worker) so
// that a gradient bucket's allreduce runs while backward computes the next gradients.
//
// Protocol. The rank's own thread submit()s jobs (one collective each); the worker runs them one
// at a time in submission order. Every rank submits its collectives in the same order, so the
// collectives' sequence numbers (Communicator op_seq) stay identical on all ranks.
// While the worker may be running a job, the rank thread must not use the Communicator itself:
// before any collective of its own (SyncBatchNorm's, a buffer broadcast) it calls wait_idle(),
// which orders that collective after the queued ones, on every rank alike.
// Errors: a job that throws (a failed peer, a timeout, a stop request raised at a gate) makes the
// worker drop the jobs queued after it; the exception is rethrown on the rank thread by the next
// submit() or wait_idle(). The Communicator has already aborted the world by then, so peers
// blocked in the same collective fail at once.
// Lifetime: the thread starts with the first submit(). The destructor waits for a running job;
// declare the worker where it outlives the rank's error handling (which aborts the world), so a
// job blocked on a peer ends by that abort rather than by its timeout.
#pragma once

#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

namespace lab {

class CommWorker {
 public:
  CommWorker() = default;
  ~CommWorker();
  CommWorker(const CommWorker&) = delete;
  CommWorker& operator=(const CommWorker&) = delete;

  // Queues job after those already submitted. Rethrows a failed job's exception instead.
  void submit(std::function<void()> job);
  // Blocks until every submitted job has finished; rethrows the first exception a job threw.
  void wait_idle();

 private:
  void loop();
  void rethrow_locked(std::unique_lock<std::mutex>& lock);

  std::mutex m_mu;
  std::condition_variable m_cv;       // wakes the worker: a job or the stop flag
  std::condition_variable m_idle_cv;  // wakes wait_idle(): queue drained or a job failed
  std::deque<std::function<void()>> m_jobs;
  bool m_busy = false;                // a job is running
  bool m_stop = false;
  std::exception_ptr m_error;
  std::thread m_thread;
};

}  // namespace lab
