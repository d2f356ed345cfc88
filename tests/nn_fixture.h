// Helpers for tests that compare with golden values from PyTorch (tools/fixtures/gen_nn.py):
// loading a fixture, turning JSON arrays into tensors, and tolerance comparisons that print the
// first mismatches and the largest difference.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "tensor.h"

namespace nnfix {

using nlohmann::json;

inline const json& load(const std::string& name) {
  static std::map<std::string, json> cache;
  auto it = cache.find(name);
  if (it != cache.end()) return it->second;
  const std::string path = std::string(DTLAB_FIXTURES_DIR) + "/" + name;
  std::ifstream in(path);
  if (!in) throw std::runtime_error("missing fixture " + path + " (regenerate: /usr/bin/python3 tools/fixtures/gen_nn.py)");
  return cache[name] = json::parse(in);
}

inline std::vector<float> floats(const json& j) {
  std::vector<float> v;
  v.reserve(j.size());
  for (const auto& e : j) v.push_back(static_cast<float>(e.get<double>()));
  return v;
}

inline std::vector<int64_t> shape(const json& j) { return j.get<std::vector<int64_t>>(); }

inline lab::Tensor tensor(const json& values, const std::vector<int64_t>& s) {
  lab::Tensor t(s);
  t.data = floats(values);
  EXPECT_EQ(static_cast<int64_t>(t.data.size()), lab::Tensor::numel_of(s));
  return t;
}

// |got - want| <= atol + rtol * |want| elementwise; on failure reports the first few mismatches
// and the largest absolute difference.
inline ::testing::AssertionResult close(const float* got, const std::vector<float>& want, double rtol, double atol) {
  int bad = 0;
  double max_diff = 0.0;
  size_t max_at = 0;
  std::ostringstream os;
  for (size_t i = 0; i < want.size(); ++i) {
    const double d = std::fabs(static_cast<double>(got[i]) - want[i]);
    if (!(d <= max_diff)) {
      max_diff = d;
      max_at = i;
    }
    if (!(d <= atol + rtol * std::fabs(want[i]))) {
      if (bad < 5) os << "\n  [" << i << "] got " << got[i] << " want " << want[i] << " diff " << d;
      ++bad;
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << bad << " of " << want.size() << " values differ (rtol " << rtol << ", atol "
                                       << atol << "); max diff " << max_diff << " at [" << max_at << "]" << os.str();
}

inline ::testing::AssertionResult close(const std::vector<float>& got, const std::vector<float>& want, double rtol,
                                        double atol) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << "size " << got.size() << " != expected " << want.size();
  return close(got.data(), want, rtol, atol);
}

inline ::testing::AssertionResult close(const lab::Tensor& got, const std::vector<float>& want, double rtol,
                                        double atol) {
  return close(got.data, want, rtol, atol);
}

inline uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

// sum_i bits[i] * (2i + 1) mod 2^64 over the float32 bit patterns (as gen_nn.py's checksum()).
inline uint64_t checksum(const std::vector<float>& v) {
  uint64_t h = 0;
  for (size_t i = 0; i < v.size(); ++i) h += static_cast<uint64_t>(bits_of(v[i])) * (2 * static_cast<uint64_t>(i) + 1);
  return h;
}

}  // namespace nnfix
