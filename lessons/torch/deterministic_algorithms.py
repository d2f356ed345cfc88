#!/usr/bin/env python3
# The nondeterminism lesson's claims, checked against PyTorch 1.13:
#  - torch.use_deterministic_algorithms(True) switches some CUDA kernels to deterministic versions
#    (Conv2d, index_add, scatter_add_), refuses those that have none with a RuntimeError, and on
#    CUDA 10.2 or later needs CUBLAS_WORKSPACE_CONFIG=:4096:8 or :16:8 for cuBLAS to be
#    deterministic (its documentation; without the variable cuBLAS calls raise a RuntimeError);
#  - torch.backends.cudnn.deterministic and torch.backends.cudnn.benchmark are both off by default;
#  - on the CPU, two runs of the same seeded training on the same number of threads end with the
#    same bits.
# Exit 0: PyTorch does that; 1: it does otherwise (printed); 77: no torch.
import sys

try:
    import torch
    import torch.nn as nn
except ImportError:
    print("python3-torch is not installed")
    sys.exit(77)

ok = True
print(f"torch {torch.__version__}")
doc = torch.use_deterministic_algorithms.__doc__
# The documentation lists the operations made deterministic, then those that throw instead.
deterministic_part, _, throwing_part = doc.partition("normally-nondeterministic operations will throw")
for needle in ("CUBLAS_WORKSPACE_CONFIG=:4096:8", "CUBLAS_WORKSPACE_CONFIG=:16:8"):
    print(f"use_deterministic_algorithms' documentation names {needle}: {needle in doc}")
    ok = ok and needle in doc
for needle in ("torch.nn.Conv2d` when called on CUDA", "torch.index_add` when called on CUDA",
               "scatter_add_` when called on a CUDA"):
    print(f"  made deterministic: {needle!r}: {needle in deterministic_part}")
    ok = ok and needle in deterministic_part
print(f"  some operations throw a RuntimeError instead: {'RuntimeError' in doc and bool(throwing_part)}")
ok = ok and bool(throwing_part)
# The C++ side, where torch ships its headers: the alert that refuses cuBLAS without the variable.
import os
import torch.utils.cpp_extension as cpp_extension
headers = [os.path.join(d, "ATen", "Context.h") for d in cpp_extension.include_paths()]
headers = [h for h in headers if os.path.exists(h)]
if headers:
    text = open(headers[0]).read()
    found = "void alertCuBLASConfigNotDeterministic() const;" in text and '":4096:8"' in text
    print(f"{headers[0]} declares alertCuBLASConfigNotDeterministic (\":16:8\" or \":4096:8\"): {found}")
    ok = ok and found
else:
    print("torch's C++ headers are not installed: the cuBLAS alert is not read (the documentation above is)")
print(f"cudnn.deterministic default {torch.backends.cudnn.deterministic}, "
      f"cudnn.benchmark default {torch.backends.cudnn.benchmark}")
ok = ok and not torch.backends.cudnn.deterministic and not torch.backends.cudnn.benchmark


def train():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                          nn.MaxPool2d(2), nn.Flatten(), nn.Linear(8 * 14 * 14, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(1)
    for _ in range(8):
        x = torch.randn(64, 1, 28, 28, generator=g)
        y = torch.randint(0, 10, (64,), generator=g)
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return torch.cat([p.detach().flatten() for p in model.parameters()])


torch.set_num_threads(2)
a, b = train(), train()
same = torch.equal(a, b)
print(f"CPU, 2 threads, the same seeded training twice: bitwise equal weights: {same}")
ok = ok and same
print("claim holds" if ok else "claim does NOT hold")
sys.exit(0 if ok else 1)
