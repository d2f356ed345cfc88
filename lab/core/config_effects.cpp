// The rules of config_effects.h. Sections: helpers | no_effect_reason (whatever the value) |
// --nondeterministic | ineffective_settings (every non-default setting, with its value) | refusal.
#include "config_effects.h"

#include <algorithm>
#include <cstdio>

#include "errors.h"
#include "mode.h"

namespace lab {

namespace {

// ---- helpers ----

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

std::string ranks(int n) { return std::to_string(n) + (n == 1 ? " rank" : " ranks"); }

bool one_rank(const RunConfig& c) { return c.world_size == 1; }

// The modes that own a setting (mode.h: Mode::settings), none for a setting every mode has.
std::vector<const ParallelMode*> owners_of(const std::string& setting) {
  std::vector<const ParallelMode*> out;
  for (const ParallelMode* m : modes())
    for (const ModeSetting& ms : m->settings())
      if (ms.field == setting && ms.exclusive) out.push_back(m);
  return out;
}

}  // namespace

std::string IneffectiveSetting::message() const {
  return flag + (maybe ? " may have no effect: " : " has no effect: ") + reason;
}

// ---- no_effect_reason: whatever the setting's value ----

std::string no_effect_reason(const RunConfig& c, const std::string& setting) {
  const ParallelMode& mode = mode_of(c);
  const ModeCaps caps = mode.caps();
  // A setting of another mode; then what the mode itself says (its own words for what it lacks).
  const std::vector<const ParallelMode*> owners = owners_of(setting);
  if (!owners.empty() && std::find(owners.begin(), owners.end(), &mode) == owners.end()) {
    std::string names, what;
    for (size_t i = 0; i < owners.size(); ++i) {
      names += (i ? (i + 1 == owners.size() ? " and " : ", ") : "") + std::string(owners[i]->name());
      for (const ModeSetting& ms : owners[i]->settings())
        if (ms.field == setting && what.empty()) what = ms.pytorch;
    }
    return "a setting of --mode " + names + (what.empty() ? "" : " (" + what + ")") + "; --mode is " + c.mode;
  }
  if (std::string why = mode.no_effect_reason(c, setting); !why.empty()) return why;
  // By capability (mode.h: ModeCaps), for modes that have no words of their own for it.
  if ((setting == "overlap" || setting == "bucket_cap_mb") && !caps.gradient_allreduce)
    return "--mode " + c.mode + " has no gradient allreduce (DDP's buckets)";
  if (setting == "broadcast_buffers" && !caps.buffer_broadcast)
    return "--mode " + c.mode + " does not broadcast buffers (DDP's broadcast_buffers)";
  if (setting == "momentum" || setting == "nesterov") {
    if (c.optimizer != "sgd")
      return "--optimizer " + c.optimizer + " has no momentum buffer (its first moment decays with beta1, --betas)";
  } else if (setting == "adam_betas" || setting == "adam_eps") {
    if (c.optimizer == "sgd") return "--optimizer is sgd (they are Adam's and AdamW's)";
  } else if (setting == "lr_t_max" || setting == "lr_min") {
    if (c.lr_schedule != "cosine") return "--lr-schedule is " + c.lr_schedule + " (it applies to cosine)";
  } else if (setting == "lr_step_size" || setting == "lr_gamma") {
    if (c.lr_schedule != "step") return "--lr-schedule is " + c.lr_schedule + " (it applies to step)";
  } else if (setting == "link_latency_us" || setting == "link_gbps") {
    // a parameter server: the worker and the server talk over the link even with one worker
    if (one_rank(c) && !caps.parameter_server)
      return "with one rank there are no messages between ranks for the simulated link to carry";
  } else if (setting == "link_gpus_per_node" || setting == "link_nic_gbps" || setting == "link_nic_latency_us" ||
             setting == "link_nics_per_node") {
    // (validate() refuses them without --link-gbps or without --link-gpus-per-node)
    if (one_rank(c)) return "with one rank there are no messages between ranks for the simulated link to carry";
    if (c.link_gpus_per_node >= c.world_size)
      return "all " + ranks(c.world_size) + " are on one node (--link-gpus-per-node " +
             std::to_string(c.link_gpus_per_node) + "): no message leaves it through a NIC";
  } else if (setting == "link_nodes_per_leaf" || setting == "link_oversubscription") {
    // (validate() refuses them without --link-gpus-per-node, --link-oversubscription without
    // --link-nodes-per-leaf)
    if (one_rank(c)) return "with one rank there are no messages between ranks for the simulated link to carry";
    if (c.link_gpus_per_node >= c.world_size)
      return "all " + ranks(c.world_size) + " are on one node (--link-gpus-per-node " +
             std::to_string(c.link_gpus_per_node) + "): no message leaves it for a leaf switch";
    const int nodes = c.link_gpus_per_node > 0 ? c.world_size / c.link_gpus_per_node : 1;
    if (c.link_nodes_per_leaf >= nodes)
      return "all " + std::to_string(nodes) + " nodes are on one leaf (--link-nodes-per-leaf " +
             std::to_string(c.link_nodes_per_leaf) + "): no message crosses a leaf's uplink";
    // an uplink not oversubscribed carries all its leaf's NICs at once: no message waits for it
    // (link_model.h: Leaves; the timetable is the one without leaves, bit for bit)
    if (setting == "link_nodes_per_leaf" && c.link_oversubscription == 1)
      return "--link-oversubscription is 1: each leaf's uplink carries all its NICs' bandwidth, so no message "
             "waits for one";
  } else if (setting == "eval_samples") {
    if (c.eval_every == 0) return "--eval-every is 0 (off): it sets the samples of the periodic evaluation";
  } else if (setting == "fail_step" || setting == "fail_at") {
    if (c.fail_rank < 0) return "no rank is told to fail: --fail-rank is not given";
  } else if (setting == "overlap" || setting == "bucket_cap_mb") {
    if (one_rank(c)) return "with one rank there is no allreduce";
  } else if (setting == "allreduce") {
    if (one_rank(c)) return "with one rank there is nothing to sum";
  } else if (setting == "broadcast_buffers") {
    if (one_rank(c)) return "with one rank there is nobody to broadcast to";
    if (!c.track_running_stats)
      return "BatchNorm keeps no running statistics (--no-track-running-stats): there are no buffers to broadcast";
  } else if (setting == "bn") {
    if (one_rank(c)) return "with one rank the global batch is the only rank's batch";
  } else if (setting == "bn_momentum") {
    if (!c.track_running_stats)
      return "BatchNorm keeps no running statistics (--no-track-running-stats) for the momentum to update";
  } else if (setting == "threads") {
    // Run::start: a world of several ranks gives every rank one compute thread
    if (!one_rank(c))
      return "each of the " + ranks(c.world_size) + " computes on one thread of its own (--threads sizes the compute "
             "threads of a single rank)";
  } else if (setting == "trace_steps" || setting == "record_bn" || setting == "record_memory") {
    if (c.out_dir.empty() && c.resume.empty()) return "there is no run directory to write it into: give --out DIR";
  } else if (setting == "sampler_drop_last") {
    if (one_rank(c) && caps.distributed_sampler)
      return "with one rank the DistributedSampler's only shard is the whole dataset, with nothing to pad or cut";
  } else if (setting == "uneven_data") {
    if (one_rank(c)) return "with one rank nothing is dropped: rank r drops r batches, and rank 0 drops none";
  } else if (setting == "join") {
    if (one_rank(c)) return "with one rank no rank runs out of data while another trains";
  }
  return "";
}

// ---- --nondeterministic ----

int64_t largest_local_batch(const RunConfig& c) {
  // the training samples: --limit-train, or a dataset far larger than any batch
  const int64_t samples = c.limit_train > 0 ? c.limit_train : INT64_MAX / 2;
  const int64_t w = std::max(1, c.world_size);
  if (mode_of(c).caps().global_batch) {
    // one DataLoader of global batches, each chunked over the devices (torch.chunk: ceil(B / W) first)
    const int64_t global = std::min<int64_t>(c.batch_size, samples);
    return (global + w - 1) / w;
  }
  // DistributedSampler: ceil(samples / world) per rank (padded), floor with its drop_last
  const int64_t per_rank = c.sampler_drop_last ? samples / w : (samples + w - 1) / w;
  return std::min<int64_t>(c.batch_size, std::max<int64_t>(per_rank, 1));
}

std::vector<IneffectiveSetting> nondeterministic_no_effect(const RunConfig& c) {
  if (!c.nondeterministic || c.model != "mlp") return {};  // the cnn's sums also run over the image's positions
  const int64_t b = largest_local_batch(c);
  if (b >= 3) return {};
  const bool global = mode_of(c).caps().global_batch;
  const std::string who = mode_of(c).member();
  const std::string why =
      "every gradient sum of the mlp (Linear's weights and biases, BatchNorm1d's sums) adds the samples of one " + who +
      ", at most " + std::to_string(b) + " here" +
      (global ? " (--mode " + c.mode + " chunks the global batch of " + std::to_string(c.batch_size) + " over " +
                            std::to_string(c.world_size) + " devices)"
                      : "") +
      ", and a + b == b + a in floating point";
  const std::string hint =
      "three contributions are the fewest whose order of addition can change a sum: use " +
      std::string(global ? "a global --batch-size of at least " + std::to_string(2 * c.world_size + 1)
                                 : "--batch-size 3 or more") +
      ", or --model cnn (its sums also run over the image's positions)";
  IneffectiveSetting e{"nondeterministic", "--nondeterministic", "", hint, true, false};
  const bool naive_gather = mode_of(c).caps().gradient_allreduce && c.allreduce == "naive" && c.world_size >= 3;
  if (naive_gather) {
    e.refused = false;
    e.maybe = true;
    e.reason = why + "; only the naive allreduce's gather adds the " + ranks(c.world_size) +
               "' buffers on rank 0 in arrival order, which timing alone decides: two runs may be bitwise equal";
  } else {
    e.reason = why + ": two runs would be bitwise equal";
  }
  return {e};
}

std::string describe_nondeterministic(const RunConfig& c) {
  std::string s = "the gradient sums over the batch (" +
                  std::string(c.model == "cnn" ? "Conv2d's weights, BatchNorm2d's sums, Linear's weights and biases"
                                               : "Linear's weights and biases, BatchNorm1d's sums") +
                  ") add their partial sums in an order drawn per call, as a GPU's thread blocks finish";
  if (c.model == "cnn" && one_rank(c) && c.threads != 1)
    s += "; with several compute threads Conv2d adds each sample's weight gradient atomically, as the threads finish";
  if (mode_of(c).caps().gradient_allreduce && c.allreduce == "naive" && c.world_size >= 3)
    s += "; the naive allreduce adds the ranks' buffers on rank 0 in arrival order";
  return s;
}

// ---- ineffective_settings ----

std::vector<IneffectiveSetting> ineffective_settings(const RunConfig& c, const RunConfig& d) {
  std::vector<IneffectiveSetting> out;
  // a setting whose value differs from the default: reported when it has no effect in c
  auto check = [&](const char* setting, bool changed, const std::string& flag, bool refused = false,
                   const std::string& hint = "") {
    if (!changed) return;
    const std::string why = no_effect_reason(c, setting);
    if (!why.empty()) out.push_back({setting, flag, why, hint, refused, false});
  };
  // SGD's momentum asked of Adam is refused: the user expects a momentum that Adam does not have
  const std::string adam_hint = "drop it, or choose --optimizer sgd";
  check("momentum", c.momentum != d.momentum, "--momentum " + num(c.momentum), true, adam_hint);
  check("nesterov", c.nesterov != d.nesterov, "--nesterov", true, adam_hint);
  check("adam_betas", c.adam_beta1 != d.adam_beta1 || c.adam_beta2 != d.adam_beta2,
        "--betas " + num(c.adam_beta1) + "," + num(c.adam_beta2));
  check("adam_eps", c.adam_eps != d.adam_eps, "--eps " + num(c.adam_eps));
  check("lr_t_max", c.lr_t_max != d.lr_t_max, "--lr-t-max " + std::to_string(c.lr_t_max));
  check("lr_min", c.lr_min != d.lr_min, "--lr-min " + num(c.lr_min));
  check("lr_step_size", c.lr_step_size != d.lr_step_size, "--lr-step-size " + std::to_string(c.lr_step_size));
  check("lr_gamma", c.lr_gamma != d.lr_gamma, "--lr-gamma " + num(c.lr_gamma));
  check("average_every", c.average_every != d.average_every, "--average-every " + std::to_string(c.average_every));
  check("warmup_steps", c.warmup_steps != d.warmup_steps, "--warmup-steps " + std::to_string(c.warmup_steps));
  check("parameters_as_bucket_view", c.parameters_as_bucket_view != d.parameters_as_bucket_view,
        "--parameters-as-bucket-view");
  check("sharding_strategy", c.sharding_strategy != d.sharding_strategy, "--sharding-strategy " + c.sharding_strategy);
  check("fsdp_wrap", c.fsdp_wrap != d.fsdp_wrap, "--fsdp-wrap " + c.fsdp_wrap);
  check("stages", c.stages != d.stages, "--stages " + std::to_string(c.stages));
  check("microbatches", c.microbatches != d.microbatches, "--microbatches " + std::to_string(c.microbatches));
  check("schedule", c.schedule != d.schedule, "--schedule " + c.schedule);
  check("balance", c.balance != d.balance, "--balance " + c.balance);
  check("deferred_batch_norm", c.deferred_batch_norm != d.deferred_batch_norm, "--deferred-batch-norm");
  check("dp", c.dp != d.dp, "--dp " + std::to_string(c.dp));
  check("tp", c.tp != d.tp, "--tp " + std::to_string(c.tp));
  check("async_schedule", c.async_schedule != d.async_schedule, "--async-schedule " + c.async_schedule);
  check("async_seed", c.async_seed != d.async_seed, "--async-seed " + std::to_string(c.async_seed));
  check("link_latency_us", c.link_latency_us != d.link_latency_us, "--link-latency-us " + num(c.link_latency_us));
  check("link_gbps", c.link_gbps != d.link_gbps, "--link-gbps " + num(c.link_gbps));
  check("link_gpus_per_node", c.link_gpus_per_node != d.link_gpus_per_node,
        "--link-gpus-per-node " + std::to_string(c.link_gpus_per_node));
  check("link_nic_gbps", c.link_nic_gbps != d.link_nic_gbps, "--link-nic-gbps " + num(c.link_nic_gbps));
  check("link_nic_latency_us", c.link_nic_latency_us != d.link_nic_latency_us,
        "--link-nic-latency-us " + num(c.link_nic_latency_us));
  check("link_nics_per_node", c.link_nics_per_node != d.link_nics_per_node,
        "--link-nics-per-node " + std::to_string(c.link_nics_per_node));
  const bool several_leaves = c.link_gpus_per_node > 0 && c.link_nodes_per_leaf > 0 &&
                              c.world_size / c.link_gpus_per_node > c.link_nodes_per_leaf;
  check("link_nodes_per_leaf", c.link_nodes_per_leaf != d.link_nodes_per_leaf,
        "--link-nodes-per-leaf " + std::to_string(c.link_nodes_per_leaf), false,
        several_leaves && c.link_oversubscription == 1
            ? "add --link-oversubscription X > 1: uplinks narrower than the NICs under them"
            : "");
  check("link_oversubscription", c.link_oversubscription != d.link_oversubscription,
        "--link-oversubscription " + num(c.link_oversubscription));
  check("eval_samples", c.eval_samples != d.eval_samples, "--eval-samples " + std::to_string(c.eval_samples));
  // Failure injection is asked for to see a failure: a run that trains normally instead is refused.
  const std::string fail_hint = "give --fail-rank R, the rank that fails";
  check("fail_step", c.fail_step != d.fail_step, "--fail-step " + std::to_string(c.fail_step), true, fail_hint);
  check("fail_at", c.fail_at != d.fail_at, "--fail-at " + c.fail_at, true, fail_hint);
  check("overlap", c.overlap != d.overlap, c.overlap ? "--overlap" : "--no-overlap");
  check("allreduce", c.allreduce != d.allreduce, "--allreduce " + c.allreduce);
  check("bucket_cap_mb", c.bucket_cap_mb != d.bucket_cap_mb, "--bucket-cap-mb " + num(c.bucket_cap_mb));
  check("broadcast_buffers", c.broadcast_buffers != d.broadcast_buffers,
        c.broadcast_buffers ? "--broadcast-buffers" : "--no-broadcast-buffers");
  check("bn", c.bn != d.bn, "--bn " + c.bn);
  check("bn_momentum", c.bn_momentum != d.bn_momentum, "--bn-momentum " + bn_momentum_str(c.bn_momentum));
  // --threads 1 with several ranks asks for what every rank gets anyway: nothing to point out
  check("threads", c.threads != d.threads && c.threads != 1, "--threads " + std::to_string(c.threads));
  check("trace_steps", c.trace_steps != d.trace_steps, "--trace-steps " + std::to_string(c.trace_steps));
  check("record_bn", c.record_bn != d.record_bn, "--record-bn " + c.record_bn);
  check("record_memory", c.record_memory != d.record_memory, "--record-memory");
  check("sampler_drop_last", c.sampler_drop_last != d.sampler_drop_last, "--sampler-drop-last");
  check("uneven_data", c.uneven_data != d.uneven_data, "--uneven-data");
  check("join", c.join != d.join, "--join");
  // Value-dependent: the failure injection that can never fire.
  if (c.fail_rank >= 0) {
    const int64_t at = c.fail_step < 0 ? 0 : c.fail_step;
    std::string why;
    if (c.steps > 0 && at >= c.steps)
      why = "--steps " + std::to_string(c.steps) + " ends the run before iteration " + std::to_string(at);
    else if (c.fail_at == "allreduce" && one_rank(c) && mode_of(c).caps().fail_at_allreduce)
      why = "with one rank there is no gradient allreduce";
    else if (std::string w = mode_of(c).no_effect_reason(c, "fail_at"); !w.empty())
      why = w;
    else if (c.fail_at == "allreduce" && c.no_sync_steps > 0 && at % (c.no_sync_steps + 1) != c.no_sync_steps)
      why = "iteration " + std::to_string(at) + " runs under no_sync (--no-sync-steps " +
            std::to_string(c.no_sync_steps) + "): it allreduces nothing";
    if (!why.empty())
      out.push_back({"fail_at", "--fail-rank " + std::to_string(c.fail_rank) + " --fail-step " + std::to_string(at) +
                                    " --fail-at " + c.fail_at,
                     why, "choose an iteration or a point where the rank can fail", true, false});
  }
  for (IneffectiveSetting& e : nondeterministic_no_effect(c)) out.push_back(std::move(e));
  return out;
}

// ---- refusal ----

void refuse_ineffective_settings(const RunConfig& c) {
  for (const IneffectiveSetting& e : ineffective_settings(c))
    if (e.refused) throw ConfigError(e.message(), e.hint);
}

}  // namespace lab
