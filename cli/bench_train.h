// dtlab bench train: training throughput in samples per second, measured the way
// shared/peers/torch_peer.py measures PyTorch (fixed random batch, SGD lr 0.01 momentum 0.9,
// 5 warm-up steps, rounds of about `seconds`, median step time; with several ranks, DDP over
// emulated ranks and the slowest rank's time). The last line printed is `samples_per_s <N>`.
#pragma once

#include <cstdio>
#include <string>

namespace lab {

struct BenchTrainOptions {
  std::string model = "cnn";
  long long batch_size = 64;
  int world_size = 1;
  int threads = 1;
  double seconds = 0.3;
  int rounds = 7;
  std::string json_out;  // also write the figures here as JSON
  std::FILE* out = nullptr;  // where the figures are printed (nullptr: stdout)
};

// Returns an exit code.
int bench_train(const BenchTrainOptions& opt);

// dtlab bench sgemm: the sgemm backend's GFLOP/s on square (size x size) float32 matrices with
// `threads` threads, the roofline that training throughput is compared with (tools/
// bench_train_vs_torch.sh). The last line printed is `gflops <N>`.
struct BenchSgemmOptions {
  int size = 1024;
  int threads = 1;
  double seconds = 0.3;
  int rounds = 5;
  std::string json_out;  // also write the figures here as JSON
  std::FILE* out = nullptr;  // where the figures are printed (nullptr: stdout)
};
int bench_sgemm(const BenchSgemmOptions& opt);

}  // namespace lab
