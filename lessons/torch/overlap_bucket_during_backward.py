"""overlap: in PyTorch 1.13, DDP on the cnn allreduces one bucket holding every gradient in the
first iteration; from the second on (the buckets rebuilt in the order the gradients became
ready, the first capped at dist._DEFAULT_FIRST_BUCKET_BYTES = 1 MiB), bucket 0 holds the two
Linear layers (402,826 floats, 1.6 MB) and bucket 1 the convolutions and BatchNorms, and bucket
0's allreduce is launched while backward is still running: before the first convolution's weight
gradient has been computed; and backward returns only once every bucket's allreduce is done.

Runs DDP on gloo in this process (a world of one rank: the Reducer's buckets and hooks work the
same for any world size) with a communication hook and a gradient hook on the first
convolution's weight, and records the order in which they run. Exit 0: the claim holds; 1:
PyTorch does otherwise (printed); 77: no torch."""
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
from dtlab_models import cnn  # noqa: E402

dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
torch.manual_seed(0)
model = cnn()
ddp = DDP(model)
events = []  # per iteration, in the order they happened
futures = []  # every bucket's allreduce


def hook(state, bucket):
    events[-1].append(("bucket", bucket.index(), bucket.buffer().numel()))
    futures.append(default_hooks.allreduce_hook(state, bucket))
    return futures[-1]


ddp.register_comm_hook(dist.group.WORLD, hook)
model[0].weight.register_hook(lambda g: events[-1].append(("conv1.weight grad",)))
x = torch.randn(32, 1, 28, 28)
y = torch.randint(0, 10, (32,))
pending_after_backward = 0
for it in range(3):
    events.append([])
    torch.nn.functional.cross_entropy(ddp(x), y).backward()
    pending_after_backward += sum(not f.done() for f in futures)

linear = sum(p.numel() for p in list(model[9].parameters()) + list(model[11].parameters()))
total = sum(p.numel() for p in model.parameters())
for i, e in enumerate(events):
    print(f"iteration {i}: {e}")
expected_first = [("conv1.weight grad",), ("bucket", 0, total)]
expected_later = [("bucket", 0, linear), ("conv1.weight grad",), ("bucket", 1, total - linear)]
print(f"allreduces not finished when backward returned: {pending_after_backward}")
if linear != 402826 or events[0] != expected_first or any(e != expected_later for e in events[1:]) \
        or pending_after_backward:
    print(f"PyTorch does otherwise: expected {expected_first} in iteration 0, then {expected_later}")
    sys.exit(1)
print(f"holds: after the first iteration, bucket 0 (the Linear layers, {linear} floats = {linear * 4:,} bytes) "
      "is allreduced before the first convolution's gradient exists, i.e. during backward; backward returned "
      "after every bucket's allreduce")
