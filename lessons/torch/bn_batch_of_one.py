#!/usr/bin/env python3
# The minibatch lesson's claim, run in PyTorch: BatchNorm1d in training mode refuses one value per
# channel by an explicit size check ("Expected more than 1 value per channel when training"),
# raised before any arithmetic; it is not a variance that comes out undefined. BatchNorm2d with
# one sample trains when H x W > 1 (each channel still has H x W values), and only 1 x 1 maps are
# refused.
# Exit 0: PyTorch does that; 1: it does otherwise (printed); 77: no torch.
import inspect
import sys

try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except ImportError:
    print("python3-torch is not installed")
    sys.exit(77)

ok = True
print(f"torch {torch.__version__}")

bn1 = nn.BatchNorm1d(256).train()
try:
    bn1(torch.randn(1, 256))
    ok = False
    print("BatchNorm1d(256).train() on a (1, 256) batch: ran (expected a refusal)")
except ValueError as e:
    print(f"BatchNorm1d(256).train() on a (1, 256) batch: ValueError: {e}")
    if "Expected more than 1 value per channel when training" not in str(e):
        ok = False

# The refusal is an explicit check in F.batch_norm (_verify_batch_size), not the arithmetic.
src = inspect.getsource(F.batch_norm)
print("F.batch_norm calls _verify_batch_size when training:", "_verify_batch_size" in src)
ok = ok and "_verify_batch_size" in src

bn2 = nn.BatchNorm2d(8).train()
y = bn2(torch.randn(1, 8, 4, 4))
print(f"BatchNorm2d(8).train() on a (1, 8, 4, 4) batch: ran, output {tuple(y.shape)}, "
      f"running_var[0] {bn2.running_var[0].item():.4f}")
if not torch.isfinite(y).all():
    ok = False
try:
    nn.BatchNorm2d(8).train()(torch.randn(1, 8, 1, 1))
    ok = False
    print("BatchNorm2d on (1, 8, 1, 1): ran (expected a refusal)")
except ValueError as e:
    print(f"BatchNorm2d(8).train() on a (1, 8, 1, 1) batch: ValueError: {e}")
print("claim holds" if ok else "claim does NOT hold")
sys.exit(0 if ok else 1)
