#!/usr/bin/env python3
"""last-batch, eval-mode: when PyTorch 1.13's BatchNorm refuses a batch, and why.

  1. The refusal is an explicit size check before anything is computed:
     torch.nn.functional.batch_norm calls _verify_batch_size(input.size()) when training, which
     raises "Expected more than 1 value per channel when training" when N x H x W (the values per
     channel: size[0] times size[2:]) is 1.
  2. So a batch of one sample fails only where a channel then has one value: BatchNorm1d on (1, C)
     and BatchNorm2d on (1, C, 1, 1) fail; BatchNorm2d on (1, C, 2, 2) and BatchNorm1d on (1, C, 3)
     train (the running statistics move).
  3. One value does have a variance, 0: computed without the check (torch.batch_norm), the output
     is the bias alone whatever the input, and the unbiased variance that running_var takes is
     0 / 0, NaN.
  4. In eval mode a batch of one is normalized with the running statistics; with
     track_running_stats=False eval mode uses the batch's statistics and fails with the same
     train-mode message.
  5. SyncBatchNorm refuses one value per channel only in a world of one process: its forward
     raises when size == 1 and world_size < 2 (torch/nn/modules/_functions.py), so with 2 ranks
     it normalizes over the global count.

Exit 0: PyTorch does this; 1: it does otherwise (printed); 77: no torch.
"""
import inspect
import sys

import torchcheck  # exits 77 without torch
import torch
from torch import nn
from torch.nn import functional as F
from torch.nn.modules import _functions

MESSAGE = "Expected more than 1 value per channel when training"


def refusal(module, shape):
    """The error text a forward of a random input of `shape` raises, or None when it trains."""
    try:
        module(torch.randn(*shape))
        return None
    except ValueError as e:
        return str(e)


def main():
    claims = torchcheck.Claims()
    claim = claims.check

    torch.manual_seed(0)
    verify = inspect.getsource(F._verify_batch_size)
    claim("size_prods == 1" in verify and "size[i + 2]" in verify and MESSAGE in verify,
          "F._verify_batch_size raises when size[0] x size[2:] (the values per channel) is 1")
    claim("_verify_batch_size(input.size())" in inspect.getsource(F.batch_norm),
          "F.batch_norm calls it when training, before torch.batch_norm computes anything")

    e = refusal(nn.BatchNorm1d(4), (1, 4))
    claim(e is not None and e.startswith(MESSAGE) and "torch.Size([1, 4])" in e,
          f"BatchNorm1d on (1, 4) in train mode: {e!r}")
    e = refusal(nn.BatchNorm2d(4), (1, 4, 1, 1))
    claim(e is not None and e.startswith(MESSAGE), f"BatchNorm2d on (1, 4, 1, 1): {e!r}")
    bn2 = nn.BatchNorm2d(4)
    e = refusal(bn2, (1, 4, 2, 2))
    claim(e is None and not torch.equal(bn2.running_var, torch.ones(4)),
          "BatchNorm2d on one image of 2 x 2 (1, 4, 2, 2) trains: 4 values per channel, running_var moves")
    e = refusal(nn.BatchNorm1d(4), (1, 4, 3))
    claim(e is None, "BatchNorm1d on (1, 4, 3) trains: one sample, 3 values per channel")

    x = torch.randn(1, 4)
    weight, bias = torch.rand(4) + 0.5, torch.randn(4)
    rm, rv = torch.zeros(4), torch.ones(4)
    y = torch.batch_norm(x, weight, bias, rm, rv, True, 0.1, 1e-5, False)
    off = (y - bias.view(1, 4)).abs().max().item()
    claim(off < 1e-3,
          "without the check, one value per channel normalizes to 0 (its biased variance is 0): the output is the bias "
          f"alone, whatever the input (to the rounding of x / sqrt(eps): {off:.1g})")
    claim(bool(torch.isnan(rv).all()), "... and running_var, which takes the unbiased variance 0 / (1 - 1), becomes NaN")

    bn = nn.BatchNorm1d(4)
    bn(torch.randn(8, 4))
    bn.eval()
    claim(refusal(bn, (1, 4)) is None, "in eval mode BatchNorm1d normalizes a batch of one with its running statistics")
    e = refusal(nn.BatchNorm1d(4, track_running_stats=False).eval(), (1, 4))
    claim(e is not None and e.startswith(MESSAGE),
          f"with track_running_stats=False eval mode uses the batch's statistics and refuses one value: {e!r}")

    sync = inspect.getsource(_functions.SyncBatchNorm.forward)
    claim("if size == 1 and world_size < 2:" in sync,
          "SyncBatchNorm's forward refuses one value per channel only when world_size < 2")
    return claims.finish()


if __name__ == "__main__":
    sys.exit(main())
