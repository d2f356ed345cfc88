#!/usr/bin/env python3
# The minibatch lesson's claim, run in PyTorch: SyncBatchNorm is no way out of micro-batch
# accumulation on one rank. It combines the statistics of batches that run at the same time on
# several ranks; its forward falls back to F.batch_norm of the batch it is given when the process
# group has one rank (PyTorch 1.13's SyncBatchNorm.forward: need_sync = world_size > 1), so a
# micro-batch is normalized with its own statistics, as with BatchNorm. GroupNorm does not use the
# batch: accumulating the gradients of single samples gives the batched gradient to rounding.
# Exit 0: PyTorch does that; 1: it does otherwise (printed); 77: no torch.
import inspect
import sys

try:
    import torch
    import torch.nn as nn
except ImportError:
    print("python3-torch is not installed")
    sys.exit(77)

ok = True
print(f"torch {torch.__version__}")
src = inspect.getsource(nn.SyncBatchNorm.forward)
for needle in ("need_sync = world_size > 1", "if not need_sync:", "return F.batch_norm("):
    found = needle in src
    print(f"SyncBatchNorm.forward contains {needle!r}: {found}")
    ok = ok and found


def grads(model, x, y, one_at_a_time):
    model.zero_grad()
    if one_at_a_time:
        for i in range(x.shape[0]):
            loss = nn.functional.cross_entropy(model(x[i:i + 1]), y[i:i + 1]) / x.shape[0]
            loss.backward()
    else:
        nn.functional.cross_entropy(model(x), y).backward()
    return torch.cat([p.grad.flatten() for p in model.parameters()])


torch.manual_seed(0)
x = torch.randn(64, 784)
y = torch.randint(0, 10, (64,))
# The lesson's mlp with GroupNorm (32 groups) where it has BatchNorm1d.
gn = nn.Sequential(nn.Linear(784, 256), nn.GroupNorm(32, 256), nn.ReLU(),
                   nn.Linear(256, 128), nn.GroupNorm(32, 128), nn.ReLU(), nn.Linear(128, 10))
g_batch = grads(gn, x, y, False)
g_loop = grads(gn, x, y, True)
rel = ((g_batch - g_loop).abs().max() / g_batch.abs().max()).item()
print(f"GroupNorm mlp: 64 single samples accumulated vs one batch of 64: relative difference {rel:.2e}")
ok = ok and rel < 1e-5
print("claim holds" if ok else "claim does NOT hold")
sys.exit(0 if ok else 1)
