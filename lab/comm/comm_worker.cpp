#include "comm_worker.h"

namespace lab {

CommWorker::~CommWorker() {
  {
    std::lock_guard<std::mutex> lock(m_mu);
    m_stop = true;
    m_jobs.clear();
  }
  m_cv.notify_all();
  if (m_thread.joinable()) m_thread.join();
}

void CommWorker::rethrow_locked(std::unique_lock<std::mutex>& lock) {
  if (!m_error) return;
  std::exception_ptr e = m_error;
  m_error = nullptr;
  lock.unlock();
  std::rethrow_exception(e);
}

void CommWorker::submit(std::function<void()> job) {
  std::unique_lock<std::mutex> lock(m_mu);
  rethrow_locked(lock);
  if (!m_thread.joinable()) m_thread = std::thread([this] { loop(); });
  m_jobs.push_back(std::move(job));
  m_cv.notify_one();
}

void CommWorker::wait_idle() {
  std::unique_lock<std::mutex> lock(m_mu);
  m_idle_cv.wait(lock, [&] { return m_error || (m_jobs.empty() && !m_busy); });
  // A failed job: wait for the worker to be done with it too, so nothing runs behind our back.
  m_idle_cv.wait(lock, [&] { return !m_busy; });
  rethrow_locked(lock);
}

void CommWorker::loop() {
  std::unique_lock<std::mutex> lock(m_mu);
  for (;;) {
    m_cv.wait(lock, [&] { return m_stop || !m_jobs.empty(); });
    if (m_stop) return;
    std::function<void()> job = std::move(m_jobs.front());
    m_jobs.pop_front();
    m_busy = true;
    lock.unlock();
    std::exception_ptr error;
    try {
      job();
    } catch (...) {
      error = std::current_exception();
    }
    lock.lock();
    m_busy = false;
    if (error) {
      if (!m_error) m_error = error;
      m_jobs.clear();  // later collectives depend on this one; the world is aborted anyway
    }
    m_idle_cv.notify_all();
  }
}

}  // namespace lab
