#!/usr/bin/env python3
"""resume: what a PyTorch 1.13 checkpoint must hold for a resumed run to be the run that never
stopped, and what differs on a GPU.

  1. SGD with momentum: saving and loading the model's and the optimizer's state_dict between two
     steps gives the uninterrupted run's weights bit for bit; a fresh optimizer (the weights only)
     does not.
  2. DistributedSampler's order is a function of its seed and the epoch given to set_epoch, and
     of nothing else: a new sampler in a new process, told the epoch, serves the same order;
     one not told (epoch 0) serves epoch 0's; torch.manual_seed does not change it.
  3. Random numbers drawn during training (Dropout masks, random augmentation) come from the
     global generator: restoring torch.get_rng_state() gives the same masks, not restoring it
     gives others. So a model that draws them needs the RNG state in its checkpoint.
  4. On a GPU the same bits also need the same algorithms: torch.backends.cudnn.benchmark lets
     cuDNN choose its algorithm by timing in each process, and torch.use_deterministic_algorithms
     names CUBLAS_WORKSPACE_CONFIG as required for deterministic cuBLAS (read from PyTorch's
     source: this machine runs no CUDA).

Exit 0: PyTorch does this; 1: it does otherwise (printed); 77: no torch.
"""
import inspect
import io
import sys

import torchcheck  # exits 77 without torch
import torch
from torch import nn
from torch.utils.data import DistributedSampler
import torch.backends.cudnn as cudnn


def data():
    g = torch.Generator().manual_seed(5)
    return [(torch.randn(16, 8, generator=g), torch.randint(0, 3, (16,), generator=g)) for _ in range(6)]


def new_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 6), nn.BatchNorm1d(6), nn.ReLU(), nn.Linear(6, 3))


def train(model, opt, batches):
    for x, y in batches:
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()


def main():
    claims = torchcheck.Claims()
    claim = claims.check

    batches = data()
    full = new_model()
    opt = torch.optim.SGD(full.parameters(), lr=0.1, momentum=0.9)
    train(full, opt, batches)

    half = new_model()
    opt = torch.optim.SGD(half.parameters(), lr=0.1, momentum=0.9)
    train(half, opt, batches[:3])
    buf = io.BytesIO()
    torch.save({"model": half.state_dict(), "optim": opt.state_dict()}, buf)
    buf.seek(0)
    ckpt = torch.load(buf)
    resumed = new_model()
    resumed.load_state_dict(ckpt["model"])
    opt = torch.optim.SGD(resumed.parameters(), lr=0.1, momentum=0.9)
    opt.load_state_dict(ckpt["optim"])
    train(resumed, opt, batches[3:])
    claim(all(torch.equal(a, b) for a, b in zip(full.state_dict().values(), resumed.state_dict().values())),
          "model and optimizer state_dict restored: the uninterrupted run's parameters and buffers, bit for bit")
    weights_only = new_model()
    weights_only.load_state_dict(ckpt["model"])
    train(weights_only, torch.optim.SGD(weights_only.parameters(), lr=0.1, momentum=0.9), batches[3:])
    diff = max((a.float() - b.float()).abs().max().item()
               for a, b in zip(full.state_dict().values(), weights_only.state_dict().values()))
    claim(diff > 1e-3, f"the weights alone with a fresh optimizer: up to {diff:.3g} away")

    items = list(range(100))
    s = DistributedSampler(items, num_replicas=2, rank=1, shuffle=True, seed=0)
    s.set_epoch(1)
    epoch1 = list(s)
    torch.manual_seed(1234)
    again = DistributedSampler(items, num_replicas=2, rank=1, shuffle=True, seed=0)
    again.set_epoch(1)
    claim(list(again) == epoch1, "a new DistributedSampler told epoch 1 serves epoch 1's order (torch.manual_seed changes nothing)")
    fresh = DistributedSampler(items, num_replicas=2, rank=1, shuffle=True, seed=0)
    s.set_epoch(0)
    claim(list(fresh) == list(s) and list(fresh) != epoch1, "one not told the epoch serves epoch 0's order")

    drop = nn.Dropout(0.5)
    x = torch.ones(1000)
    torch.manual_seed(7)
    drop(x)
    state = torch.get_rng_state()
    mask = drop(x)
    torch.manual_seed(99)  # a restarted process: another generator state
    other = drop(x)
    torch.set_rng_state(state)
    claim(torch.equal(drop(x), mask) and not torch.equal(other, mask),
          "Dropout masks: the same after torch.set_rng_state(saved), others without it")

    cudnn_src = inspect.getsource(cudnn)
    claim("benchmark" in cudnn_src and "deterministic" in cudnn_src,
          "torch.backends.cudnn has the benchmark and deterministic flags (cuDNN's algorithm choice by timing)")
    doc = torch.use_deterministic_algorithms.__doc__ or ""
    claim("CUBLAS_WORKSPACE_CONFIG=:4096:8" in doc,
          "torch.use_deterministic_algorithms' documentation names CUBLAS_WORKSPACE_CONFIG for deterministic cuBLAS")
    return claims.finish()


if __name__ == "__main__":
    sys.exit(main())
