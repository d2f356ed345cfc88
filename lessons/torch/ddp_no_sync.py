#!/usr/bin/env python3
"""no-sync: gradient accumulation with DistributedDataParallel.no_sync(), run in PyTorch itself
(4 CPU processes, gloo), and the single-process facts the lesson relies on.

Each rank trains Linear-BatchNorm1d-ReLU-Linear on its own micro-batches of 16: 8 micro-batches,
the first 3 of every 4 under no_sync, an optimizer step after every 4th. A communication hook
counts the gradient allreduces of every backward; DDP's buffer broadcast is counted per forward.

  1. A backward under no_sync communicates nothing; the synchronized backward allreduces the
     gradient once, one gradient's size (every parameter once), whatever K is.
  2. After the synchronized backward every rank's .grad is the average over ranks of each rank's
     sum of its 4 micro-batch gradients (the accumulated .grad, allreduced once).
  3. DDP broadcasts the buffers in a forward only when the forward before it was a synchronized
     training forward (and in the first forward): micro-batches 0 and 4 of 8, not every one.
  4. BatchNorm updates its running statistics in every training forward, under no_sync too:
     num_batches_tracked is 8, not 2.
  5. 4 backward passes of a mean loss over 16 samples leave 4 times the mean gradient over the 64
     samples in .grad (a model without BatchNorm: equal up to rounding after dividing by 4).
  6. For SGD (momentum or not) dividing the loss by 4 is dividing the lr by 4; with weight decay
     it is not.
  7. SyncBatchNorm's exchange does not look at no_sync: nn.SyncBatchNorm.forward decides to sync
     from self.training and the world size alone; its function all-gathers in forward and
     allreduces in backward.

Exit 0: PyTorch does this; 1: it does otherwise (printed); 77: no torch.
"""
import contextlib
import inspect
import sys

import torchcheck  # exits 77 without torch
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.modules import _functions

WORLD = 4
K = 3  # micro-batches under no_sync before each synchronized one
MICRO = 8


def model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 6), nn.BatchNorm1d(6), nn.ReLU(), nn.Linear(6, 3))


def worker(rank):
    net = model()
    ref = model()  # the same computation without DDP: the local accumulated gradient
    ddp = nn.parallel.DistributedDataParallel(net)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    calls = []  # per backward: (allreduces, elements allreduced)

    def counting_hook(state, bucket):
        calls[-1][0] += 1
        calls[-1][1] += bucket.buffer().numel()
        fut = dist.all_reduce(bucket.buffer().div_(WORLD), async_op=True).get_future()
        return fut.then(lambda f: f.value()[0])

    ddp.register_comm_hook(None, counting_hook)
    broadcasts = []
    real = ddp._distributed_broadcast_coalesced

    def counting_broadcast(*args, **kwargs):
        broadcasts[-1] += 1
        return real(*args, **kwargs)

    ddp._distributed_broadcast_coalesced = counting_broadcast
    g = torch.Generator().manual_seed(100 + rank)
    synced_grads, local_sums = [], []
    for i in range(MICRO):
        x = torch.randn(16, 8, generator=g) * (1 + rank)
        y = torch.randint(0, 3, (16,), generator=g)
        calls.append([0, 0])
        broadcasts.append(0)
        sync = i % (K + 1) == K
        with (contextlib.nullcontext() if sync else ddp.no_sync()):
            nn.functional.cross_entropy(ddp(x), y).backward()
        nn.functional.cross_entropy(ref(x), y).backward()
        if sync:
            synced_grads.append([p.grad.detach().clone() for p in net.parameters()])
            local_sums.append([p.grad.detach().clone() for p in ref.parameters()])
            opt.step()
            opt.zero_grad()
            ref.load_state_dict(net.state_dict())
            ref.zero_grad()
    return {"calls": calls, "broadcasts": broadcasts, "synced": synced_grads, "local": local_sums,
            "nbt": net[1].num_batches_tracked.item(), "params": sum(p.numel() for p in net.parameters())}


def main():
    claims = torchcheck.Claims()
    claim = claims.check

    ranks = torchcheck.run_ranks(WORLD, worker)
    r0 = ranks[0]
    under = [c for i, c in enumerate(r0["calls"]) if i % (K + 1) != K]
    synced = [c for i, c in enumerate(r0["calls"]) if i % (K + 1) == K]
    claim(all(c == [0, 0] for c in under), f"backward passes under no_sync allreduce nothing: {under}")
    claim(all(c[0] >= 1 and c[1] == r0["params"] for c in synced),
          f"each synchronized backward allreduces every parameter once ({r0['params']} elements): {synced}")
    ok = True
    for cycle in range(MICRO // (K + 1)):
        for j in range(len(r0["synced"][cycle])):
            mean_local = sum(r["local"][cycle][j] for r in ranks) / WORLD
            ok = ok and all(torch.allclose(r["synced"][cycle][j], mean_local, rtol=1e-5, atol=1e-6) for r in ranks)
    claim(ok, "after the synchronized backward every rank's .grad is the rank average of the accumulated local sums")
    claim(r0["broadcasts"] == [1, 0, 0, 0, 1, 0, 0, 0],
          f"buffers broadcast in the first forward and the first after a synchronized one: {r0['broadcasts']}")
    claim(all(r["nbt"] == MICRO for r in ranks), f"num_batches_tracked after 8 micro-batches: {r0['nbt']}")

    torch.manual_seed(1)
    lin = nn.Linear(8, 3)
    x, y = torch.randn(64, 8), torch.randint(0, 3, (64,))
    for k in range(4):
        nn.functional.cross_entropy(lin(x[16 * k:16 * (k + 1)]), y[16 * k:16 * (k + 1)]).backward()
    acc = lin.weight.grad.clone()
    lin.zero_grad()
    nn.functional.cross_entropy(lin(x), y).backward()
    claim(torch.allclose(acc, 4 * lin.weight.grad, rtol=1e-5, atol=1e-6),
          "4 backward passes of a mean loss over 16 leave 4 x the mean gradient over 64 in .grad (no BatchNorm)")

    def sgd_step(scale_loss, lr, **kw):
        torch.manual_seed(2)
        m = nn.Linear(8, 3)
        opt = torch.optim.SGD(m.parameters(), lr=lr, **kw)
        for _ in range(3):
            opt.zero_grad()
            (nn.functional.cross_entropy(m(x), y) * scale_loss).backward()
            opt.step()
        return m.weight.detach()

    claim(torch.allclose(sgd_step(0.25, 0.05, momentum=0.9), sgd_step(1.0, 0.0125, momentum=0.9), rtol=1e-5, atol=1e-7),
          "SGD with momentum: the loss divided by 4 is the lr divided by 4")
    claim(not torch.allclose(sgd_step(0.25, 0.05, weight_decay=0.1), sgd_step(1.0, 0.0125, weight_decay=0.1),
                             rtol=1e-5, atol=1e-7),
          "SGD with weight decay: the loss divided by 4 is not the lr divided by 4")

    fwd = inspect.getsource(nn.SyncBatchNorm.forward)
    claim("need_sync = (bn_training and self.training)" in fwd and "no_sync" not in fwd
          and "require_backward_grad_sync" not in fwd,
          "nn.SyncBatchNorm.forward syncs whenever it trains on more than one process, no_sync or not")
    claim("all_gather" in inspect.getsource(_functions.SyncBatchNorm.forward)
          and "all_reduce" in inspect.getsource(_functions.SyncBatchNorm.backward),
          "SyncBatchNorm all-gathers its statistics in forward and allreduces in backward")
    return claims.finish()


if __name__ == "__main__":
    sys.exit(main())
