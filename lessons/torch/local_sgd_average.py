#!/usr/bin/env python3
"""local-sgd: PyTorch 1.13's PeriodicModelAverager against DDP, run in PyTorch itself (4 CPU
processes, gloo), and what its source shows.

Each rank trains Linear-ReLU-Linear with SGD (lr 0.05, momentum 0.9) on its own batches for 33
iterations: with DDP (gradients averaged every step), and with local SGD, every rank stepping on
its own gradients and PeriodicModelAverager(period=K, warmup_steps=0) averaging after each step.

  1. K = 1 follows DDP's trajectory up to float rounding (linear update rule), although each
     rank's momentum buffer stays its own: the buffers differ between ranks.
  2. K = 8 leaves it: the final parameters differ far more than K = 1's rounding.
  3. The averager averages after iterations 0, K, 2K, ... (step >= warmup_steps and
     (step - warmup_steps) % period == 0): with K = 8 over 33 iterations after 0, 8, 16, 24, 32,
     so every rank ends with the same parameters.
  4. model_averaging.utils.average_parameters averages parameters only (no buffers, no optimizer
     state): it divides the flattened parameters by the world size, then allreduces the sum.
  5. PyTorch's post-localSGD DDP hook, with PostLocalSGDState(subgroup=None), still allreduces
     gradients within a subgroup that dist.new_subgroups() makes (one per machine) after the
     warm-up: local SGD without any gradient allreduce, as the lab runs it, is the averager used
     without DDP's gradient averaging (or with subgroups of one rank).

Exit 0: PyTorch does this; 1: it does otherwise (printed); 77: no torch.
"""
import inspect
import sys
import warnings

import torchcheck  # exits 77 without torch
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import post_localSGD_hook
from torch.distributed.algorithms.model_averaging import averagers, utils

WORLD = 4
STEPS = 33


def worker(rank):
    warnings.filterwarnings("ignore", message="When period is 1")  # the averager's advice to use DDP instead
    out = {}
    for name, period in (("ddp", 0), ("k1", 1), ("k8", 8)):
        torch.manual_seed(0)
        net = nn.Sequential(nn.Linear(20, 32), nn.ReLU(), nn.Linear(32, 5))
        model = nn.parallel.DistributedDataParallel(net) if period == 0 else net
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        averager = averagers.PeriodicModelAverager(period=period, warmup_steps=0) if period else None
        averaged_at = []
        g = torch.Generator().manual_seed(100 + rank)
        for step in range(STEPS):
            x = torch.randn(32, 20, generator=g)
            y = torch.randint(0, 5, (32,), generator=g)
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            if averager:
                before = [p.detach().clone() for p in net.parameters()]
                averager.average_parameters(net.parameters())
                if any(not torch.equal(a, p) for a, p in zip(before, net.parameters())):
                    averaged_at.append(step)
        out[name] = {"params": [p.detach().clone() for p in net.parameters()],
                     "momentum": [opt.state[p]["momentum_buffer"].clone() for p in net.parameters()],
                     "averaged_at": averaged_at}
    return out


def maxdiff(a, b):
    return max((x - y).abs().max().item() for x, y in zip(a, b))


def main():
    claims = torchcheck.Claims()
    claim = claims.check

    ranks = torchcheck.run_ranks(WORLD, worker)
    r0 = ranks[0]
    k1 = maxdiff(r0["k1"]["params"], r0["ddp"]["params"])
    k8 = maxdiff(r0["k8"]["params"], r0["ddp"]["params"])
    claim(k1 < 1e-5, f"K = 1 ends at DDP's parameters up to rounding: {k1:.2g}")
    claim(maxdiff(r0["k1"]["momentum"], ranks[1]["k1"]["momentum"]) > 1e-3,
          "... while every rank keeps its own momentum buffer (rank 0's and rank 1's differ)")
    claim(k8 > 100 * max(k1, 1e-7) and k8 > 1e-3, f"K = 8 leaves DDP: {k8:.2g} against K = 1's {k1:.2g}")
    claim(r0["k8"]["averaged_at"] == [0, 8, 16, 24, 32] and len(r0["k1"]["averaged_at"]) == STEPS,
          f"PeriodicModelAverager(period=8, warmup_steps=0) averages after iterations {r0['k8']['averaged_at']}")
    claim(all(maxdiff(r["k8"]["params"], r0["k8"]["params"]) == 0 for r in ranks),
          "the last average after iteration 32 leaves every rank with the same parameters")

    src = inspect.getsource(utils.average_parameters)
    claim("flat_params /= dist.get_world_size(group_to_use)" in src and "dist.all_reduce(flat_params" in src,
          "average_parameters divides the flattened parameters by the world size, then allreduces the sum")
    avg_src = inspect.getsource(averagers.PeriodicModelAverager.average_parameters)
    claim("(self.step - self.warmup_steps) % self.period == 0" in avg_src and "buffer" not in avg_src,
          "PeriodicModelAverager averages the parameters it is given (the momentum and the buffers are not touched)")
    hook_src = inspect.getsource(post_localSGD_hook.post_localSGD_hook)
    claim("state.subgroup, _ = dist.new_subgroups()" in hook_src,
          "post_localSGD_hook with subgroup=None makes per-machine subgroups and keeps allreducing gradients in them")
    return claims.finish()


if __name__ == "__main__":
    sys.exit(main())
