// Which settings of a RunConfig take effect in a configuration: the one set of rules behind
// validate()'s refusals of settings that could do nothing, the CLI's warnings (dtlab run, dtlab
// gui's starting flags), `dtlab lesson check`, and the lab window's greyed-out controls and notes
// (viz/data/settings_check.h). Plain logic over RunConfig, unit-tested (test_config_effects.cpp).
//
// Two kinds of answer:
//   refused  the user clearly expects an effect that cannot happen (--nondeterministic where every
//            reduction it reorders has at most two contributions, --fail-step without --fail-rank):
//            validate() throws ConfigError naming the flag, the reason and what would make it work
//   warned   a setting changed from RunConfig's default that this configuration ignores (--lr-t-max
//            outside cosine, --threads with several ranks, ...): the run goes on, and says so
//
// A setting equal to its default is not something the user asked for: only settings whose value
// differs from the defaults are reported.
#pragma once

#include <string>
#include <vector>

#include "config.h"

namespace lab {

// A setting that has no effect in a configuration.
struct IneffectiveSetting {
  std::string setting;  // RunConfig's name: "lr_t_max", "broadcast_buffers", "nondeterministic"
  std::string flag;     // as on the command line, with its value: "--lr-t-max 5", "--no-overlap", "--bn sync"
  std::string reason;   // "--lr-schedule is constant (it applies to cosine)"
  std::string hint;     // what would make it take effect ("" when there is nothing to add)
  bool refused = false; // validate() refuses the configuration (exit 2)
  bool maybe = false;   // it may take effect, as timing decides: "may have no effect"
  // "--lr-t-max 5 has no effect: --lr-schedule is constant (it applies to cosine)"
  std::string message() const;
};

// Why `setting` (RunConfig's name) has no effect in configuration c whatever its value; "" when it
// may have one. Settings: momentum, nesterov, adam_betas, adam_eps, lr_t_max, lr_min, lr_step_size, lr_gamma, average_every,
// warmup_steps, parameters_as_bucket_view, sharding_strategy, fsdp_wrap, async_schedule, async_seed, link_latency_us, link_gbps,
// link_gpus_per_node, link_nic_gbps, link_nic_latency_us, link_nics_per_node, link_nodes_per_leaf,
// link_oversubscription, eval_samples, fail_step,
// fail_at, no_sync_steps, overlap, allreduce, bucket_cap_mb, broadcast_buffers, bn, bn_momentum, threads,
// trace_steps, record_bn, record_memory, sampler_drop_last, uneven_data, join (any other name: "").
std::string no_effect_reason(const RunConfig& c, const std::string& setting);

// Every setting of c whose value differs from `defaults` and that has no effect in c, in the order
// of the list above (momentum and nesterov under Adam are refused), then --nondeterministic (nondeterministic_no_effect). `defaults`: what the
// front end starts from (RunConfig's own for dtlab run and lessons).
std::vector<IneffectiveSetting> ineffective_settings(const RunConfig& c, const RunConfig& defaults = RunConfig{});

// Throws ConfigError for the first refused entry of ineffective_settings(c) (validate() calls it).
void refuse_ineffective_settings(const RunConfig& c);

// --nondeterministic. It reorders the additions of every gradient reduction over the batch with more
// than two contributions (lab/tensor/parallel.h: arrival_order): Linear's weight and bias gradients
// (the rank's samples), Conv2d's weight and bias gradients and BatchNorm's per-channel gradient sums
// (samples x positions), and the naive allreduce's gather on rank 0 (the ranks' buffers, as they
// arrive). Two contributions add the same in either order (a + b == b + a in IEEE float), so:
//   refused  the mlp with at most two samples per rank (per device with --mode dp): every reduction
//            has at most two contributions, and two runs are bitwise equal
//   warned   the same, but with --allreduce naive over three or more ranks: only the order in which
//            the ranks' buffers reach rank 0 can change, which timing alone decides
// Returns the entry for c (refused or warned), or nothing when the flag makes every run differ
// (or is off).
std::vector<IneffectiveSetting> nondeterministic_no_effect(const RunConfig& c);

// What --nondeterministic does in configuration c, for the run's header: "gradient sums over the
// batch (Linear, Conv2d, BatchNorm) add their partial sums in an order drawn per call, ...".
std::string describe_nondeterministic(const RunConfig& c);

// Samples in the largest batch a rank (a device, with --mode dp) computes its gradients on:
// batch_size, or fewer when the rank's share of the training set (--limit-train) is smaller.
int64_t largest_local_batch(const RunConfig& c);

}  // namespace lab
