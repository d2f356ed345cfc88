#include "simulate_step.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <map>
#include <set>

#include "collective_sim.h"
#include "errors.h"
#include "simulate.h"
#include "step_sim.h"
#include "topology.h"

namespace lab {

namespace {

struct Family {
  int pp = 1, tp = 1;
  int dp = 0;  // 0: N / (pp tp); else only the node counts where N = dp pp tp
};

std::string family_text(const Family& f) {
  return (f.dp > 0 ? std::to_string(f.dp) : std::string("dp")) + " x " + std::to_string(f.pp) + " x " +
         std::to_string(f.tp);
}

std::string mode_of(const Family& f, DpSync sync) {
  std::string m = f.pp > 1 ? "pipeline" : f.tp > 1 ? "tensor" : dp_sync_name(sync);
  if ((f.pp > 1 || f.tp > 1) && sync != DpSync::Ddp) m += std::string("+") + dp_sync_name(sync);
  return m;
}

}  // namespace

// The checks that need no file: each names its flag (a lesson's lint runs them, command_line.h).
void check_simulate_step_options(const SimulateOptions& o) {
  const SimulateStepFlags& f = o.step;
  if (f.gpu_tflops > 0 && !f.compute_from.empty())
    throw ConfigError("--gpu-tflops and --compute-from: give one (a stated throughput, or a run's measured compute)");
  if (f.gpu_tflops < 0) throw ConfigError("--gpu-tflops must be > 0 (achieved dense TFLOP/s per GPU)");
  if (f.gpu_tflops == 0 && f.compute_from.empty())
    throw ConfigError("--step needs the compute: --gpu-tflops T (achieved dense TFLOP/s per GPU, e.g. 400 for an "
                      "H100 at 40% of its bf16 peak) or --compute-from RUN_DIR (a dtlab run's measured compute)");
  const std::string model_name = f.model.empty() && f.params > 0 ? "generic" : f.model;
  if (model_name == "generic") {
    if (!f.compute_from.empty())
      throw ConfigError("--compute-from with --model generic: a run measures dtlab's mlp or cnn; give --gpu-tflops");
  } else {
    if (f.params > 0 || f.flops_per_sample > 0)
      throw ConfigError("--params and --flops-per-sample describe --model generic, not --model " +
                        (model_name.empty() ? std::string("cnn") : model_name));
    if (!model_name.empty()) step_model_dtlab(model_name);  // throws for a name that is none of dtlab's
  }
  parse_sim_protocol(o.protocol);
  if (o.algorithms != "all") parse_algorithm_list(o.algorithms);
  if (f.microbatches < 0) throw ConfigError("--microbatches must be >= 0 (0: 4 x --pp)");
  if (f.dp < 0 || f.pp < 0 || f.tp < 0) throw ConfigError("--dp, --pp and --tp must be >= 1 (0: the mode's)");
  const std::string& mode = f.mode;
  if (mode != "ddp" && mode != "zero" && mode != "fsdp" && mode != "pipeline" && mode != "tensor")
    throw ConfigError("--mode " + mode + ": one of ddp, zero, fsdp, pipeline, tensor (for --step)");
  if (!f.layouts.empty() && f.layouts != "all")
    throw ConfigError("--layouts " + f.layouts + ": all (every dp x pp x tp of each N), or leave it out and give --mode "
                      "with --dp/--pp/--tp");
  if (f.layouts.empty()) {
    if (mode == "pipeline" && f.pp < 2) throw ConfigError("--mode pipeline needs --pp P (P >= 2 stages)");
    if (mode == "tensor" && f.tp == 1) throw ConfigError("--mode tensor needs --tp T >= 2");
  }
}

int simulate_step(const SimulateOptions& o) {
  check_simulate_step_options(o);
  const SimulateStepFlags& f = o.step;
  std::FILE* out = o.out ? o.out : stdout;
  std::vector<int> nodes;
  const Topology base = simulate_topology(o, &nodes);

  // ---- compute ----
  StepConfig cfg;
  if (!f.compute_from.empty()) {
    cfg.compute = step_compute_from_run(f.compute_from);
  } else {
    cfg.compute.tflops = f.gpu_tflops;
    char buf[120];
    std::snprintf(buf, sizeof buf, "--gpu-tflops %g: every GPU computes %g TFLOP/s of the model's matrix products", f.gpu_tflops,
                  f.gpu_tflops);
    cfg.compute.source = buf;
  }

  // ---- the model ----
  std::string model_name = f.model;
  if (model_name.empty())
    model_name = !f.compute_from.empty() && !cfg.compute.run_model.empty() ? cfg.compute.run_model
                 : f.params > 0                                          ? "generic"
                                                                         : "cnn";
  StepModel model;
  if (model_name == "generic") {
    GenericModelSpec g;
    g.parameters = f.params;
    g.flops_per_sample = f.flops_per_sample;
    g.layers = f.layers;
    g.activation_bytes = f.activation_bytes;
    g.grad_bytes = f.grad_bytes;
    model = step_model_generic(g);
  } else {
    model = step_model_dtlab(model_name);
    if (!f.compute_from.empty() && !cfg.compute.run_model.empty() && cfg.compute.run_model != model_name)
      throw ConfigError("--model " + model_name + " with --compute-from " + f.compute_from + ": that run trained the " +
                        cfg.compute.run_model);
  }

  // ---- the configuration ----
  cfg.global_batch = f.global_batch;
  cfg.microbatches = f.microbatches;
  cfg.schedule = f.schedule;
  cfg.bucket_cap_mb = f.bucket_cap_mb;
  cfg.overlap = !f.no_overlap;
  cfg.broadcast_buffers = !f.no_broadcast_buffers;
  cfg.protocol = parse_sim_protocol(o.protocol);
  cfg.channels = o.channels;
  if (o.algorithms != "all") cfg.algorithms = parse_algorithm_list(o.algorithms);
  const std::string& mode = f.mode;
  cfg.sync = mode == "zero" ? DpSync::Zero : mode == "fsdp" ? DpSync::Fsdp : DpSync::Ddp;

  std::vector<Family> families;
  if (f.layouts == "all") {
    std::set<std::pair<int, int>> seen;
    for (int nn : nodes)
      for (const StepLayout& l : all_layouts(nn * base.gpus_per_node)) seen.insert({l.pp * l.tp, l.pp});
    for (const auto& [prod, pp] : seen) families.push_back({pp, prod / pp, 0});
  } else {
    Family fam;
    fam.pp = f.pp > 0 ? f.pp : 1;
    fam.tp = f.tp > 0 ? f.tp : (mode == "tensor" ? base.gpus_per_node : 1);
    fam.dp = f.dp;
    if (mode == "tensor" && fam.tp < 2) throw ConfigError("--mode tensor needs --tp T >= 2");
    families.push_back(fam);
  }

  // ---- header ----
  const auto t0 = std::chrono::steady_clock::now();
  std::string algos = "fastest of ";
  if (cfg.algorithms.empty()) algos += cfg.protocol == SimProtocol::Wire ? "ring (dtlab's)" : "ring, dbtree (NCCL's two)";
  else algos += o.algorithms;
  std::fprintf(out, "# dtlab simulate --step: %s, global batch %lld, protocol %s, collectives: %s per collective\n",
               model.describe.c_str(), static_cast<long long>(cfg.global_batch), sim_protocol_name(cfg.protocol),
               algos.c_str());
  std::fprintf(out, "# %.6g parameters (%.6g bytes of gradients), %.6g training FLOPs per sample\n",
               static_cast<double>(model.parameters()), static_cast<double>(model.parameters()) * model.grad_bytes,
               model.flops_per_sample());
  std::fprintf(out, "# compute: %s\n", cfg.compute.source.c_str());
  if (!f.compute_from.empty() && cfg.compute.run_world_size > 1)
    std::fprintf(out, "# (the run had %d ranks: its backward seconds include DDP's waits; a --world-size 1 run measures "
                      "compute alone)\n",
                 cfg.compute.run_world_size);
  if (!f.compute_from.empty())
    std::fprintf(out, "# (measured at %lld samples per rank per step; the simulated step scales it linearly with its own "
                      "batch)\n",
                 static_cast<long long>(cfg.compute.run_batch_per_rank));
  Topology widest = base;
  widest.nodes = *std::max_element(nodes.begin(), nodes.end());
  std::fprintf(out, "# topology at --nodes %d: %s\n", widest.nodes, topology_line(widest).c_str());
  std::fprintf(out, "# dp reduces with %s%s; pipeline: %s, %s micro-batches\n",
               cfg.sync == DpSync::Ddp    ? "DDP's buckets"
               : cfg.sync == DpSync::Zero ? "ZeRO-2 (bucketed reduce-scatter, all-gather after the step)"
                                          : "FSDP FULL_SHARD (a unit per layer, prefetch)",
               cfg.sync == DpSync::Fsdp ? "" : (" of " + std::to_string(static_cast<int>(cfg.bucket_cap_mb)) + " MiB, " +
                                                (cfg.overlap ? "overlapping backward" : "after backward")).c_str(),
               cfg.schedule.c_str(), f.microbatches > 0 ? std::to_string(f.microbatches).c_str() : "4 x pp");
  std::fprintf(out, "# ms per step on the busiest rank; dp, pp, tp: that axis' communication (hidden or not); exposed = "
                    "step - compute - bubble - optimizer\n");

  nlohmann::json jl = nlohmann::json::array();
  std::map<int, std::vector<std::string>> by_n;  // N where communication overtakes compute (0: never) -> layouts
  StepCache cache;
  int64_t simulated = 0;
  int largest = 0;
  for (int nn : nodes) largest = std::max(largest, nn * base.gpus_per_node);
  for (const Family& fam : families) {
    const std::string mode_text = mode_of(fam, cfg.sync);
    std::fprintf(out, "#\n# layout %s (%s)\n", family_text(fam).c_str(), mode_text.c_str());
    std::fprintf(out, "# %6s %6s %5s %9s %5s %11s %10s %9s %9s %9s %11s %9s %10s %12s %8s  %s\n", "nodes", "GPUs", "dp",
                 "batch/rep", "micro", "compute(ms)", "bubble(ms)", "dp(ms)", "pp(ms)", "tp(ms)", "exposed(ms)",
                 "optim(ms)", "step(ms)", "samples/s", "exp/comp", "dp collectives");
    nlohmann::json points = nlohmann::json::array();
    int overtakes = 0;
    int rows = 0;
    for (int nn : nodes) {
      Topology t = base;
      t.nodes = nn;
      const int n = t.ranks();
      if (n % (fam.pp * fam.tp) != 0) continue;
      StepLayout l{n / (fam.pp * fam.tp), fam.pp, fam.tp};
      if (fam.dp > 0 && l.dp != fam.dp) continue;
      ++rows;
      const StepResult r = simulate_step(t, model, cfg, l, &cache);
      ++simulated;
      nlohmann::json p = {{"nodes", nn}, {"ranks", n}, {"dp", l.dp}, {"refused", r.refused}};
      if (!r.refused.empty()) {
        std::fprintf(out, "  %6d %6d %5d  refused: %s\n", nn, n, l.dp, r.refused.c_str());
        points.push_back(p);
        continue;
      }
      const double ratio = r.compute_s > 0 ? r.exposed_s / r.compute_s : 0;
      if (!overtakes && r.comm_exceeds_compute()) overtakes = n;
      std::string dpc = r.dp.collectives ? std::to_string(r.dp.collectives) + " " + r.dp.algorithms : "-";
      if (r.broadcast_s > 0) {
        char b[64];
        std::snprintf(b, sizeof b, " (buffers' broadcast %.4f)", r.broadcast_s * 1e3);
        dpc += b;
      }
      std::fprintf(out, "  %6d %6d %5d %9lld %5d %11.4f %10.4f %9.4f %9.4f %9.4f %11.4f %9.4f %10.4f %12.1f %8.3f%s  %s%s%s\n",
                   nn, n, l.dp, static_cast<long long>(r.batch_per_replica), r.microbatches, r.compute_s * 1e3,
                   r.bubble_s * 1e3, r.dp.seconds * 1e3, r.pp.seconds * 1e3, r.tp.seconds * 1e3, r.exposed_s * 1e3,
                   r.optimizer_s * 1e3, r.step_s * 1e3, r.samples_per_s, ratio, r.comm_exceeds_compute() ? "*" : " ",
                   dpc.c_str(), r.notes.empty() ? "" : "; ", r.notes.empty() ? "" : r.notes[0].c_str());
      p.update({{"batch_per_replica", r.batch_per_replica},
                {"microbatches", r.microbatches},
                {"compute_ms", r.compute_s * 1e3},
                {"bubble_ms", r.bubble_s * 1e3},
                {"dp_ms", r.dp.seconds * 1e3},
                {"pp_ms", r.pp.seconds * 1e3},
                {"tp_ms", r.tp.seconds * 1e3},
                {"exposed_ms", r.exposed_s * 1e3},
                {"optimizer_ms", r.optimizer_s * 1e3},
                {"step_ms", r.step_s * 1e3},
                {"samples_per_s", r.samples_per_s},
                {"dp_bytes", r.dp.bytes},
                {"pp_bytes", r.pp.bytes},
                {"tp_bytes", r.tp.bytes},
                {"broadcast_ms", r.broadcast_s * 1e3},
                {"dp_algorithms", r.dp.algorithms},
                {"tp_algorithms", r.tp.algorithms},
                {"exposed_exceeds_compute", r.comm_exceeds_compute()},
                {"notes", r.notes}});
      points.push_back(p);
    }
    if (rows == 0) std::fprintf(out, "  (no node count of --nodes gives this layout)\n");
    jl.push_back({{"pp", fam.pp},
                  {"tp", fam.tp},
                  {"dp", fam.dp},
                  {"layout", family_text(fam)},
                  {"mode", mode_text},
                  {"points", points},
                  {"overtakes_at_ranks", overtakes ? nlohmann::json(overtakes) : nlohmann::json(nullptr)}});
    if (rows == 0) continue;
    by_n[overtakes].push_back(family_text(fam) + " " + mode_text);
  }
  // the last line: the layouts grouped by the N where communication overtakes compute
  std::string last;
  for (const auto& [n, names] : by_n) {
    if (n == 0) continue;
    std::string list;
    for (const auto& x : names) list += (list.empty() ? "" : ", ") + x;
    last += std::string(last.empty() ? "" : "; ") + "at N = " + std::to_string(n) + " (" +
            std::to_string(n / base.gpus_per_node) + " node" + (n / base.gpus_per_node == 1 ? "" : "s") + "): " + list;
  }
  if (by_n.count(0)) {
    std::string list;
    for (const auto& x : by_n.at(0)) list += (list.empty() ? "" : ", ") + x;
    last += std::string(last.empty() ? "" : "; ") + "not up to N = " + std::to_string(largest) + ": " + list;
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!o.json_out.empty()) {
    nlohmann::json comp = {{"source", cfg.compute.source}};
    if (cfg.compute.tflops > 0) comp["tflops"] = cfg.compute.tflops;
    else
      comp.update({{"forward_s_per_sample", cfg.compute.fwd_s_per_sample},
                   {"backward_s_per_sample", cfg.compute.bwd_s_per_sample},
                   {"optimizer_s_per_step", cfg.compute.optimizer_s_per_step},
                   {"run_model", cfg.compute.run_model},
                   {"run_device", cfg.compute.run_device},
                   {"run_world_size", cfg.compute.run_world_size}});
    nlohmann::json j = {{"command", "simulate --step"},
                        {"topology", topology_toml(base)},
                        {"model",
                         {{"name", model.name},
                          {"describe", model.describe},
                          {"parameters", model.parameters()},
                          {"flops_per_sample", model.flops_per_sample()},
                          {"grad_bytes", model.grad_bytes}}},
                        {"compute", comp},
                        {"config",
                         {{"global_batch", cfg.global_batch},
                          {"sync", dp_sync_name(cfg.sync)},
                          {"protocol", sim_protocol_name(cfg.protocol)},
                          {"algorithms", o.algorithms},
                          {"channels", cfg.channels},
                          {"bucket_cap_mb", cfg.bucket_cap_mb},
                          {"overlap", cfg.overlap},
                          {"broadcast_buffers", cfg.broadcast_buffers},
                          {"schedule", cfg.schedule},
                          {"microbatches", cfg.microbatches}}},
                        {"layouts", jl}};
    std::ofstream jf(o.json_out);
    if (!jf) throw IoError("--json " + o.json_out + ": cannot write the file");
    jf << j.dump(1) << "\n";
    if (!jf) throw IoError("--json " + o.json_out + ": cannot write the file");
  }
  std::fprintf(out, "# simulated %lld steps in %.2f s; * marks exposed communication > compute\n",
               static_cast<long long>(simulated), secs);
  std::fprintf(out, "communication overtakes compute (exposed > compute): %s\n", last.empty() ? "no layout ran" : last.c_str());
  return kExitOk;
}

}  // namespace lab
