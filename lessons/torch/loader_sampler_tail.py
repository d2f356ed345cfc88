#!/usr/bin/env python3
"""last-batch: what PyTorch 1.13's DataLoader and DistributedSampler do with the tail of an epoch.

  1. DataLoader(batch_size=32) over 65 samples: batches of 32, 32 and 1 (drop_last=False, the
     default); drop_last=True: 32 and 32 (floor(65/32) batches); over 66 samples: 32, 32, 2.
  2. DistributedSampler(num_replicas=2, shuffle=False) over 65 samples pads by repeating from the
     head: 33 indices per rank, rank 1's last one is index 0 again.
  3. DistributedSampler(drop_last=True) cuts instead: 32 per rank over 65 samples (index 64 unused),
     and over 67 samples 33 per rank (cut to 66), which batches of 32 leave as 32 + 1.

Exit 0: PyTorch does this; 1: it does otherwise (printed); 77: no torch.
"""
import sys

import torchcheck  # exits 77 without torch
import torch
from torch.utils.data import DataLoader, DistributedSampler


def sizes(loader):
    return [len(b) for b in loader]


def main():
    claims = torchcheck.Claims()
    claim = claims.check

    data = list(range(65))
    got = sizes(DataLoader(data, batch_size=32))
    claim(got == [32, 32, 1], f"DataLoader(batch_size=32) over 65 samples: batches of {got}")
    got = sizes(DataLoader(data, batch_size=32, drop_last=True))
    claim(got == [32, 32], f"... with drop_last=True: {got}")
    got = sizes(DataLoader(list(range(66)), batch_size=32))
    claim(got == [32, 32, 2], f"... over 66 samples: {got}")

    ranks = [list(DistributedSampler(data, num_replicas=2, rank=r, shuffle=False)) for r in range(2)]
    claim([len(r) for r in ranks] == [33, 33] and ranks[1][-1] == 0 and sorted(ranks[0] + ranks[1]) == sorted(data + [0]),
          f"DistributedSampler pads 65 to 66 from the head: {len(ranks[0])} and {len(ranks[1])} per rank, "
          f"rank 1's last index {ranks[1][-1]}")
    for r in range(2):
        got = sizes(DataLoader(data, batch_size=32, sampler=DistributedSampler(data, num_replicas=2, rank=r, shuffle=False)))
        claim(got == [32, 1], f"rank {r}'s batches of 32 over its share: {got}")
    cut = [list(DistributedSampler(data, num_replicas=2, rank=r, shuffle=False, drop_last=True)) for r in range(2)]
    claim([len(r) for r in cut] == [32, 32] and 64 not in cut[0] + cut[1],
          f"DistributedSampler(drop_last=True) cuts 65 to 64: {len(cut[0])} per rank, index 64 unused")
    d67 = list(range(67))
    cut67 = [list(DistributedSampler(d67, num_replicas=2, rank=r, shuffle=False, drop_last=True)) for r in range(2)]
    got = sizes(DataLoader(d67, batch_size=32, sampler=DistributedSampler(d67, num_replicas=2, rank=1, shuffle=False,
                                                                          drop_last=True)))
    claim([len(r) for r in cut67] == [33, 33] and got == [32, 1],
          f"over 67 samples it cuts to 66: {len(cut67[0])} per rank, batches {got}")
    return claims.finish()


if __name__ == "__main__":
    sys.exit(main())
