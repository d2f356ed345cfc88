// Test helper: run one function per rank, each on its own std::thread, over a ThreadsWorld.
// Every thread is joined; each rank's exception (if any) is kept for the test to inspect.
#pragma once

#include <exception>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "communicator.h"
#include "events.h"
#include "threads/transport_threads.h"

namespace labtest {

struct RankWorld {
  explicit RankWorld(int n, double timeout_s = 10.0, lab::StepGate* gate = nullptr) : world(n), logs(n) {
    for (int r = 0; r < n; ++r) {
      world.transport(r).set_timeout(timeout_s);
      comms.emplace_back(new lab::Communicator(world.transport(r), &logs[r], gate));
    }
  }
  int size() const { return world.world_size(); }

  // Runs fn(rank, comm) on one thread per rank and joins them all. errors[r] holds what rank r
  // threw, or nullptr.
  std::vector<std::exception_ptr> run(const std::function<void(int, lab::Communicator&)>& fn) {
    const int n = size();
    std::vector<std::exception_ptr> errors(n);
    std::vector<std::thread> threads;
    for (int r = 0; r < n; ++r)
      threads.emplace_back([&, r] {
        try {
          fn(r, *comms[r]);
        } catch (...) {
          errors[r] = std::current_exception();
        }
      });
    for (auto& t : threads) t.join();
    return errors;
  }

  std::vector<lab::Event> events(int r) const {
    std::vector<lab::Event> out;
    logs[r].copy_since(0, out);
    return out;
  }

  lab::ThreadsWorld world;
  std::vector<lab::EventLog> logs;
  std::vector<std::unique_ptr<lab::Communicator>> comms;
};

// The message of a stored exception ("" if none).
inline std::string message_of(const std::exception_ptr& p) {
  if (!p) return "";
  try {
    std::rethrow_exception(p);
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "unknown exception";
  }
}

}  // namespace labtest
