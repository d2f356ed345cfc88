# reproducibility: "DistributedSampler's shuffle is seeded by its own seed= argument (and the
# epoch, set_epoch), not by torch.manual_seed". Exit 0 when PyTorch does that, 1 when not, 77
# without torch.
import sys

try:
    import torch
    from torch.utils.data.distributed import DistributedSampler
except ImportError as e:
    print(f"no python3-torch here ({e})")
    sys.exit(77)


def order(manual_seed, seed, epoch=0):
    torch.manual_seed(manual_seed)
    s = DistributedSampler(list(range(64)), num_replicas=4, rank=0, shuffle=True, seed=seed)
    s.set_epoch(epoch)
    return list(s)


base = order(manual_seed=0, seed=0)
same_under_other_manual_seed = order(manual_seed=123, seed=0) == base
other_seed_differs = order(manual_seed=0, seed=1) != base
other_epoch_differs = order(manual_seed=0, seed=0, epoch=1) != base
print(f"torch {torch.__version__}: rank 0's first indices {base[:6]}")
print(f"  torch.manual_seed(123) instead of 0 changes the order: {not same_under_other_manual_seed}")
print(f"  seed=1 instead of 0 changes it: {other_seed_differs}; set_epoch(1) changes it: {other_epoch_differs}")
sys.exit(0 if same_under_other_manual_seed and other_seed_differs and other_epoch_differs else 1)
