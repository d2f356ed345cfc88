// Tensor: a dense, row-major float32 array with a shape. Deliberately minimal: the lab's ops are
// free functions over contiguous buffers, and every buffer says its shape in a comment.
#pragma once

#include <cassert>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

namespace lab {

struct Tensor {
  std::vector<int64_t> shape;
  std::vector<float> data;

  Tensor() = default;
  explicit Tensor(std::vector<int64_t> s, float fill = 0.0f) : shape(std::move(s)) {
    data.assign(static_cast<size_t>(numel_of(shape)), fill);
  }

  static int64_t numel_of(const std::vector<int64_t>& s) {
    int64_t n = 1;
    for (int64_t d : s) n *= d;
    return n;
  }
  int64_t numel() const { return static_cast<int64_t>(data.size()); }
  int64_t dim(int i) const { return shape.at(static_cast<size_t>(i)); }
  int ndim() const { return static_cast<int>(shape.size()); }
  float* ptr() { return data.data(); }
  const float* ptr() const { return data.data(); }

  // Resize to shape s, reusing the allocation; contents are unspecified afterwards.
  void resize(const std::vector<int64_t>& s) {
    shape = s;
    data.resize(static_cast<size_t>(numel_of(s)));
  }
  void zero() { std::fill(data.begin(), data.end(), 0.0f); }
};

// "(64, 1, 28, 28)": the way PyTorch prints a torch.Size, used in error messages.
std::string shape_str(const std::vector<int64_t>& shape);

}  // namespace lab
