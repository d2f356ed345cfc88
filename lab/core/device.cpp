#include "device.h"

#include <cctype>

#include "errors.h"

namespace lab {

DeviceSpec parse_device(const std::string& text, const std::string& flag) {
  DeviceSpec d;
  if (text == "cpu") return d;
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
  throw ConfigError(flag + " '" + text + "': expected cpu, cuda or cuda:N (N: the GPU's index, e.g. cuda:0)");
}

void validate_compute_options(const ComputeOptions& opt) {
  const DeviceSpec d = parse_device(opt.device);
  if (!d.is_cpu()) return;
  const char* flag = opt.allow_tf32 ? "--allow-tf32"
                     : opt.cudnn_benchmark ? "--cudnn-benchmark"
                     : opt.cudnn_deterministic ? "--cudnn-deterministic"
                                               : nullptr;
  if (flag)
    throw ConfigError(std::string(flag) + " applies to GPU computation (cuBLAS, cuDNN): it has no effect with --device cpu",
                      "add --device cuda, or leave the flag out");
}

}  // namespace lab
