// Helpers shared by the GPU backend's tests (tests/gpu): the device probe and the skip it decides,
// random inputs, and running one function per rank on threads.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <exception>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "cuda_device.h"
#include "float_compare.h"
#include "rank_threads.h"

namespace gputest {

// What this process sees (cached): no GPU makes every GPU test SKIPPED with the probe's reason.
inline const lab::cuda::CudaProbe& probe() {
  static const lab::cuda::CudaProbe p = lab::cuda::cuda_devices();
  return p;
}

// Runs fn(rank) on one thread per rank and joins them all; errors[r] is what rank r threw.
inline std::vector<std::exception_ptr> run_ranks(int n, const std::function<void(int)>& fn) {
  std::vector<std::exception_ptr> errors(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        fn(r);
      } catch (...) {
        errors[static_cast<size_t>(r)] = std::current_exception();
      }
    });
  for (std::thread& t : threads) t.join();
  return errors;
}

// Random inputs: tests/float_compare.h's.
using testutil::randn;

// The message of an exception ("" for none): tests/rank_threads.h's.
using labtest::message_of;

}  // namespace gputest

#define SKIP_WITHOUT_GPU() \
  if (!gputest::probe().ok()) GTEST_SKIP() << gputest::probe().reason
