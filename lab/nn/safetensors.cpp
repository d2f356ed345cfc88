#include "safetensors.h"

#include <algorithm>
#include <cstring>
#include <fstream>
#include <set>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "errors.h"

namespace lab {

namespace {

// A header's list of sizes (shape, data_offsets): non-negative integers, each at most `max`. A
// float or a negative number there would be converted with undefined behaviour.
std::vector<uint64_t> sizes(const nlohmann::json& j, uint64_t max, const std::string& what) {
  if (!j.is_array()) throw std::invalid_argument(what + " is not a list");
  std::vector<uint64_t> out;
  for (const nlohmann::json& x : j) {
    if (!x.is_number_unsigned() || x.get<uint64_t>() > max)
      throw std::invalid_argument(what + " holds " + x.dump() + ", not a size");
    out.push_back(x.get<uint64_t>());
  }
  return out;
}

size_t dtype_size(const std::string& dtype) {
  if (dtype == "F32") return 4;
  if (dtype == "I64" || dtype == "F64") return 8;
  return 0;
}

}  // namespace

void write_safetensors(const std::string& path, const std::vector<SafeTensor>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const SafeTensor& t : tensors) {
    header[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {offset, offset + t.bytes.size()}}};
    offset += t.bytes.size();
  }
  std::string h = header.dump();
  while ((8 + h.size()) % 8 != 0) h += ' ';  // keep the byte buffer 8-byte aligned
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) throw IoError("cannot write " + path + ": " + std::strerror(errno));
  const uint64_t n = h.size();
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(n >> (8 * i));
  f.write(reinterpret_cast<const char*>(len), 8);
  f.write(h.data(), static_cast<std::streamsize>(h.size()));
  for (const SafeTensor& t : tensors) f.write(reinterpret_cast<const char*>(t.bytes.data()), static_cast<std::streamsize>(t.bytes.size()));
  f.close();
  if (!f) throw IoError("cannot write " + path + ": " + std::strerror(errno));
}

std::vector<SafeTensor> read_safetensors(const std::string& path, std::map<std::string, std::string>* metadata) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw IoError("cannot read " + path + ": " + std::strerror(errno));
  std::vector<uint8_t> all((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  if (all.size() < 8) throw IoError(path + ": not a safetensors file (shorter than its 8-byte header length)");
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(all[static_cast<size_t>(i)]) << (8 * i);
  if (n > all.size() - 8) throw IoError(path + ": truncated safetensors file (header of " + std::to_string(n) +
                                        " bytes, file has " + std::to_string(all.size()) + ")");
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(all.begin() + 8, all.begin() + 8 + static_cast<long>(n));
  } catch (const std::exception& e) {
    throw IoError(path + ": bad safetensors header: " + e.what());
  }
  if (!header.is_object()) throw IoError(path + ": bad safetensors header: not a JSON object");
  const size_t base = 8 + n;
  const size_t payload = all.size() - base;
  std::vector<std::pair<uint64_t, SafeTensor>> out;  // (begin offset, tensor)
  // The parsed JSON object is sorted by key: restore the writer's order from the data offsets.
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (!it.value().is_object()) throw IoError(path + ": bad safetensors header: __metadata__ is not a JSON object");
      if (metadata)
        for (auto m = it.value().begin(); m != it.value().end(); ++m)
          (*metadata)[m.key()] = m.value().is_string() ? m.value().get<std::string>() : m.value().dump();
      continue;
    }
    SafeTensor t;
    t.name = it.key();
    try {
      t.dtype = it.value().at("dtype").get<std::string>();
      std::vector<uint64_t> shape, off;
      try {
        shape = sizes(it.value().at("shape"), uint64_t{1} << 60, "shape");
        off = sizes(it.value().at("data_offsets"), UINT64_MAX, "data_offsets");
      } catch (const std::invalid_argument& e) {
        throw IoError(path + ": tensor '" + t.name + "': " + e.what());
      }
      if (off.size() != 2 || off[0] > off[1] || off[1] > payload)
        throw IoError(path + ": tensor '" + t.name + "' has data offsets outside the file (truncated?)");
      uint64_t numel = 1;  // of the shape, capped at 2^60 elements (more than any file holds; times 8 bytes fits)
      for (uint64_t d : shape) numel = d == 0 || numel <= (uint64_t{1} << 60) / d ? numel * d : uint64_t{1} << 60;
      t.shape.assign(shape.begin(), shape.end());
      const size_t es = dtype_size(t.dtype);
      if (es && numel * es != off[1] - off[0])
        throw IoError(path + ": tensor '" + t.name + "' has " + std::to_string(off[1] - off[0]) +
                      " bytes, its shape and dtype need " + std::to_string(numel * es));
      t.bytes.assign(all.begin() + static_cast<long>(base + off[0]), all.begin() + static_cast<long>(base + off[1]));
      out.emplace_back(off[0], std::move(t));
    } catch (const nlohmann::json::exception& e) {
      throw IoError(path + ": bad entry '" + t.name + "' in safetensors header: " + e.what());
    }
  }
  std::stable_sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<SafeTensor> tensors;
  for (auto& o : out) tensors.push_back(std::move(o.second));
  return tensors;
}

SafeTensor f32_tensor(const std::string& name, const Tensor& t) {
  SafeTensor s;
  s.name = name;
  s.dtype = "F32";
  s.shape = t.shape;
  const auto* p = reinterpret_cast<const uint8_t*>(t.data.data());
  s.bytes.assign(p, p + t.data.size() * sizeof(float));
  return s;
}

std::vector<SafeTensor> model_tensors(Model& model, bool buffers_only) {
  model.to_host(buffers_only ? kStateBuffers : kStateModel);  // a device's state (executor.h: residency)
  std::vector<SafeTensor> out;
  for (const StateEntry& e : model.state_dict()) {
    if (e.param) {
      if (!buffers_only) out.push_back(f32_tensor(e.name, e.param->value));
    } else if (e.buffer->is_int64) {
      SafeTensor t;
      t.name = e.name;
      t.dtype = "I64";
      t.shape = {};
      const auto* p = reinterpret_cast<const uint8_t*>(&e.buffer->i64);
      t.bytes.assign(p, p + sizeof(int64_t));
      out.push_back(std::move(t));
    } else {
      out.push_back(f32_tensor(e.name, e.buffer->value));
    }
  }
  return out;
}

void load_model_tensors(Model& model, const std::vector<SafeTensor>& tensors, const std::string& path,
                        bool buffers_only) {
  std::map<std::string, const SafeTensor*> by_name;
  for (const SafeTensor& t : tensors) by_name[t.name] = &t;
  std::set<std::string> used;
  for (const StateEntry& e : model.state_dict()) {
    if (buffers_only && e.param) continue;
    auto it = by_name.find(e.name);
    if (it == by_name.end()) throw IoError(path + ": missing key '" + e.name + "' (the model is " + model.describe() + ")");
    const SafeTensor& t = *it->second;
    used.insert(e.name);
    if (e.buffer && e.buffer->is_int64) {
      if (t.dtype != "I64" || Tensor::numel_of(t.shape) != 1)
        throw IoError(path + ": '" + e.name + "' must be a single I64 value, got " + t.dtype + " " + shape_str(t.shape));
      std::memcpy(&e.buffer->i64, t.bytes.data(), sizeof(int64_t));
      continue;
    }
    Tensor& dst = e.param ? e.param->value : e.buffer->value;
    if (t.dtype != "F32") throw IoError(path + ": '" + e.name + "' has dtype " + t.dtype + ", expected F32");
    if (t.shape != dst.shape)
      throw IoError(path + ": size mismatch for " + e.name + ": copying a param with shape " + shape_str(t.shape) +
                    " from the file, the shape in the current model is " + shape_str(dst.shape));
    std::memcpy(dst.data.data(), t.bytes.data(), t.bytes.size());
  }
  for (const SafeTensor& t : tensors)
    if (!used.count(t.name)) throw IoError(path + ": unexpected key '" + t.name + "' for model " + model.describe());
  model.host_changed(kStateModel);
}

}  // namespace lab
