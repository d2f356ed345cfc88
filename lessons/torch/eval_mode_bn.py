#!/usr/bin/env python3
"""eval-mode: what model.eval() and model.train() change for PyTorch 1.13's BatchNorm.

  1. In eval mode BatchNorm1d normalizes with running_mean and running_var: an image's output
     alone and in a batch of 1000 agree to float32 rounding.
  2. In train mode it normalizes with the batch's statistics: the same image's output in a batch
     of 2 and in a batch of 1000 differ, and over two values per channel the normalized values
     are about -1 and +1 (the biased variance of a and b is (a - b)^2 / 4).
  3. _BatchNorm.forward uses batch statistics when self.training, or when there are no running
     statistics (track_running_stats=False): bn_training = running_mean is None and running_var
     is None. So an untracked layer's eval mode is a tracked layer's train mode, bit for bit.
  4. The running statistics never enter a train-mode forward or its gradients: a tracked and an
     untracked layer with the same weights give the same output and the same weight gradients.
  5. A train-mode forward updates running_mean and running_var even under torch.no_grad():
     evaluating in train mode by mistake changes the model's buffers.
  6. model.eval() also makes Dropout the identity.

Exit 0: PyTorch does this; 1: it does otherwise (printed); 77: no torch.
"""
import inspect
import sys

import torchcheck  # exits 77 without torch
import torch
from torch import nn
from torch.nn.modules import batchnorm


def model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(20, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 10))


def main():
    claims = torchcheck.Claims()
    claim = claims.check

    m = model()
    torch.manual_seed(1)
    with torch.no_grad():
        for _ in range(20):  # train-mode forwards move the running statistics away from 0 and 1
            m(torch.randn(32, 20) * 2 + 1)
    test = torch.randn(1000, 20) * 2 + 1

    m.eval()
    with torch.no_grad():
        alone, batched = m(test[:1]), m(test)[:1]
    diff = (alone - batched).abs().max().item()
    claim(diff < 1e-5, f"eval mode: image 0 alone and in a batch of 1000 agree to rounding ({diff:.1g})")

    m.train()
    with torch.no_grad():
        pair, big = m(test[:2])[:1], m(test)[:1]
    diff = (pair - big).abs().max().item()
    claim(diff > 1e-2, f"train mode: image 0 in a batch of 2 and in a batch of 1000 differ ({diff:.3f})")
    bn = nn.BatchNorm1d(16, affine=False)
    z = bn(torch.randn(2, 16) * 5 + 3)
    claim(torch.allclose(z.abs(), torch.ones(2, 16), atol=1e-3) and torch.equal(z[0].sign(), -z[1].sign()),
          "train mode over two values per channel: the normalized values are about -1 and +1 whatever they were")

    src = inspect.getsource(batchnorm._BatchNorm.forward)
    claim("bn_training = (self.running_mean is None) and (self.running_var is None)" in src,
          "_BatchNorm.forward in eval mode uses batch statistics when it has no running statistics")
    tracked = nn.BatchNorm1d(16)
    untracked = nn.BatchNorm1d(16, track_running_stats=False)
    with torch.no_grad():
        for layer in (tracked, untracked):
            layer.weight.copy_(torch.linspace(0.5, 2, 16))
            layer.bias.copy_(torch.linspace(-1, 1, 16))
    x = torch.randn(8, 16)
    untracked.eval()
    tracked.train()
    y_u, y_t = untracked(x), tracked(x)
    claim(torch.equal(y_u, y_t), "an untracked layer's eval mode is a tracked layer's train mode, bit for bit")
    untracked.train()
    y_u = untracked(x)
    (y_u * torch.arange(16.0)).sum().backward()
    (tracked(x) * torch.arange(16.0)).sum().backward()
    claim(torch.equal(tracked.weight.grad, untracked.weight.grad) and torch.equal(tracked.bias.grad, untracked.bias.grad),
          "running statistics never enter training: tracked and untracked layers have the same gradients")

    bn = nn.BatchNorm1d(16)
    with torch.no_grad():
        bn(torch.randn(8, 16) + 3)
    claim(not torch.equal(bn.running_mean, torch.zeros(16)) and bn.num_batches_tracked.item() == 1,
          "a train-mode forward under torch.no_grad() still updates running_mean and num_batches_tracked")

    drop = nn.Dropout(0.5).eval()
    x = torch.randn(100)
    claim(torch.equal(drop(x), x), "in eval mode Dropout is the identity")
    return claims.finish()


if __name__ == "__main__":
    sys.exit(main())
