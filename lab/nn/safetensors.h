// safetensors files (the format of Hugging Face's safetensors library, readable from PyTorch):
//   u64 little-endian header length N | N bytes of JSON header | raw tensor bytes.
// The header maps each tensor name to {"dtype", "shape", "data_offsets": [begin, end)} (offsets
// into the byte buffer) plus an optional "__metadata__" map of strings.
// dtlab writes models under PyTorch's state_dict names ("1.weight", "2.num_batches_tracked"),
// float32 as "F32" and num_batches_tracked as a 0-dimensional "I64", so a PyTorch state_dict
// loads them as is.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "model.h"

namespace lab {

struct SafeTensor {
  std::string name;
  std::string dtype;            // "F32" | "I64"
  std::vector<int64_t> shape;   // [] for a scalar
  std::vector<uint8_t> bytes;   // little-endian payload
};

// Throws IoError naming the file when it cannot be written.
void write_safetensors(const std::string& path, const std::vector<SafeTensor>& tensors,
                       const std::map<std::string, std::string>& metadata);
// Throws IoError naming the file and the problem (truncated, bad header, offsets out of range).
std::vector<SafeTensor> read_safetensors(const std::string& path, std::map<std::string, std::string>* metadata = nullptr);

// A float32 tensor as a safetensors entry called `name` ("F32", its shape, its bytes).
SafeTensor f32_tensor(const std::string& name, const Tensor& t);

// The model's parameters and buffers (or buffers only) as safetensors entries, state_dict order.
std::vector<SafeTensor> model_tensors(Model& model, bool buffers_only = false);
// Loads every parameter and buffer of the model (or every buffer: what model_tensors(model, true)
// wrote) from tensors. Missing or unexpected keys, wrong shapes or dtypes are an IoError naming
// the file (`path`) and the key, like load_state_dict's strict mode.
void load_model_tensors(Model& model, const std::vector<SafeTensor>& tensors, const std::string& path,
                        bool buffers_only = false);

}  // namespace lab
