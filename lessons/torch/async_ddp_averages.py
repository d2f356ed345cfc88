"""async-vs-sync: one DDP iteration (PyTorch 1.13) turns the 4 ranks' gradients into ONE update:
after backward every rank holds the mean of the 4 ranks' gradients (each computed on its own 32
samples), so 4 ranks x 32 samples make one optimizer step of 128 samples, and the ranks' weights
stay equal.

Runs the mlp under DDP with 4 gloo ranks as threads of this process (one ProcessGroupGloo each)
and compares every rank's gradient with the mean of the 4 gradients computed without DDP.
Exit 0: the claim holds; 1: PyTorch does otherwise (printed); 77: no torch."""
import datetime
import os
import sys
import threading

try:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
except ImportError:
    print("skipped: no python3-torch")
    sys.exit(77)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools", "torch"))
from dtlab_models import mlp  # noqa: E402

WORLD = 4


def batch(rank):
    g = torch.Generator().manual_seed(100 + rank)
    return torch.randn(32, 1, 28, 28, generator=g), torch.randint(0, 10, (32,), generator=g)


def seed0_mlp():
    torch.manual_seed(0)
    return mlp()


def local_grads(rank):
    m = seed0_mlp()
    x, y = batch(rank)
    torch.nn.functional.cross_entropy(m(x), y).backward()
    return [p.grad.clone() for p in m.parameters()]


store = dist.HashStore()
models = [seed0_mlp() for _ in range(WORLD)]  # built here: torch.manual_seed is global, threads would interleave
ddp_grads = [None] * WORLD
errors = []


def rank_main(rank):
    try:
        pg = dist.ProcessGroupGloo(dist.PrefixStore("dp", store), rank, WORLD, datetime.timedelta(seconds=120))
        ddp = DDP(models[rank], process_group=pg)
        x, y = batch(rank)
        torch.nn.functional.cross_entropy(ddp(x), y).backward()
        ddp_grads[rank] = [p.grad.clone() for p in ddp.module.parameters()]
    except Exception as e:  # noqa: BLE001 - reported below
        errors.append(f"rank {rank}: {e}")


threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(WORLD)]
for t in threads:
    t.start()
for t in threads:
    t.join()
if errors:
    print("could not run DDP on gloo: " + "; ".join(errors))
    sys.exit(1)
local = [local_grads(r) for r in range(WORLD)]
mean = [sum(g[i] for g in local) / WORLD for i in range(len(local[0]))]
worst = max((a - b).abs().max().item() for r in range(WORLD) for a, b in zip(ddp_grads[r], mean))
spread = max((a - b).abs().max().item() for r in range(1, WORLD) for a, b in zip(ddp_grads[r], ddp_grads[0]))
one_rank = max((a - b).abs().max().item() for a, b in zip(ddp_grads[0], local[0]))
print(f"largest difference between a DDP rank's gradient and the mean of the 4 local gradients: {worst:.2e}")
print(f"... between rank 0's own local gradient and the mean: {one_rank:.2e}; between ranks: {spread:.2e}")
if not (worst < 1e-6 and spread == 0 and one_rank > 1e-4):
    print("PyTorch does otherwise: the DDP gradient is not the mean of the ranks' gradients on every rank")
    sys.exit(1)
print("holds: after backward every rank holds the mean of the 4 gradients: one update of 4 x 32 samples")
