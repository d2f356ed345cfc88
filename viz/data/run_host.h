// RunHost: one live lab::Run on its own driver thread. The driver loads the data and builds the
// run (seconds: never on the GUI thread), starts it, polls it, and finishes it; the GUI thread
// only reads (snapshot, events, steps, status) and sends commands (pause, step, delay), none of
// which blocks on training. Destroying a host stops its run; request_stop() + done() let the app
// retire a host without waiting for it.
#pragma once

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "config.h"
#include "run.h"
#include "run_data.h"

namespace viz {

// Thread priorities (Linux: per-thread nice values). The window's frames are latency work, the
// ranks' iterations throughput work: when both want every core, frames should go first. Two
// levers, both per thread:
//   raise_ui_priority(): the calling thread (the GUI's) to nice - 5: needs CAP_SYS_NICE (root, or
//     rtkit on some desktops); true when it worked.
//   RunHost's `nice` (the app passes --rank-nice): its driver thread lowers itself to base + nice before
//     it builds the run; every thread the run starts (ranks, their communication threads) is
//     created from it or from a rank, and Linux threads inherit their creator's nice value.
//     Raising one's own nice value needs no privilege, so this works for every user. (OpenBLAS
//     starts its worker threads when it loads, before any of this; they work only when a run
//     has a single rank, which gives BLAS every core.)
// The headless CLI uses neither: its ranks keep the process's priority.
bool raise_ui_priority();
// Sets the calling thread's nice value to the process's starting value + increment (0: back to
// normal). False when not permitted.
bool set_thread_nice(int increment);
// The calling thread's nice value, and thread `tid`'s (Linux: /proc/self/task/<tid>/stat; -100
// when unreadable).
int thread_nice();
int thread_nice_of(int tid);

struct HostStatus {
  RunPhase phase = RunPhase::Loading;
  std::string error, hint;   // set when phase == Failed
  int error_code = 0;
  RunSummaryView summary;    // set when phase == Finished
  int64_t train_size = 0, test_size = 0;
  double finished_at = 0;    // lab::now_seconds() when the driver ended
  std::vector<std::string> notes;  // what the run said when it was built (e.g. resumed from a checkpoint)
};

class RunHost {
 public:
  // nice: the run's threads run at the process's nice value + nice (see above; 0: unchanged).
  RunHost(const lab::RunConfig& cfg, bool start_paused, int nice = 0);
  ~RunHost();
  RunHost(const RunHost&) = delete;
  RunHost& operator=(const RunHost&) = delete;

  const lab::RunConfig& config() const { return m_cfg; }
  void request_stop();
  bool done() const { return m_done.load(); }

  // ---- commands (remembered until the run exists) ----
  void pause();
  void resume();
  bool paused() const { return m_paused.load(); }
  void step_ring();        // every rank passes one gate of a collective
  void step_allreduce();   // every rank finishes its current (or next) allreduce
  void step_iteration();   // every rank finishes its current (or next) iteration
  void step_epoch();       // ... up to the end of the current epoch
  void run_to_step(int64_t iteration);  // paused at the start of this iteration
  // run to the start of `iteration`, then into its first gradient allreduce (local SGD: or
  // parameter average) until `ring_steps` of its steps are done (staging a mid-allreduce
  // picture); an iteration without one stops at the start of the next
  void run_into_allreduce(int64_t iteration, int ring_steps);
  void set_delay(double seconds);
  double delay() const { return m_delay.load(); }

  // ---- reading ----
  HostStatus status() const;
  std::shared_ptr<const lab::Snapshot> snapshot() const;  // nullptr before the run exists
  void take_steps(std::vector<lab::StepRecord>& out);     // moves the new records out
  // Rank r's events from index `from`, appended to out; returns the new total (0: no run yet).
  size_t copy_events(int rank, size_t from, std::vector<lab::Event>& out) const;
  std::vector<int64_t> iterations() const;  // per rank, RunControl::iterations()
  std::vector<uint8_t> probe_pixels() const;

 private:
  void drive();
  lab::Run* run() const;  // nullptr until built

  lab::RunConfig m_cfg;
  int m_nice = 0;
  std::thread m_thread;
  std::atomic<bool> m_stop{false}, m_done{false}, m_paused{false};
  std::atomic<double> m_delay{0};
  mutable std::mutex m_mu;      // guards the fields below
  std::condition_variable m_cv;
  std::unique_ptr<lab::Run> m_run;
  HostStatus m_status;
  std::vector<lab::StepRecord> m_new_steps;
  std::vector<uint8_t> m_probe;
  int64_t m_last_target = -1;  // last iteration a step command ran to (clicks add up)
};

}  // namespace viz
