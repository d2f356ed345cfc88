#include "eval_command.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <thread>

#include <nlohmann/json.hpp>

#include "command_line.h"
#include "config.h"
#include "dataset.h"
#include "errors.h"
#include "executor.h"
#include "evaluate.h"
#include "events.h"
#include "gemm.h"
#include "gemm_bf16.h"
#include "model.h"
#include "parallel.h"
#include "run.h"
#include "safetensors.h"

namespace lab {

namespace {

// Replaces (by name) the tensors of `base` that `overlay` also has.
void overlay_tensors(std::vector<SafeTensor>& base, const std::vector<SafeTensor>& overlay) {
  for (const SafeTensor& o : overlay)
    for (SafeTensor& b : base)
      if (b.name == o.name) b = o;
}

bool exists(const std::string& path) {
  std::error_code ec;
  return std::filesystem::is_regular_file(path, ec);
}

}  // namespace

int eval_command(const EvalCommandOptions& opt) {
  std::FILE* out = opt.out ? opt.out : stdout;
  if (opt.bn_mode != "eval" && opt.bn_mode != "train")
    throw ConfigError("--bn-mode: unknown mode '" + opt.bn_mode + "'",
                      "eval: model.eval() (running statistics); train: model.train() (batch statistics)");
  if (opt.batch_size <= 0)
    throw ConfigError("batch_size should be a positive integer value, but got batch_size=" + std::to_string(opt.batch_size));
  if (opt.limit_test < -1) throw ConfigError("--limit-test must be >= 0 (0: every test sample)");
  if (opt.probe < 0) throw ConfigError("--probe must be >= 0");
  if (opt.threads < 0) throw ConfigError("--threads must be >= 0 (0: one per core)");
  if (opt.autocast != "none" && opt.autocast != "bf16")
    throw ConfigError("--autocast: unknown value '" + opt.autocast + "'",
                      "none: float32; bf16: torch.autocast(\"cpu\", dtype=torch.bfloat16), measured beside float32");
  const bool autocast = opt.autocast == "bf16";
  if (autocast && opt.bn_mode != "eval")
    throw ConfigError("--autocast bf16 needs --bn-mode eval (got --bn-mode " + opt.bn_mode + ")",
                      "autocast bf16 emulates inference with running statistics; PyTorch's bf16 batch-statistics "
                      "kernels are not emulated");
  validate_compute_options(opt.compute);
  const bool on_device = !parse_device(opt.compute.device).is_cpu();
  if (autocast && on_device)
    throw ConfigError("--autocast bf16 is the CPU's autocast: not with --device " + opt.compute.device,
                      "evaluate on the GPU in float32 (leave --autocast out), or autocast on --device cpu");
  if (opt.run_dir.empty() && opt.weights.empty())
    throw ConfigError("dtlab eval needs --run DIR or --weights FILE", "e.g. dtlab eval --run runs/quickstart");
  if (opt.run_dir.empty() && opt.rank != 0) throw ConfigError("--rank needs --run DIR (a run directory with every rank's files)");

  RunConfig cfg;  // the model's options (BatchNorm eps/momentum) and the data directory
  if (!opt.run_dir.empty()) {
    const std::string config = opt.run_dir + "/config.toml";
    if (!exists(config)) throw IoError("--run " + opt.run_dir + ": no config.toml there", "pass a directory written by dtlab run --out");
    cfg = config_from_toml_file(config);
    if (opt.rank < 0 || opt.rank >= cfg.world_size)
      throw ConfigError("--rank " + std::to_string(opt.rank) + ": the run has ranks 0.." + std::to_string(cfg.world_size - 1));
  } else {
    cfg.data_dir.clear();
  }
  if (!opt.model.empty()) cfg.model = opt.model;
  else if (opt.run_dir.empty()) throw ConfigError("--weights needs --model mlp|cnn (or use --run DIR)");
  if (!opt.data_dir.empty()) cfg.data_dir = opt.data_dir;
  if (cfg.data_dir.empty()) cfg.data_dir = kDefaultDataDir;
  const std::string weights = !opt.weights.empty() ? opt.weights : opt.run_dir + "/final.safetensors";

  std::vector<SafeTensor> tensors = read_safetensors(weights);
  std::vector<std::string> sources = {weights};
  if (opt.rank > 0) {
    // local SGD between averagings: the rank's own parameters; no broadcast_buffers: its buffers
    for (const std::string& f : {"final.rank" + std::to_string(opt.rank) + ".safetensors",
                                 "final.rank" + std::to_string(opt.rank) + ".buffers.safetensors"}) {
      const std::string path = opt.run_dir + "/" + f;
      if (!exists(path)) continue;
      overlay_tensors(tensors, read_safetensors(path));
      sources.push_back(path);
    }
  }
  std::unique_ptr<Model> model = build_model(model_options(cfg), 0);
  load_model_tensors(*model, tensors, weights);
  std::string device_echo;
  if (on_device) {  // the GPU's executor (executor.h), before the dataset: a missing GPU fails at once
    device_echo = " device=" + attach_executor(*model, opt.compute, 0, 1, "threads");
  }
  // The test samples: --limit-test when given; with --run, the run's own subset (what its summary
  // reports), else all of them.
  const int64_t limit_test = opt.limit_test >= 0 ? opt.limit_test : opt.run_dir.empty() ? 0 : cfg.limit_test;
  const Dataset test = load_fashion_mnist(cfg.data_dir, false, limit_test);
  const int threads = opt.threads > 0 ? opt.threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  set_compute_threads(threads);

  const std::string autocast_echo =
      autocast ? std::string(" autocast=bf16 (bf16 gemm: ") + gemm_bf16_kernel_name() + ")" : std::string();
  std::fprintf(out, "dtlab %s eval | model=%s bn_mode=%s (model.%s())%s batch_size=%lld test samples=%lld threads=%d sgemm=%s%s\n",
              kDtlabVersion, cfg.model.c_str(), opt.bn_mode.c_str(), opt.bn_mode.c_str(), autocast_echo.c_str(),
              static_cast<long long>(opt.batch_size), static_cast<long long>(test.size), threads, gemm_backend_name(),
              device_echo.c_str());
  for (const std::string& s : sources) std::fprintf(out, "  weights: %s\n", s.c_str());
  if (opt.limit_test < 0 && limit_test > 0)
    std::fprintf(out, "  test set: the run's first %lld test samples (its --limit-test; --limit-test 0 takes all)\n",
                 static_cast<long long>(test.size));
  else if (opt.limit_test < 0 && !opt.run_dir.empty())
    std::fprintf(out, "  test set: all %lld test samples, as the run used\n", static_cast<long long>(test.size));
  else if (!opt.run_dir.empty() && limit_test != cfg.limit_test)
    std::fprintf(out, "  test set: %s%lld test samples (--limit-test %lld); the run itself used %s, so its summary's "
                 "accuracy is over a different set\n",
                 limit_test > 0 ? "the first " : "all ", static_cast<long long>(test.size),
                 static_cast<long long>(limit_test),
                 cfg.limit_test > 0 ? ("the first " + std::to_string(cfg.limit_test)).c_str() : "all of them");
  std::fflush(out);

  std::vector<int> predictions;
  std::vector<float> probs;
  EvalOutputs outputs;
  outputs.predictions = &predictions;
  outputs.probe_probs = &probs;
  outputs.probe = opt.probe;
  const Mode mode = opt.bn_mode == "train" ? Mode::Train : Mode::Eval;
  EvalResult r;
  double secs = 0;
  // --autocast bf16: the float32 model beside it, in alternating rounds (best of each)
  std::vector<int> predictions32;
  std::vector<float> probs32;
  EvalResult r32;
  double secs32 = 0;
  if (!autocast) {
    const double t0 = now_seconds();
    r = evaluate(*model, mode, test, opt.batch_size, 0, test.size, outputs);
    secs = std::max(1e-9, now_seconds() - t0);
  } else {
    EvalOutputs outputs32 = outputs;
    outputs32.predictions = &predictions32;
    outputs32.probe_probs = &probs32;
    secs = secs32 = 1e300;
    for (int round = 0; round < kAutocastRounds; ++round) {
      model->set_autocast(Autocast::BF16);
      double t0 = now_seconds();
      r = evaluate(*model, mode, test, opt.batch_size, 0, test.size, outputs);
      secs = std::min(secs, std::max(1e-9, now_seconds() - t0));
      model->set_autocast(Autocast::None);
      t0 = now_seconds();
      r32 = evaluate(*model, mode, test, opt.batch_size, 0, test.size, outputs32);
      secs32 = std::min(secs32, std::max(1e-9, now_seconds() - t0));
    }
  }
  const double samples_per_s = static_cast<double>(r.samples) / secs;
  std::fprintf(out, "accuracy %.4f loss %.4f | %lld samples in %.3f s, %.0f samples/s%s\n", r.acc, r.loss,
              static_cast<long long>(r.samples), secs, samples_per_s,
              autocast ? (" (bf16 autocast, best of " + std::to_string(kAutocastRounds) + " rounds)").c_str() : "");
  // bf16 against fp32: top-1 agreement over every test sample, softmax differences over the probe
  int64_t same = 0;
  float probs_diff = 0;
  double agreement = 1, samples_per_s32 = 0, speedup = 0;
  if (autocast) {
    for (size_t i = 0; i < predictions.size(); ++i) same += predictions[i] == predictions32[i];
    for (size_t i = 0; i < probs.size(); ++i) probs_diff = std::max(probs_diff, std::fabs(probs[i] - probs32[i]));
    if (!predictions.empty()) agreement = static_cast<double>(same) / static_cast<double>(predictions.size());
    samples_per_s32 = static_cast<double>(r32.samples) / secs32;
    speedup = samples_per_s / samples_per_s32;
    std::fprintf(out, "fp32 reference: accuracy %.4f loss %.4f | %lld samples in %.3f s, %.0f samples/s (best of %d rounds)\n",
                r32.acc, r32.loss, static_cast<long long>(r32.samples), secs32, samples_per_s32, kAutocastRounds);
    std::fprintf(out, "bf16 vs fp32: top-1 agreement %.4f (%lld of %lld predictions differ), softmax max |diff| ",
                agreement, static_cast<long long>(predictions.size()) - static_cast<long long>(same),
                static_cast<long long>(predictions.size()));
    if (probs.empty()) std::fprintf(out, "n/a (--probe 0)");
    else std::fprintf(out, "%.3g over the first %zu samples", static_cast<double>(probs_diff), probs.size() / 10);
    std::fprintf(out, ", accuracy %+.4f\n", r.acc - r32.acc);
    std::fprintf(out, "speedup %.2fx (bf16 / fp32 samples per second, measured in this command)\n", speedup);
  }
  const int64_t probe = static_cast<int64_t>(probs.size() / 10);
  for (int64_t i = 0; i < probe; ++i) {
    const float* p = probs.data() + i * 10;
    const int64_t top = std::max_element(p, p + 10) - p;
    std::fprintf(out, "  test sample %lld (label %d): predicted %lld with p=%.6f\n", static_cast<long long>(i),
                test.labels[static_cast<size_t>(i)], static_cast<long long>(top), static_cast<double>(p[top]));
  }
  if (!opt.json_out.empty()) {
    nlohmann::json pj = nlohmann::json::array();
    std::vector<int> labels;
    for (int64_t i = 0; i < probe; ++i) {
      pj.push_back(std::vector<float>(probs.begin() + i * 10, probs.begin() + (i + 1) * 10));
      labels.push_back(test.labels[static_cast<size_t>(i)]);
    }
    nlohmann::json j = {{"command", "eval"},
                        {"producer", std::string("dtlab ") + kDtlabVersion},
                        {"weights", sources},
                        {"model", cfg.model},
                        {"bn_mode", opt.bn_mode},
                        {"autocast", opt.autocast},
                        {"device", on_device ? model->executor()->describe() : std::string("cpu")},
                        {"batch_size", opt.batch_size},
                        {"threads", threads},
                        {"samples", r.samples},
                        {"accuracy", r.acc},
                        {"loss", r.loss},
                        {"seconds", secs},
                        {"samples_per_s", samples_per_s},
                        {"probe", {{"samples", probe}, {"labels", labels}, {"probs", pj}}},
                        {"predictions", predictions},
                        {"what", "probe.probs[i]: softmax outputs of test sample i; predictions: every test sample's "
                                 "predicted class; bn_mode train: each test batch's own statistics (model.train())"}};
    if (autocast) {
      j["bf16_gemm"] = gemm_bf16_kernel_name();
      j["rounds"] = kAutocastRounds;
      j["fp32"] = {{"accuracy", r32.acc}, {"loss", r32.loss}, {"seconds", secs32}, {"samples_per_s", samples_per_s32}};
      j["agreement"] = agreement;
      j["probs_max_abs_diff"] = probs.empty() ? nlohmann::json(nullptr) : nlohmann::json(probs_diff);
      j["speedup"] = speedup;
      j["what"] = j["what"].get<std::string>() +
                  "; autocast bf16: accuracy, loss, seconds, samples_per_s, predictions and probe are the bf16 "
                  "model's (torch.autocast(\"cpu\", dtype=torch.bfloat16)), fp32 the same model without autocast; "
                  "seconds: the best of `rounds` rounds; agreement: share of test samples with the same predicted "
                  "class; probs_max_abs_diff: over the probe's softmax outputs; speedup: bf16 / fp32 samples_per_s";
    }
    write_result_json(opt.json_out, j);
  }
  return kExitOk;
}

}  // namespace lab
