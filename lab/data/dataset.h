// Fashion-MNIST from gzipped IDX files (Debian: dataset-fashion-mnist, files under
// /usr/share/datasets/fashion-mnist). Preprocessed as torchvision users do it:
// ToTensor (pixel / 255) then Normalize(mean 0.2860, std 0.3530).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tensor.h"

namespace lab {

constexpr const char* kDefaultDataDir = "/usr/share/datasets/fashion-mnist";
constexpr float kFashionMean = 0.2860f;
constexpr float kFashionStd = 0.3530f;

struct Dataset {
  std::string name;             // "train" or "test"
  std::string images_path;      // the files it came from
  std::string labels_path;
  int64_t size = 0;             // L
  std::vector<float> images;    // (L, 1, 28, 28), normalized
  std::vector<uint8_t> raw;     // (L, 28, 28) pixels 0..255 as stored (for the GUI)
  std::vector<int> labels;      // (L,) in 0..9
};

// The samples idx of data as one batch: x (n, 1, 28, 28) and their labels (n,).
void gather_batch(const Dataset& data, const std::vector<int64_t>& idx, Tensor& x, std::vector<int>& labels);

// Reads train-{images-idx3,labels-idx1}-ubyte.gz (train) or t10k-* (test) from dir.
// limit > 0 keeps the first `limit` samples (all of them when limit >= L); 0 keeps all; a
// negative limit is a ConfigError. Files are validated whole whatever the limit. Throws
// DataError naming the file and the problem (missing, corrupt gzip, bad magic, wrong
// dimensions, short payload or trailing garbage, count mismatch, label >= 10); a missing
// default directory says how to install the Debian package.
Dataset load_fashion_mnist(const std::string& dir, bool train, int64_t limit = 0);

// The hint attached to "directory/file not found" errors: the apt-get command for the default
// directory, otherwise a pointer to --data-dir.
std::string missing_data_hint(const std::string& dir);

// ToTensor + Normalize of one stored pixel (0..255), rounded exactly as PyTorch's float32 ops
// round it: ((pixel / 255) - 0.2860) / 0.3530, each step in float.
float normalize_pixel(uint8_t pixel);

// Checks all four files of a directory before training starts (same errors as above).
void check_fashion_mnist(const std::string& dir);

}  // namespace lab
