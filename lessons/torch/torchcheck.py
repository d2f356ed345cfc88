"""What the lessons' torch checks share (lessons/README.md, "[[torch_check]]"): the exit codes, the
claims printed one by one, and ranks run as forked processes in one gloo process group.

A script imports it before torch:

    import torchcheck               # exits 77 ("python3-torch is not installed") without torch
    claims = torchcheck.Claims()
    claims.check(x == y, "what PyTorch does")
    sys.exit(claims.finish())       # 0: every claim holds; 1: some fail (each printed)
"""
import os
import sys
import tempfile

try:
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp
except ImportError:
    print("python3-torch is not installed")
    sys.exit(77)


class Claims:
    """The claims a script checks: each printed as it is decided ("- holds: ..." or "- FAILS: ...")."""

    def __init__(self):
        self.failed = []

    def check(self, ok, text):
        print(("- holds: " if ok else "- FAILS: ") + text)
        if not ok:
            self.failed.append(text)
        return ok

    def finish(self):
        """Prints the verdict; returns the script's exit code."""
        print(f"torch {torch.__version__}: " +
              ("every claim holds" if not self.failed else f"{len(self.failed)} claim(s) fail"))
        return 1 if self.failed else 0


def _rank_main(rank, world, worker, args, out_dir):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="file://" + os.path.join(out_dir, "init"), rank=rank,
                            world_size=world)
    result = worker(rank, *args)
    torch.save(result, os.path.join(out_dir, f"rank{rank}.pt"))
    dist.destroy_process_group()


def run_ranks(world, worker, *args):
    """Runs worker(rank, *args) in `world` processes joined in a gloo process group (one thread
    each); returns what each returned (saved with torch.save), by rank. The processes are forked:
    they have torch imported already (spawn would import it once more per rank)."""
    with tempfile.TemporaryDirectory() as d:
        mp.start_processes(_rank_main, args=(world, worker, args, d), nprocs=world, start_method="fork")
        return [torch.load(os.path.join(d, f"rank{r}.pt")) for r in range(world)]
