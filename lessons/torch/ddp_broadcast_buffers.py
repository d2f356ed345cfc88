#!/usr/bin/env python3
"""bn-ddp: when DistributedDataParallel(broadcast_buffers=True) copies rank 0's BatchNorm buffers,
run in PyTorch itself (4 CPU processes, gloo).

Each rank trains Linear-BatchNorm1d-ReLU-Linear on its own batches for 4 steps, then runs one
forward in eval mode under torch.no_grad() (an evaluation), and records running_mean after every
training step and after the evaluation. The claims, as the lesson states them:

  1. before every training forward rank 0's buffers overwrite every rank's, then each rank updates
     them with its own batch: after the last training step rank r's running_mean is
     (1 - m) * rank 0's running_mean of the step before + m * rank r's own batch mean;
  2. so after the last training step the ranks' running means differ;
  3. the next forward through DDP (the evaluation) broadcasts again: then every rank holds rank 0's
     running_mean of the last training step, bit for bit;
  4. without broadcast_buffers each rank keeps its own (rank r's of the step before + its own batch
     mean), also after the evaluation.

Exit 0: PyTorch does all of this; 1: it does otherwise (printed); 77: no torch.
"""
import sys

import torchcheck  # exits 77 without torch
import torch
from torch import nn

WORLD = 4
STEPS = 4
MOMENTUM = 0.1  # BatchNorm's default


def worker(rank, broadcast_buffers):
    torch.manual_seed(0)  # the same initial weights everywhere (DDP would broadcast them anyway)
    model = nn.Sequential(nn.Linear(8, 6), nn.BatchNorm1d(6, momentum=MOMENTUM), nn.ReLU(), nn.Linear(6, 3))
    ddp = nn.parallel.DistributedDataParallel(model, broadcast_buffers=broadcast_buffers)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    bn = model[1]
    batch_means = []
    bn.register_forward_pre_hook(lambda m, inp: batch_means.append(inp[0].detach().mean(0)) if m.training else None)
    g = torch.Generator().manual_seed(100 + rank)  # every rank its own data
    running = []
    for _ in range(STEPS):
        x = torch.randn(16, 8, generator=g) * (1 + rank)
        y = torch.randint(0, 3, (16,), generator=g)
        opt.zero_grad()
        nn.functional.cross_entropy(ddp(x), y).backward()
        opt.step()
        running.append(bn.running_mean.detach().clone())
    ddp.eval()
    with torch.no_grad():
        ddp(torch.randn(5, 8, generator=g))
    after_eval = bn.running_mean.detach().clone()
    return {"running": running, "batch_means": batch_means, "after_eval": after_eval}


def run(broadcast_buffers):
    return torchcheck.run_ranks(WORLD, worker, broadcast_buffers)


def main():
    claims = torchcheck.Claims()
    claim = claims.check

    last = STEPS - 1
    on = run(True)
    r0_prev = on[0]["running"][last - 1]
    r0_last = on[0]["running"][last]
    for r in range(1, WORLD):
        mine = on[r]["running"][last]
        from_r0 = (1 - MOMENTUM) * r0_prev + MOMENTUM * on[r]["batch_means"][last]
        from_own = (1 - MOMENTUM) * on[r]["running"][last - 1] + MOMENTUM * on[r]["batch_means"][last]
        claim((mine - from_r0).abs().max().item() < 1e-6,
              f"broadcast_buffers: rank {r}'s running_mean after the last training step = 0.9 x rank 0's of the step "
              f"before + 0.1 x its own batch mean (largest deviation {(mine - from_r0).abs().max().item():.2g})")
        claim((mine - from_own).abs().max().item() > 1e-4,
              f"... and not 0.9 x its own of the step before + 0.1 x its own batch mean "
              f"(that would be off by {(mine - from_own).abs().max().item():.3g})")
        claim((mine - r0_last).abs().max().item() > 1e-4,
              f"after the last training step rank {r}'s running_mean differs from rank 0's "
              f"(by up to {(mine - r0_last).abs().max().item():.3g})")
        claim(torch.equal(on[r]["after_eval"], r0_last),
              f"the evaluation's forward (no_grad, eval mode) broadcast again: rank {r} then holds rank 0's running_mean "
              f"of the last training step, bit for bit")
    off = run(False)
    for r in range(1, WORLD):
        mine = off[r]["running"][last]
        from_own = (1 - MOMENTUM) * off[r]["running"][last - 1] + MOMENTUM * off[r]["batch_means"][last]
        claim((mine - from_own).abs().max().item() < 1e-6,
              f"broadcast_buffers=False: rank {r} updates its own running_mean with its own batch mean")
        claim((off[r]["after_eval"] - off[0]["after_eval"]).abs().max().item() > 1e-4,
              f"broadcast_buffers=False: after the evaluation rank {r}'s running_mean still differs from rank 0's")
    claim(torch.equal(off[0]["after_eval"], on[0]["after_eval"]),
          "rank 0's running_mean is the same with and without broadcast_buffers (the broadcast only overwrites the others)")
    return claims.finish()


if __name__ == "__main__":
    sys.exit(main())
