#include "device.h"

#include <cctype>

#include "errors.h"

namespace lab {

DeviceSpec parse_device(const std::string& text, const std::string& flag) {
  DeviceSpec d;
  if (text == "cpu") return d;
  if (text == "sim") {
    d.kind = "sim";
    return d;
  }
  const std::string cuda = "cuda";
  if (text.compare(0, cuda.size(), cuda) == 0) {
    d.kind = cuda;
    if (text.size() == cuda.size()) return d;
    const std::string index = text.substr(cuda.size() + 1);
    bool digits = text[cuda.size()] == ':' && !index.empty() && index.size() <= 4;
    for (char ch : index) digits = digits && std::isdigit(static_cast<unsigned char>(ch));
    if (digits) {
      d.index = std::stoi(index);
      return d;
    }
  }
  throw ConfigError(flag + " '" + text + "': expected cpu, cuda, cuda:N (N: the GPU's index, e.g. cuda:0) or sim "
                    "(a simulated GPU: the GPU's protocol with the CPU's ops)");
}

std::vector<int> rank_device_map(const ComputeOptions& opt, int world_size, const std::string& comm) {
  const DeviceSpec d = parse_device(opt.device);
  if (d.is_cpu()) return {};
  if (!opt.rank_devices.empty()) {
    if (static_cast<int>(opt.rank_devices.size()) != world_size)
      throw ConfigError("--rank-devices gives " + std::to_string(opt.rank_devices.size()) + " GPUs for " +
                            std::to_string(world_size) + " ranks",
                        "give one GPU index per rank, e.g. --rank-devices 0,1 for --world-size 2");
    return opt.rank_devices;
  }
  std::vector<int> map(static_cast<size_t>(world_size), d.index);
  if (comm != "nccl") return map;
  const auto node = [&](int r) { return opt.rank_nodes.empty() ? 0 : opt.rank_nodes.at(static_cast<size_t>(r)); };
  for (int r = 0; r < world_size; ++r) {
    int local = 0;  // ranks before r on r's machine
    for (int q = 0; q < r; ++q) local += node(q) == node(r);
    map[static_cast<size_t>(r)] = d.index + local;
  }
  return map;
}

void check_one_rank_per_gpu(const std::vector<int>& map, const std::vector<int>& nodes) {
  const auto node = [&](size_t r) { return nodes.empty() ? 0 : nodes.at(r); };
  for (size_t a = 0; a < map.size(); ++a)
    for (size_t b = a + 1; b < map.size(); ++b)
      if (map[a] == map[b] && node(a) == node(b))
        throw ConfigError("--comm nccl: ranks " + std::to_string(a) + " and " + std::to_string(b) + " would both run on cuda:" +
                              std::to_string(map[a]) + (nodes.empty() ? "" : " of one machine") +
                              ", and NCCL refuses two ranks on one GPU",
                          "give each NCCL rank its own GPU (--rank-devices, --world-size at most the number of GPUs), "
                          "or use --comm threads: emulated ranks may share one GPU");
}

void validate_compute_options(const ComputeOptions& opt) {
  const DeviceSpec d = parse_device(opt.device);
  for (int g : opt.rank_devices)
    if (g < 0 || g > 9999) throw ConfigError("--rank-devices: GPU index " + std::to_string(g) + " is not a GPU index");
  if (!d.is_cuda() && !opt.rank_devices.empty())
    throw ConfigError("--rank-devices places ranks on GPUs: it has no effect with --device " + d.kind,
                      "add --device cuda");
  if (opt.cuda_graphs && d.is_cpu())
    throw ConfigError("--cuda-graphs captures the training step on a GPU: it has no effect with --device cpu",
                      "add --device cuda (or --device sim, which runs the same step call by call)");
  if (d.is_cuda()) return;
  const char* flag = opt.allow_tf32 ? "--allow-tf32"
                     : opt.cudnn_benchmark ? "--cudnn-benchmark"
                     : opt.cudnn_deterministic ? "--cudnn-deterministic"
                                               : nullptr;
  if (flag)
    throw ConfigError(std::string(flag) + " applies to GPU computation (cuBLAS, cuDNN): it has no effect with --device " + d.kind,
                      "add --device cuda, or leave the flag out");
}

}  // namespace lab
