#!/usr/bin/env python3
"""bn-ddp: what PyTorch 1.13's SyncBatchNorm exchanges between ranks.

SyncBatchNorm runs only on CUDA in 1.13 (its forward raises "SyncBatchNorm expected input tensor
to be on GPU" on the CPU), so this check reads the source of its autograd function
(torch/nn/modules/_functions.py, class SyncBatchNorm) and repeats its arithmetic with gloo on 4
CPU processes:

  1. forward: each rank computes its batch's mean and invstd (torch.batch_norm_stats) and its
     count, concatenates [mean, invstd, count], all-gathers that row from every rank (not an
     all_reduce of sums) and combines the rows with torch.batch_norm_gather_stats_with_counts;
  2. backward: one all_reduce of [sum_dy, sum_dy_xmu];
  3. the gathered rows give every rank the global batch's statistics: combined as CUDA's
     batch_norm_reduce_statistics_kernel does (aten/src/ATen/native/cuda/Normalization.cuh: the
     variance as 1 / invstd^2 - eps, Chan's pairwise update), 4 ranks with 32, 32, 32 and 5 values
     get the mean and biased variance of all 101 together, the same bits on every rank.

Exit 0: PyTorch does this; 1: it does otherwise (printed); 77: no torch.
"""
import inspect
import sys

import torchcheck  # exits 77 without torch
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.modules import _functions

WORLD = 4
C = 6
EPS = 1e-5
SIZES = [32, 32, 32, 5]


def rank_input(rank):
    g = torch.Generator().manual_seed(7 + rank)
    return torch.randn(SIZES[rank], C, generator=g) * (1 + rank) + rank  # ranks differ in mean and spread


def worker(rank):
    x = rank_input(rank)
    mean = x.mean(0)
    invstd = 1.0 / torch.sqrt(x.var(0, unbiased=False) + EPS)
    count = torch.full((1,), x.shape[0], dtype=x.dtype)
    combined = torch.cat([mean, invstd, count], dim=0)  # (2C + 1,), as SyncBatchNorm.forward builds it
    rows = [torch.empty_like(combined) for _ in range(WORLD)]
    dist.all_gather(rows, combined)
    mean_all, invstd_all, count_all = torch.split(torch.stack(rows, 0), C, dim=1)
    # batch_norm_reduce_statistics_kernel, in float32 (its accscalar_t for float input)
    avg = torch.zeros(C)
    var_n = torch.zeros(C)
    n = torch.zeros(())
    for j in range(WORLD):
        cnt = count_all[j, 0]
        v = (1.0 / invstd_all[j]) ** 2 - EPS
        v = v * cnt
        factor = 1.0 / (n + cnt)
        var_n = var_n + v + (avg - mean_all[j]) * (avg - mean_all[j]) * n * cnt * factor
        avg = n * factor * avg + cnt * factor * mean_all[j]
        n = n + cnt
    return {"mean": avg, "var": var_n / n, "count": n}


def main():
    claims = torchcheck.Claims()
    claim = claims.check

    try:
        nn.SyncBatchNorm(C)(torch.randn(4, C))
        on_cpu = "runs"
    except ValueError as e:
        on_cpu = str(e)
    claim("GPU" in on_cpu, f"nn.SyncBatchNorm refuses CPU tensors in this version ({on_cpu!r}): read its source instead")

    fwd = inspect.getsource(_functions.SyncBatchNorm.forward)
    bwd = inspect.getsource(_functions.SyncBatchNorm.backward)
    claim("torch.batch_norm_stats(input, eps)" in fwd, "forward: each rank's mean and invstd from torch.batch_norm_stats")
    claim("torch.cat([mean, invstd, count], dim=0)" in fwd, "forward: the row a rank sends is [mean, invstd, count]")
    claim("all_gather" in fwd and "all_reduce" not in fwd, "forward: the rows are all-gathered (no all_reduce of sums)")
    claim("batch_norm_gather_stats_with_counts" in fwd,
          "forward: the rows are combined by torch.batch_norm_gather_stats_with_counts")
    claim("torch.cat([sum_dy, sum_dy_xmu], dim=0)" in bwd and "all_reduce" in bwd,
          "backward: one all_reduce of [sum_dy, sum_dy_xmu]")

    got = torchcheck.run_ranks(WORLD, worker)
    x = torch.cat([rank_input(r) for r in range(WORLD)], 0).double()
    gmean, gvar = x.mean(0), x.var(0, unbiased=False)
    m, v = got[0]["mean"].double(), got[0]["var"].double()
    claim(got[0]["count"].item() == sum(SIZES), f"the global count is {sum(SIZES)} (got {got[0]['count'].item():.0f})")
    claim(torch.allclose(m, gmean, rtol=1e-5, atol=1e-6) and torch.allclose(v, gvar, rtol=1e-4, atol=1e-6),
          f"mean and invstd of each rank, with the counts, give the global batch's mean and biased variance "
          f"(largest differences {(m - gmean).abs().max().item():.2g}, {(v - gvar).abs().max().item():.2g})")
    claim(all(torch.equal(got[r]["mean"], got[0]["mean"]) and torch.equal(got[r]["var"], got[0]["var"])
              for r in range(WORLD)),
          "every rank combines the same gathered rows in the same order: the same bits on every rank")
    return claims.finish()


if __name__ == "__main__":
    sys.exit(main())
