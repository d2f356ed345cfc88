"""PyTorch's side of tools/bench_train_vs_torch.sh: training throughput of dtlab's models
(tools/torch/dtlab_models.py) on the CPU, measured the way `dtlab bench train` measures dtlab
(commands/bench_train.h), so that the two figures compare:

  - a fixed random batch per rank: x (B, 1, 28, 28) uniform in [-1, 1] and labels in 0..9, from a
    torch.Generator seeded with the rank; the model after torch.manual_seed(0);
  - one step: zero_grad, forward, cross entropy, backward, SGD (lr 0.01, momentum 0.9);
  - 5 warm-up steps, then m steps per round with m from one timed step so that a round takes about
    --seconds; --rounds rounds; the median seconds per step;
  - --world-size N > 1: DistributedDataParallel over gloo, N processes of one thread each (every
    rank runs rank 0's m: the ranks must issue the same collectives), the slowest rank's median.

The last line printed is `samples_per_s <global samples per second>` (N x B / step time).

Usage (Debian's python3-torch):
  OPENBLAS_CORETYPE=SkylakeX OPENBLAS_NUM_THREADS=1 /usr/bin/python3 tools/peers/torch_train_peer.py \\
      --model cnn --batch-size 64 [--threads 1] [--world-size 1] [--seconds 0.3] [--rounds 7]
Debian's OpenBLAS 0.3.21 takes recent x86 CPUs for "Prescott" and runs about 5x slower: set
OPENBLAS_CORETYPE (SkylakeX with AVX-512, Haswell with AVX2) as tools/bench_train_vs_torch.sh does.
Exit codes: 0, 2 bad arguments, 77 python3-torch is not installed.
"""
import argparse
import os
import socket
import statistics
import sys
import time

try:
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp
    from torch import nn
except ImportError as e:
    print(f"torch_train_peer: python3-torch is not installed ({e}); apt-get install python3-torch")
    sys.exit(77)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "torch"))
from dtlab_models import MODELS  # noqa: E402

WARMUP_STEPS = 5


def median_step_seconds(step, seconds, rounds, same_count=None):
    """Median seconds per step. same_count(m) gives every rank rank 0's m (DDP)."""
    for _ in range(WARMUP_STEPS):
        step()
    t0 = time.perf_counter()
    step()
    m = max(1, int(seconds / max(time.perf_counter() - t0, 1e-6)))
    if same_count is not None:
        m = same_count(m)
    per_step = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(m):
            step()
        per_step.append((time.perf_counter() - t0) / m)
    return statistics.median(per_step)


def training_step(model, batch_size, rank):
    """One SGD step on this rank's fixed batch."""
    g = torch.Generator().manual_seed(rank)
    x = torch.empty(batch_size, 1, 28, 28).uniform_(-1.0, 1.0, generator=g)
    y = torch.randint(0, 10, (batch_size,), generator=g)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()

    def step():
        opt.zero_grad(set_to_none=True)
        loss_fn(model(x), y).backward()
        opt.step()
    return step


def ddp_rank(rank, a, port, results):
    """One process of the DDP run: puts the slowest rank's median step time (rank 0)."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=a.world_size)
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(MODELS[a.model]())

    def same_count(m):
        t = torch.tensor([m])
        dist.broadcast(t, 0)
        return int(t.item())
    t = torch.tensor([median_step_seconds(training_step(model, a.batch_size, rank), a.seconds, a.rounds,
                                          same_count)])
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    if rank == 0:
        results.put(t.item())
    dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", choices=sorted(MODELS), default="cnn")
    p.add_argument("--batch-size", type=int, default=64, help="per rank")
    p.add_argument("--threads", type=int, default=1, help="one process (with --world-size N: 1 per rank)")
    p.add_argument("--world-size", type=int, default=1)
    p.add_argument("--seconds", type=float, default=0.3, help="length of a timed round")
    p.add_argument("--rounds", type=int, default=7)
    a = p.parse_args()
    for flag, v in (("--batch-size", a.batch_size), ("--threads", a.threads), ("--world-size", a.world_size),
                    ("--rounds", a.rounds)):
        if v < 1:
            p.error(f"{flag} {v}: must be at least 1")
    if a.seconds <= 0:
        p.error(f"--seconds {a.seconds}: must be positive")
    threads = a.threads if a.world_size == 1 else 1
    print(f"# torch {torch.__version__} model={a.model} batch_size={a.batch_size} world_size={a.world_size} "
          f"threads={threads} OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS', 'unset')} "
          f"OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE', 'unset')}", flush=True)
    if a.world_size == 1:
        torch.set_num_threads(threads)
        torch.manual_seed(0)
        t = median_step_seconds(training_step(MODELS[a.model](), a.batch_size, 0), a.seconds, a.rounds)
    else:
        results = mp.get_context("spawn").SimpleQueue()
        mp.spawn(ddp_rank, args=(a, free_port(), results), nprocs=a.world_size)
        t = results.get()
    print(f"step_ms {t * 1e3:.3f}")
    print(f"samples_per_s {a.world_size * a.batch_size / t:.1f}")


if __name__ == "__main__":
    main()
