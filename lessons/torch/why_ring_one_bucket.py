"""why-ring: DDP (PyTorch 1.13) allreduces the mlp's whole gradient, 235,914 float32 values
(943,656 bytes), as ONE bucket in every iteration: the first bucket holds up to
dist._DEFAULT_FIRST_BUCKET_BYTES = 1 MiB, and the mlp's gradient fits in it.

Runs DDP on gloo in this process (a world of one rank: the Reducer builds and launches its buckets
the same way for any world size) with a communication hook that records every bucket it is
given. Exit 0: the claim holds; 1: PyTorch does otherwise (printed); 77: no torch."""
import os
import sys

try:
    import torch
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel as DDP
except ImportError:
    print("skipped: no python3-torch")
    sys.exit(77)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools", "torch"))
from dtlab_models import mlp  # noqa: E402

dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
torch.manual_seed(0)
model = mlp()
ddp = DDP(model)
buckets = []  # (iteration, bucket index, floats)
it = 0


def hook(state, bucket):
    buckets.append((it, bucket.index(), bucket.buffer().numel()))
    return default_hooks.allreduce_hook(state, bucket)


ddp.register_comm_hook(dist.group.WORLD, hook)
x = torch.randn(32, 1, 28, 28)
y = torch.randint(0, 10, (32,))
for it in range(4):
    torch.nn.functional.cross_entropy(ddp(x), y).backward()

params = sum(p.numel() for p in model.parameters())
expected = [(i, 0, params) for i in range(4)]
print(f"parameters: {params} ({params * 4} bytes of float32 gradient); "
      f"first bucket cap: {dist._DEFAULT_FIRST_BUCKET_BYTES} bytes")
print(f"buckets allreduced (iteration, index, floats): {buckets}")
if params != 235914 or dist._DEFAULT_FIRST_BUCKET_BYTES != 1 << 20 or buckets != expected:
    print("PyTorch does otherwise: expected one bucket of 235914 floats per iteration")
    sys.exit(1)
print("holds: one bucket of the whole gradient (943,656 bytes) in every iteration")
