#include "bench_train.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "command_line.h"
#include "communicator.h"
#include "config.h"
#include "ddp.h"
#include "errors.h"
#include "events.h"
#include "gemm.h"
#include "model.h"
#include "optim.h"
#include "parallel.h"
#include "threads/transport_threads.h"
#include "torch_rng.h"

namespace lab {

namespace {

struct RankBench {
  std::unique_ptr<Model> model;
  double step_seconds = 0;
  std::string error;
};

}  // namespace

int bench_train(const BenchTrainOptions& opt) {
  std::FILE* out = opt.out ? opt.out : stdout;
  if (opt.batch_size <= 0)
    throw ConfigError("batch_size should be a positive integer value, but got batch_size=" + std::to_string(opt.batch_size));
  if (opt.world_size < 1 || opt.world_size > kMaxWorldSize)
    throw ConfigError("--world-size must be in 1.." + std::to_string(kMaxWorldSize));
  if (opt.threads < 1) throw ConfigError("--threads must be at least 1");
  if (opt.rounds < 1 || !(opt.seconds > 0)) throw ConfigError("--rounds and --seconds must be positive");
  const int world = opt.world_size;
  set_compute_threads(world == 1 ? opt.threads : 1);
  std::fprintf(out, "# dtlab %s bench train model=%s batch_size=%lld world_size=%d threads=%d sgemm=%s\n", kDtlabVersion,
              opt.model.c_str(), opt.batch_size, world, world == 1 ? opt.threads : 1, gemm_backend_name());
  std::fflush(out);

  ModelOptions mopt;
  mopt.name = opt.model;
  std::vector<RankBench> ranks(static_cast<size_t>(world));
  for (auto& r : ranks) r.model = build_model(mopt, 0);
  const int64_t flops = ranks[0].model->train_flops_per_sample({1, 28, 28});
  ThreadsWorld tw(world);
  std::vector<EventLog> logs(static_cast<size_t>(world));
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world; ++rank) {
    threads.emplace_back([&, rank] {
      RankBench& rb = ranks[static_cast<size_t>(rank)];
      try {
        Model& model = *rb.model;
        Communicator comm(tw.transport(rank), nullptr);
        broadcast_state(model, comm);
        DdpReducer reducer(model, comm, 25.0);
        SgdOptions so;
        so.lr = 0.01;
        so.momentum = 0.9;
        Sgd sgd(model.params(), so);
        // A fixed batch per rank, different on every rank (torch_peer seeds each rank by its rank).
        TorchGenerator g(static_cast<uint64_t>(rank));
        Tensor x({opt.batch_size, 1, 28, 28});
        g.uniform_(x.ptr(), x.numel(), -1.0, 1.0);
        std::vector<int> y(static_cast<size_t>(opt.batch_size));
        for (int& v : y) v = static_cast<int>(g.random() % 10);
        Tensor dlogits;
        auto step = [&] {
          model.zero_grad();
          const Tensor& logits = model.forward(x, Mode::Train);
          cross_entropy(logits, y, &dlogits, nullptr);
          reducer.prepare_for_backward();
          model.backward(dlogits, [&](int i) {
            if (world > 1) reducer.mark_param_ready(i);
          });
          if (world > 1) reducer.finalize_backward();
          sgd.step();
        };
        for (int i = 0; i < 5; ++i) step();
        double t0 = now_seconds();
        step();
        float m = static_cast<float>(std::max(1.0, opt.seconds / std::max(now_seconds() - t0, 1e-6)));
        // Every rank must run the same number of steps: use rank 0's count.
        comm.broadcast(&m, sizeof m, 0, CollectiveInfo{"bench steps", -1});
        const int steps = static_cast<int>(m);
        std::vector<double> ts;
        for (int round = 0; round < opt.rounds; ++round) {
          t0 = now_seconds();
          for (int i = 0; i < steps; ++i) step();
          ts.push_back((now_seconds() - t0) / steps);
        }
        std::sort(ts.begin(), ts.end());
        rb.step_seconds = ts[ts.size() / 2];
      } catch (const std::exception& e) {
        rb.error = e.what();
        tw.transport(rank).abort(rb.error);
      }
    });
  }
  for (auto& t : threads) t.join();
  double slowest = 0;
  for (const auto& r : ranks) {
    if (!r.error.empty()) throw Error("bench train failed: " + r.error);
    slowest = std::max(slowest, r.step_seconds);
  }
  const double sps = static_cast<double>(opt.batch_size) * world / slowest;
  std::fprintf(out, "train_flops_per_sample %lld\n", static_cast<long long>(flops));
  std::fprintf(out, "gflops %.1f\n", sps * static_cast<double>(flops) / 1e9);
  std::fprintf(out, "step_ms %.3f\n", slowest * 1e3);
  std::fprintf(out, "samples_per_s %.1f\n", sps);
  if (!opt.json_out.empty())
    write_result_json(opt.json_out, {{"command", "bench train"},
                                     {"producer", std::string("dtlab ") + kDtlabVersion},
                                     {"model", opt.model},
                                     {"batch_size", opt.batch_size},
                                     {"world_size", world},
                                     {"threads", world == 1 ? opt.threads : 1},
                                     {"sgemm", gemm_backend_name()},
                                     {"train_flops_per_sample", flops},
                                     {"gflops", sps * static_cast<double>(flops) / 1e9},
                                     {"step_ms", slowest * 1e3},
                                     {"samples_per_s", sps}});
  return kExitOk;
}

int bench_sgemm(const BenchSgemmOptions& opt) {
  std::FILE* out = opt.out ? opt.out : stdout;
  if (opt.size < 1 || opt.size > 8192) throw ConfigError("--size must be in 1..8192");
  if (opt.threads < 1) throw ConfigError("--threads must be at least 1");
  if (opt.rounds < 1 || !(opt.seconds > 0)) throw ConfigError("--rounds and --seconds must be positive");
  gemm_set_threads(opt.threads);
  const int n = opt.size;
  std::fprintf(out, "# dtlab %s bench sgemm size=%d threads=%d sgemm=%s (C = A B^T, row-major, float32)\n", kDtlabVersion,
              n, opt.threads, gemm_backend_name());
  std::fflush(out);
  Tensor a({n, n}, 0.5f), b({n, n}, 0.25f), c({n, n});
  auto call = [&] { sgemm(false, true, n, n, n, 1.0f, a.ptr(), n, b.ptr(), n, 0.0f, c.ptr(), n); };
  for (int i = 0; i < 3; ++i) call();
  double t0 = now_seconds();
  call();
  const int calls = static_cast<int>(std::max(1.0, opt.seconds / std::max(now_seconds() - t0, 1e-6)));
  std::vector<double> ts;
  for (int round = 0; round < opt.rounds; ++round) {
    t0 = now_seconds();
    for (int i = 0; i < calls; ++i) call();
    ts.push_back((now_seconds() - t0) / calls);
  }
  std::sort(ts.begin(), ts.end());
  const double gflops = 2.0 * n * n * n / ts[ts.size() / 2] / 1e9;
  std::fprintf(out, "gflops %.1f\n", gflops);
  if (!opt.json_out.empty())
    write_result_json(opt.json_out, {{"command", "bench sgemm"},
                                     {"producer", std::string("dtlab ") + kDtlabVersion},
                                     {"size", n},
                                     {"threads", opt.threads},
                                     {"sgemm", gemm_backend_name()},
                                     {"gflops", gflops}});
  return kExitOk;
}

}  // namespace lab
