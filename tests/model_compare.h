// Test helper: how far apart two models' parameters and buffers are (the pipeline's and tensor
// parallelism's tests compare a run with one-rank training, and two schedules with each other).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "model.h"

namespace testutil {

// The largest difference relative to the tensor's largest value (float32 tensors), and the
// elements whose bits differ (num_batches_tracked included).
struct Apart {
  double rel = 0;
  size_t differ = 0;
};

inline Apart apart(lab::Model& a, lab::Model& b) {
  Apart out;
  const auto x = a.state_dict(), y = b.state_dict();
  EXPECT_EQ(x.size(), y.size());
  for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
    if (x[i].buffer && x[i].buffer->is_int64) {
      out.differ += x[i].buffer->i64 != y[i].buffer->i64;
      continue;
    }
    const std::vector<float>& u = x[i].param ? x[i].param->value.data : x[i].buffer->value.data;
    const std::vector<float>& v = y[i].param ? y[i].param->value.data : y[i].buffer->value.data;
    double big = 0, worst = 0;
    for (size_t k = 0; k < u.size() && k < v.size(); ++k) {
      big = std::max(big, std::fabs(static_cast<double>(v[k])));
      worst = std::max(worst, std::fabs(static_cast<double>(u[k]) - v[k]));
      out.differ += std::memcmp(&u[k], &v[k], sizeof(float)) != 0;
    }
    out.rel = std::max(out.rel, big > 0 ? worst / big : worst);
  }
  return out;
}

}  // namespace testutil
