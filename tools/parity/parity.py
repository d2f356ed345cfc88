"""Parity harness: the same experiment in dtlab and in PyTorch, compared step by step.

For every case it runs `dtlab run ... --out DIR` on the first samples of Fashion-MNIST, loads
DIR/init.safetensors into PyTorch's reference model (tools/torch/dtlab_models.py), trains it the
way a PyTorch user does with the same data order and hyper-parameters, and compares:
  - the loss of every rank at every step (metrics.jsonl);
  - at the end, every parameter and buffer of every rank (running statistics and
    num_batches_tracked included), rebuilt from the run directory: final.safetensors is rank 0;
    rank R's buffers are final.rank<R>.buffers.safetensors where dtlab wrote one (it does when
    they differ from rank 0's), and in local SGD its parameters final.rank<R>.safetensors
    likewise. Under DDP every rank applies the same allreduced gradients, so dtlab keeps rank 0's
    parameters only; tests/test_parity.cpp compares every replica's own parameters in-process.

How PyTorch runs each kind of case:
  one process  the plain model; DistributedSampler(num_replicas=1, rank=0) gives dtlab's order.
  ddp          DistributedDataParallel over gloo, one process per rank (mp.spawn); local
               BatchNorm; DistributedSampler with set_epoch; DataLoader(drop_last); SGD; after
               every epoch (also the last, partial one) an evaluation forward of the DDP model
               under torch.no_grad() on the rank's contiguous shard of the test set, as dtlab does:
               with broadcast_buffers it copies rank 0's buffers to every rank.
  local-sgd    the same DDP with the post_localSGD_hook (post_local_gradient_allreduce=False)
               and PeriodicModelAverager(period, warmup_steps) after every optimizer step.
  zero         the same DDP with torch.distributed.optim.ZeroRedundancyOptimizer around the case's
               optimizer (parameters_as_bucket_view as the case says); its partition (the
               parameters each rank owns, by name, in assignment order) is compared with the
               partition in dtlab's summary.json too.
  sync         PyTorch 1.13 runs SyncBatchNorm only on GPUs ("SyncBatchNorm expected input tensor
               to be on GPU"; DDP: "SyncBatchNorm layers only work with GPU modules"), so N
               ranks with SyncBatchNorm are compared with their exact equivalent: one process
               training on the global batch (rank 0's batch k, then rank 1's, ... concatenated)
               with plain BatchNorm. The loss of rank r is the cross entropy over its rows of
               that forward.
  dp           nn.DataParallel runs its devices only on CUDA; on a CPU it calls the module
               directly. Its k devices are emulated as tools/fixtures/gen_dp.py does (torch.chunk
               scatter, one replica per chunk, replica 0's buffers survive, gradients summed in
               device order), on DataLoader(shuffle, generator=manual_seed(seed)) batches.
  pipeline     torch.distributed.pipeline.sync.Pipe in one process (init_rpc("worker", rank=0,
               world_size=1)): the model loaded from init.safetensors, cut into nn.Sequential
               stages by `balance` (all on the CPU), Pipe(chunks=M, checkpoint="never",
               deferred_batch_norm as the case says); the one-process data order, and per step one
               CrossEntropyLoss over Pipe's concatenated output (pipe(x).local_value()), backward,
               optimizer.step(). dtlab's loss is its last stage's (rank P-1; the other ranks write
               none) and final.safetensors the whole model. GPipe and 1F1B give bitwise the same
               weights in dtlab (it sums each parameter's micro-batch gradients in reverse
               micro-batch order under either schedule), so a 1F1B case is compared with the same
               Pipe. The case's balance, chunks, schedule and deferred_batch_norm are also
               compared with those dtlab ran (config.toml), its automatic balance where the case
               passes no --balance.

Usage (Debian's python3-torch):
  /usr/bin/python3 tools/parity/parity.py                   # every case; exit 0 when all pass
  /usr/bin/python3 tools/parity/parity.py --cases mlp_1p,cnn_w2_sync --keep runs/parity
  /usr/bin/python3 tools/parity/parity.py --write-fixtures  # also store PyTorch's side for the tests
  /usr/bin/python3 tools/parity/parity.py --float64         # also PyTorch in float64: the noise floor
Exit codes: 0 every case passed, 1 a case failed, 2 bad arguments or dtlab failed, 77 skipped
(python3-torch or the dataset missing). DTLAB_DATA_DIR overrides the dataset directory.

Sections: 1. cases  2. tolerances  3. the dtlab side  4. the PyTorch side  5. comparison
6. fixtures  7. main
"""
import argparse
import dataclasses
import datetime
import json
import math
import os
import pickle
import shutil
import socket
import subprocess
import sys
import tempfile
import time


def _openblas_env():
    # Debian's OpenBLAS 0.3.21 misdetects recent x86 CPUs as "Prescott" and runs about 5x slower.
    # Where the CPU has AVX2 and FMA, ask for the Haswell kernels (dtlab and PyTorch both link
    # OpenBLAS; the environment reaches the dtlab processes and the spawned ranks). One BLAS
    # thread per process: ranks are processes (PyTorch) or threads (dtlab) of their own.
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    if "OPENBLAS_CORETYPE" in os.environ:
        return
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line.split() for line in f if line.startswith("flags")), [])
    except OSError:
        return
    if "avx2" in flags and "fma" in flags:
        os.environ["OPENBLAS_CORETYPE"] = "Haswell"


_openblas_env()
# PyTorch's RPC agent (Pipe needs one) logs INFO lines through glog ("RPC agent for worker is shutting
# down"); glog reads its level when torch is imported. Warnings and errors still show.
os.environ.setdefault("GLOG_minloglevel", "1")

try:
    import numpy as np
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp
    from torch.utils.data import DataLoader, TensorDataset
    from torch.utils.data.distributed import DistributedSampler
except ImportError as e:
    print(f"parity: skipped, python3-torch is not installed ({e}); apt-get install python3-torch")
    sys.exit(77)

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tools", "fixtures"))
sys.path.insert(0, os.path.join(ROOT, "tools", "torch"))
import common  # noqa: E402  (the dataset exactly as dtlab normalizes it; the reference models)
import dtlab_safetensors  # noqa: E402
import gen_dp  # noqa: E402  (DataParallel's steps on k emulated devices)

FIXTURE_DIR = os.path.join(ROOT, "tests", "fixtures", "parity")
FIXTURE_FORMAT = 1

# ---- 1. cases ----

LR, MOMENTUM, WEIGHT_DECAY = 0.05, 0.9, 1e-4


@dataclasses.dataclass
class Case:
    name: str
    what: str
    model: str
    world: int = 1               # ranks (dp: devices)
    batch: int = 32              # per rank (dp: the global batch)
    limit_train: int = 1000
    limit_test: int = 100
    steps: int = 20
    mode: str = "ddp"            # ddp | dp | local-sgd | zero | pipeline
    bn: str = "local"            # local | sync
    shuffle: bool = True
    drop_last: bool = False      # DataLoader drop_last
    sampler_drop_last: bool = False
    broadcast_buffers: bool = True
    average_every: int = 4       # local-sgd
    warmup_steps: int = 0        # local-sgd
    seed: int = 0
    lr: float = LR
    optimizer: str = "sgd"       # sgd | adam | adamw
    bucket_view: bool = False    # zero: ZeroRedundancyOptimizer(parameters_as_bucket_view=True)
    batchnorm: bool = True       # False: --no-batchnorm (the model without its BatchNorm layers)
    # pipeline: world stays 1 (one data replica, the Pipe); its ranks are the stages
    stages: int = 0              # --stages P
    microbatches: int = 4        # --microbatches M: Pipe's chunks
    schedule: str = "gpipe"      # gpipe | 1f1b
    balance: str = ""            # modules per stage, the split PyTorch's stages use
    auto_balance: bool = True    # True: dtlab chooses (and must choose `balance`); False: --balance
    deferred_bn: bool = False    # --deferred-batch-norm: Pipe(deferred_batch_norm=True)

    @property
    def kind(self):
        if self.mode in ("dp", "pipeline"):
            return self.mode
        if self.bn == "sync":
            return "sync"
        return "single" if self.world == 1 else "ddp"

    def dtlab_args(self):
        ranks = ["--stages", str(self.stages)] if self.mode == "pipeline" else ["--world-size", str(self.world)]
        a = ["--model", self.model, *ranks, "--batch-size", str(self.batch),
             "--limit-train", str(self.limit_train), "--limit-test", str(self.limit_test),
             "--steps", str(self.steps), "--mode", self.mode, "--bn", self.bn,
             "--lr", repr(self.lr), "--weight-decay", repr(WEIGHT_DECAY),
             "--seed", str(self.seed), "--threads", "1"]
        a += ["--momentum", repr(MOMENTUM)] if self.optimizer == "sgd" else ["--optimizer", self.optimizer]
        if not self.shuffle:
            a.append("--no-shuffle")
        if self.drop_last:
            a.append("--drop-last")
        if self.sampler_drop_last:
            a.append("--sampler-drop-last")
        if not self.broadcast_buffers:
            a.append("--no-broadcast-buffers")
        if self.mode == "local-sgd":
            a += ["--average-every", str(self.average_every), "--warmup-steps", str(self.warmup_steps)]
        if self.bucket_view:
            a.append("--parameters-as-bucket-view")
        if not self.batchnorm:
            a.append("--no-batchnorm")
        if self.mode == "pipeline":
            a += ["--microbatches", str(self.microbatches), "--schedule", self.schedule]
            if not self.auto_balance:
                a += ["--balance", self.balance]
            if self.deferred_bn:
                a.append("--deferred-batch-norm")
        return a


# The mlp trains at dtlab's default lr 0.05; the cnn at 0.01. At 0.05 the cnn's first steps are
# chaotic: its loss climbs from 2.38 to 3.64 by step 7 and any rounding difference grows about
# tenfold per step (measured with --float64: after 12 steps PyTorch float32 and PyTorch float64
# part by 1.4e-2 in the loss, dtlab and PyTorch float32 by 4e-4), so no comparison of two float32
# programs can be tight there. At 0.01 PyTorch's own float32 error stays below 1e-4.
# Per-rank batches stay at 4 samples or more for the mlp: BatchNorm1d over a batch of two divides
# by the spread of two values and amplifies float32 rounding by orders of magnitude (see
# tests/test_ddp.cpp); BatchNorm2d normalizes over N x 28 x 28 values and has no such problem.
CNN_LR = 0.01
CASES = [
    # one process
    Case("mlp_1p", "mlp, 1 process, batch 64; short last batch (40), 2 epochs", "mlp", 1, 64, 1000, steps=20),
    Case("cnn_1p", "cnn, 1 process, batch 32; short last batch (12), 2 epochs", "cnn", 1, 32, 300, steps=12,
         lr=CNN_LR),
    # DDP, local BatchNorm
    Case("mlp_w2_bcast", "DDP 2 ranks x 32, broadcast_buffers, shuffle; short last batch (20)", "mlp", 2, 32, 1000,
         steps=20),
    Case("mlp_w2_nobcast_noshuffle", "DDP 2 ranks x 32, no broadcast, no shuffle; short last (20)", "mlp", 2, 32,
         1000, steps=20, shuffle=False, broadcast_buffers=False),
    Case("mlp_w4_bcast_droplast", "DDP 4 ranks x 16, broadcast, both drop_last (602 -> 600 -> 4x144)", "mlp", 4,
         16, 602, steps=12, drop_last=True, sampler_drop_last=True, seed=3),
    Case("mlp_w4_nobcast_pad", "DDP 4 ranks x 16, no broadcast, padding (2); short last (11)", "mlp", 4, 16, 618,
         steps=12, broadcast_buffers=False),
    Case("cnn_w2_bcast_noshuffle", "DDP 2 ranks x 16, broadcast, no shuffle; short last (4)", "cnn", 2, 16, 200,
         steps=9, shuffle=False, lr=CNN_LR),
    Case("cnn_w4_nobcast_droplast", "DDP 4 ranks x 8, no broadcast, drop_last; padding (2)", "cnn", 4, 8, 150,
         steps=6, drop_last=True, lr=CNN_LR),
    # SyncBatchNorm = one process on the global batch
    Case("mlp_w4_sync", "SyncBN 4 ranks x 16 = 1 process x 64; padding (2), short last (4x11)", "mlp", 4, 16, 618,
         steps=12, bn="sync"),
    Case("cnn_w2_sync", "SyncBN 2 ranks x 16 = 1 process x 32; short last (2x4)", "cnn", 2, 16, 200, steps=9,
         bn="sync", lr=CNN_LR),
    # DataParallel (emulated devices)
    Case("mlp_dp4", "DataParallel 4 devices, batch 64 (chunks 4x16; last 4x10)", "mlp", 4, 64, 1000, steps=20,
         mode="dp"),
    Case("cnn_dp3", "DataParallel 3 devices, batch 30 (chunks 3x10; last 7,7,6)", "cnn", 3, 30, 200, steps=8,
         mode="dp", seed=1, lr=CNN_LR),
    # local SGD = post-localSGD hook + PeriodicModelAverager
    Case("mlp_w2_localsgd", "local SGD 2 ranks x 32, warmup 3, every 4; ends between averagings", "mlp", 2, 32,
         1000, steps=18, mode="local-sgd", average_every=4, warmup_steps=3),
    Case("cnn_w2_localsgd_nobcast", "local SGD 2 ranks x 16, warmup 1, every 3, no broadcast", "cnn", 2, 16, 200,
         steps=9, mode="local-sgd", average_every=3, warmup_steps=1, broadcast_buffers=False, lr=CNN_LR),
    # Adam and AdamW (torch.optim's defaults but lr and weight_decay) under DDP. The cnn only: the
    # mlp's Linear biases feed BatchNorm, which subtracts them again, so their gradient is zero but
    # for rounding (5.8e-9 in float32 at the first step, 3e-17 in float64); Adam divides
    # that noise by its own size and moves each bias by up to lr per step, so two float32 programs
    # part on those biases from the first step (PyTorch float32 against float64 too). The cnn's
    # convolutions have no bias.
    Case("cnn_w2_adam", "DDP 2 ranks x 16 with Adam (lr 1e-3), broadcast, shuffle; short last (4)", "cnn", 2, 16, 200,
         steps=9, optimizer="adam", lr=1e-3),
    Case("cnn_w2_adamw", "DDP 2 ranks x 16 with AdamW (lr 1e-3), no broadcast; short last (4)", "cnn", 2, 16, 200,
         steps=9, broadcast_buffers=False, optimizer="adamw", lr=1e-3),
    # DDP + ZeroRedundancyOptimizer (ZeRO-1): SGD with momentum on the mlp, Adam on the cnn (see
    # above), per parameter and with parameters_as_bucket_view, on 2, 3 and 4 ranks
    Case("mlp_w2_zero", "ZeRO-1 2 ranks x 32, SGD momentum; partition 200704 / 35210", "mlp", 2, 32, 1000, steps=20,
         mode="zero"),
    Case("mlp_w3_zero_bucket", "ZeRO-1 3 ranks x 16, SGD momentum, bucket view; padding (2)", "mlp", 3, 16, 598,
         steps=14, mode="zero", bucket_view=True),
    Case("cnn_w3_zero_adam", "ZeRO-1 3 ranks x 8 with Adam (lr 1e-3); padding (1)", "cnn", 3, 8, 200, steps=9,
         mode="zero", optimizer="adam", lr=1e-3, seed=1),
    Case("cnn_w4_zero_adam_bucket", "ZeRO-1 4 ranks x 8 with Adam (lr 1e-3), bucket view, no broadcast", "cnn", 4, 8,
         150, steps=6, mode="zero", optimizer="adam", lr=1e-3, bucket_view=True, broadcast_buffers=False),
    # Pipeline parallelism = Pipe over P stages (one process, no data parallelism: world 1). The
    # balance is dtlab's automatic one, checked against the case's, unless auto_balance=False.
    # Deferred BatchNorm only on the cnn: Pipe's DeferredBatchNorm refuses BatchNorm1d's 2D input.
    Case("mlp_p3_m4_gpipe", "Pipe 3 stages (4,3,1), GPipe, batch 64 in 4 micro-batches; last 40 (4x10)", "mlp",
         batch=64, limit_train=1000, steps=20, mode="pipeline", stages=3, balance="4,3,1"),
    Case("mlp_p3_m4_1f1b", "Pipe 3 stages (4,3,1), 1F1B: the same Pipe as mlp_p3_m4_gpipe", "mlp",
         batch=64, limit_train=1000, steps=20, mode="pipeline", stages=3, balance="4,3,1", schedule="1f1b"),
    Case("mlp_p3_m3_b50", "Pipe 3 stages, 1F1B, batch 50 in 3 (17,17,16); last 20 (7,7,6); 2 epochs", "mlp",
         batch=50, limit_train=970, steps=24, mode="pipeline", stages=3, microbatches=3, balance="4,3,1",
         schedule="1f1b", seed=2),
    Case("mlp_p3_m4_nobn", "Pipe 3 stages (3,2,1), --no-batchnorm, batch 64 in 4; last 40", "mlp",
         batch=64, limit_train=1000, steps=20, mode="pipeline", stages=3, balance="3,2,1", batchnorm=False),
    Case("cnn_p4_m4_gpipe", "Pipe 4 stages (4,5,2,1), GPipe, batch 32 in 4; last 12 (4x3); 2 epochs", "cnn",
         batch=32, limit_train=300, steps=12, mode="pipeline", stages=4, balance="4,5,2,1", lr=CNN_LR),
    Case("cnn_p2_m4_deferred", "Pipe 2 stages (9,3), deferred BatchNorm, 1F1B, batch 32 in 4; 2 epochs", "cnn",
         batch=32, limit_train=256, steps=12, mode="pipeline", stages=2, balance="9,3", deferred_bn=True,
         schedule="1f1b", lr=CNN_LR, seed=1),
    Case("cnn_p2_m4_deferred_short", "Pipe --balance 2,10, deferred BN, batch 32 in 4; last 2 (2 chunks): carried",
         "cnn", batch=32, limit_train=258, steps=15, mode="pipeline", stages=2, balance="2,10", auto_balance=False,
         deferred_bn=True, lr=CNN_LR),
]

# ---- 2. tolerances ----
#
# A value passes when |dtlab - torch| <= atol + rtol * |torch|. Both sides compute in float32 with
# the same formulas and different summation orders (sgemm blocking, BatchNorm's reductions,
# dtlab's ring allreduce vs gloo's, DataParallel's reduce_add), so the first step agrees to a few
# ulp and SGD with momentum carries every difference on. Two effects set the tolerances:
#  - rounding: apart from the next effect the 14 cases agree to within 5e-7 in every loss, 4e-7 in
#    every parameter and 9e-6 in every buffer (running_var reaches ~10: 1e-6 relative);
#  - near-ties decided by rounding: when the two largest inputs of a maxpool window are within
#    rounding of each other, or a ReLU input within rounding of zero, the two programs can send
#    a gradient down different paths, and the weights differ by 1e-5 to 2e-4 from then on. It
#    happens in either program (`--float64` shows PyTorch float32 far from float64 in some cases
#    and dtlab in others) and which case gets one changes with OpenBLAS's kernels. Traced by
#    replaying runs in PyTorch float64 with one decision reversed:
#      cnn_w2_localsgd_nobcast (Haswell kernels; the largest differences seen: 1.6e-4 in a loss,
#      1.9e-4 in a parameter, 2.5e-4 in a buffer): at step 6 on rank 0 a window of the second
#      maxpool whose two largest inputs differ by 2.3e-6 relative; routing its gradient to the
#      runner-up changes the conv weights by 4.72e-4, against dtlab's 4.73e-4 (cosine 0.9991);
#      mlp_w2_localsgd (SkylakeX kernels for dtlab: 2.3e-5 in 1.weight row 99 and 2.bias[99]): at
#      step 17 on rank 0 one ReLU input of unit 99 at 6e-8 of its layer's largest; pushing it
#      across zero reproduces dtlab's difference exactly (cosine 1.0000).
#  The 7 pipeline cases (Haswell kernels) agree to within 5e-7 in every loss, 1.5e-6 in every
#  parameter and 8e-6 in every buffer, but for one near-tie of the second kind:
#      cnn_p2_m4_deferred (3.5e-6 in a loss, 9.6e-5 in 0.weight, 5.0e-5 in 5.running_mean): at step
#      8, micro-batch 1, the first ReLU's input at (2, 1, 4, 13) is -1.7e-6 in PyTorch float32 and
#      +2.2e-6 in float64 (its layer's largest: 7.2), and the maxpool window above it is all zeros
#      in float32; dtlab stays within 5e-7 of float64 at every step while PyTorch float32 parts
#      from it there. Setting that input to +2.2e-6 in PyTorch float32 brings the case to 4e-7 in
#      the loss, 6e-7 in the parameters and 5e-7 in the buffers.
# The tolerances sit at 3-5 times the largest difference seen. A wrong semantic fails them by far:
# a wrong sample order or seed moves losses by 0.3 and more; a BatchNorm momentum of 0.11 instead
# of 0.1 moves running statistics by 3e-2; buffers that missed (or got) DDP's broadcast differ by
# 7e-2 and more; a local SGD period off by one moves losses by 0.2 (all measured by mutating one
# side of this harness). Pipe: committing the short mini-batch's deferred sums instead of carrying
# them into the next mini-batch moves buffers by 2.3e-2 (cnn_p2_m4_deferred_short); BatchNorm per
# micro-batch instead of deferred, by 0.23 to 0.28; another chunk count moves losses by 0.04 to 0.18.
# Below the tolerance: DeferredBatchNorm's commit with the unbiased variance instead of the biased
# one moves buffers by only 5e-5 (cnn_p2_m4_deferred_short) and 1e-4 (cnn_p2_m4_deferred): n/(n-1)
# with n = 6,272 to 25,088 values per channel and commit. dtlab's 2.4e-7 there shows the biased one.
TOLERANCES = {
    "loss": {"atol": 5e-4, "rtol": 0.0},      # per step and rank; losses are 0.2-2.5
    "param": {"atol": 1e-3, "rtol": 1e-3},    # every element of every parameter
    "buffer": {"atol": 1e-3, "rtol": 1e-3},   # running_mean, running_var: every element
    # num_batches_tracked: an integer, exact
}


def within(d, ref, tol):
    return d <= tol["atol"] + tol["rtol"] * abs(ref)


# ---- 3. the dtlab side ----

def die(message):
    """dtlab failed or wrote something unreadable: exit 2, not the 1 of a failed comparison."""
    print(f"parity: {message}", file=sys.stderr)
    sys.exit(2)


def run_dtlab(dtlab, case, out, data_dir, timeout):
    if os.path.exists(out):
        shutil.rmtree(out)
    cmd = [dtlab, "run", *case.dtlab_args(), "--data-dir", data_dir, "--out", out, "--timeout", "60"]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        die(f"{case.name}: dtlab did not finish within {timeout} s (--timeout): {' '.join(cmd)}")
    if r.returncode != 0:
        sys.stderr.write(r.stdout + r.stderr)
        die(f"{case.name}: dtlab exited with {r.returncode}: {' '.join(cmd)}")
    return cmd


def read_dtlab(case, out):
    """losses[rank][step] and state[rank] = {name: numpy array} from a run directory."""
    world = 1 if case.mode == "dp" else case.world  # DataParallel: device 0 holds the module
    losses = [[] for _ in range(case.stages if case.mode == "pipeline" else case.world)]
    with open(os.path.join(out, "metrics.jsonl")) as f:
        for line in f:
            j = json.loads(line)
            if j.get("kind") == "step":
                if j["step"] != len(losses[j["rank"]]):
                    die(f"{out}/metrics.jsonl: rank {j['rank']} step {j['step']} out of order")
                losses[j["rank"]].append(j["loss"])
    if case.mode == "pipeline":  # the last stage computes the loss; the others have none
        for r, rl in enumerate(losses[:-1]):
            if any(v is not None and not math.isnan(v) for v in rl):
                die(f"{out}/metrics.jsonl: pipeline stage {r} of {case.stages} has a loss; only the last has one")
        losses = losses[-1:]
    rank0 = dtlab_safetensors.load_file(os.path.join(out, "final.safetensors"))
    states = []
    for r in range(world):
        s = {k: v.numpy() for k, v in rank0.items()}
        for fname in (f"final.rank{r}.safetensors", f"final.rank{r}.buffers.safetensors"):
            path = os.path.join(out, fname)
            if r > 0 and os.path.exists(path):
                s.update({k: v.numpy() for k, v in dtlab_safetensors.load_file(path).items()})
        states.append(s)
    return losses[:world], states


def read_dtlab_pipeline(out):
    """--mode pipeline: config.toml's resolved [distributed] and [model] settings of the pipeline."""
    import tomllib
    with open(os.path.join(out, "config.toml"), "rb") as f:
        c = tomllib.load(f)
    d = c["distributed"]
    return {"balance": d["balance"], "microbatches": d["microbatches"], "schedule": d["schedule"],
            "deferred_batch_norm": d["deferred_batch_norm"], "batchnorm": c["model"]["batchnorm"]}


def read_dtlab_partition(out):
    """--mode zero: the parameters each rank owns, by name, from summary.json."""
    with open(os.path.join(out, "summary.json")) as f:
        return [r["parameters"] for r in json.load(f)["zero"]["partition"]]


# ---- 4. the PyTorch side ----

_DATA = {}


def data(train, limit, dtype):
    key = (train, limit, dtype)
    if key not in _DATA:
        x, y = common.load_split(train, limit)
        _DATA[key] = (x.to(dtype), y)
    return _DATA[key]


def new_model(case, init, dtype):
    model = common.MODELS[case.model](batchnorm=case.batchnorm)
    model.load_state_dict(dtlab_safetensors.load_file(init), strict=True)
    return model.to(dtype)


def new_optimizer(case, params):
    if case.mode == "zero":
        from torch.distributed.optim import ZeroRedundancyOptimizer
        cls = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW}.get(case.optimizer, torch.optim.SGD)
        kw = dict(lr=case.lr, weight_decay=WEIGHT_DECAY)
        if cls is torch.optim.SGD:
            kw["momentum"] = MOMENTUM
        return ZeroRedundancyOptimizer(params, optimizer_class=cls, parameters_as_bucket_view=case.bucket_view, **kw)
    if case.optimizer == "adam":
        return torch.optim.Adam(params, lr=case.lr, weight_decay=WEIGHT_DECAY)
    if case.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=case.lr, weight_decay=WEIGHT_DECAY)
    return torch.optim.SGD(params, lr=case.lr, momentum=MOMENTUM, weight_decay=WEIGHT_DECAY)


def sampler_for(case, n, rank):
    # DistributedSampler needs no process group when num_replicas and rank are given.
    return DistributedSampler(range(n), num_replicas=case.world, rank=rank, shuffle=case.shuffle,
                              seed=case.seed, drop_last=case.sampler_drop_last)


def rank_batches(case, sampler):
    idx = list(sampler)
    b = [idx[i:i + case.batch] for i in range(0, len(idx), case.batch)]
    if case.drop_last and b and len(b[-1]) < case.batch:
        b.pop()
    return b


def state_of(model):
    return {k: v.detach().cpu().numpy().copy() for k, v in model.state_dict().items()}


def train_one_loader(case, x, y, module, forward):
    """The loop a user writes around one DataLoader over DistributedSampler(1, 0): zero_grad, one
    CrossEntropyLoss over forward(batch), backward, step; train mode throughout (eval mode
    changes no buffer: nothing to mirror in one process). Returns every step's loss."""
    opt = new_optimizer(case, module.parameters())
    lossf = torch.nn.CrossEntropyLoss()
    sampler = sampler_for(case, len(x), 0)
    loader = DataLoader(TensorDataset(x, y), batch_size=case.batch, sampler=sampler, drop_last=case.drop_last)
    losses, step, epoch = [], 0, 0
    while step < case.steps:
        sampler.set_epoch(epoch)
        module.train()
        for xb, yb in loader:
            if step == case.steps:
                break
            opt.zero_grad(set_to_none=True)
            loss = lossf(forward(xb), yb)
            loss.backward()
            opt.step()
            losses.append(float(loss))
            step += 1
        epoch += 1
    return losses


def torch_single(case, init, dtype):
    """One process, plain model, the DataLoader a user writes around DistributedSampler(1, 0)."""
    x, y = data(True, case.limit_train, dtype)
    model = new_model(case, init, dtype)
    losses = train_one_loader(case, x, y, model, model)
    return [losses], [state_of(model)]


def torch_sync(case, init, dtype):
    """N ranks with SyncBatchNorm: one process on the concatenated global batch."""
    x, y = data(True, case.limit_train, dtype)
    model = new_model(case, init, dtype)
    opt = new_optimizer(case, model.parameters())
    lossf = torch.nn.CrossEntropyLoss()
    samplers = [sampler_for(case, len(x), r) for r in range(case.world)]
    losses = [[] for _ in range(case.world)]
    step, epoch = 0, 0
    while step < case.steps:
        per_rank = []
        for s in samplers:
            s.set_epoch(epoch)
            per_rank.append(rank_batches(case, s))
        model.train()
        for k in range(len(per_rank[0])):
            if step == case.steps:
                break
            idx = [i for r in range(case.world) for i in per_rank[r][k]]
            opt.zero_grad(set_to_none=True)
            out = model(x[idx])
            # Every rank's batch has the same size (the sampler pads), so DDP's mean of the ranks'
            # mean-loss gradients is the gradient of the mean over the global batch.
            lossf(out, y[idx]).backward()
            opt.step()
            lo = 0
            with torch.no_grad():
                for r in range(case.world):
                    n = len(per_rank[r][k])
                    losses[r].append(float(lossf(out[lo:lo + n], y[idx[lo:lo + n]])))
                    lo += n
            step += 1
        epoch += 1
    st = state_of(model)
    return losses, [st for _ in range(case.world)]


def torch_dp(case, init, dtype):
    """DataParallel on case.world emulated devices (gen_dp.data_parallel_step)."""
    x, y = data(True, case.limit_train, dtype)
    master = new_model(case, init, dtype)
    opt = new_optimizer(case, master.parameters())
    lossf = torch.nn.CrossEntropyLoss()
    g = torch.Generator()
    g.manual_seed(case.seed)
    loader = DataLoader(TensorDataset(x, y), batch_size=case.batch, shuffle=case.shuffle, generator=g,
                        drop_last=case.drop_last)
    losses, step = [], 0
    while step < case.steps:
        master.train()
        for xb, yb in loader:
            if step == case.steps:
                break
            loss, _ = gen_dp.data_parallel_step(master, opt, lossf, xb, yb, case.world)
            losses.append(loss)
            step += 1
    return [losses], [state_of(master)]


def torch_pipeline(case, init, dtype):
    """Pipe over case.stages CPU stages cut by case.balance, in this process (RPC initialized)."""
    from torch.distributed.pipeline.sync import Pipe
    x, y = data(True, case.limit_train, dtype)
    model = new_model(case, init, dtype)
    layers = list(model.children())
    sizes = [int(n) for n in case.balance.split(",")]
    if len(sizes) != case.stages or sum(sizes) != len(layers):
        die(f"{case.name}: balance {case.balance} does not cut {len(layers)} modules into {case.stages} stages")
    cuts = [sum(sizes[:k]) for k in range(len(sizes) + 1)]
    stages = [torch.nn.Sequential(*layers[a:b]) for a, b in zip(cuts, cuts[1:])]
    pipe = Pipe(torch.nn.Sequential(*stages), chunks=case.microbatches, checkpoint="never",
                deferred_batch_norm=case.deferred_bn)
    # Pipe's partitions hold the model's layers in order (DeferredBatchNorm in place of BatchNorm,
    # with the same parameters and buffers, plus its pending sums): layer i is the model's module i.
    leaves = [m for part in pipe.partitions for m in part.modules() if not list(m.children())]
    assert len(leaves) == len(layers), (len(leaves), len(layers))
    # (eval mode changes no buffer, DeferredBatchNorm's pending sums included)
    losses = train_one_loader(case, x, y, pipe, lambda xb: pipe(xb).local_value())
    state = {f"{i}.{k}": v.detach().cpu().numpy().copy() for i, m in enumerate(leaves)
             for k, v in m.state_dict().items() if k not in ("sum", "sum_squares")}
    assert set(state) == set(model.state_dict()), sorted(set(state) ^ set(model.state_dict()))
    return [losses], [state]


def ddp_case(rank, case, init, dtype):
    """One rank of a DDP (or post-local SGD) case, in a process of an initialized gloo group."""
    from torch.distributed.algorithms.ddp_comm_hooks import post_localSGD_hook as post_local
    from torch.distributed.algorithms.model_averaging import averagers
    x, y = data(True, case.limit_train, dtype)
    xt, _ = data(False, case.limit_test, dtype)
    model = new_model(case, init, dtype)
    ddp = torch.nn.parallel.DistributedDataParallel(model, broadcast_buffers=case.broadcast_buffers)
    averager = None
    if case.mode == "local-sgd":
        state = post_local.PostLocalSGDState(process_group=None, subgroup=None,
                                             start_localSGD_iter=case.warmup_steps,
                                             post_local_gradient_allreduce=False)
        ddp.register_comm_hook(state, post_local.post_localSGD_hook)
        averager = averagers.PeriodicModelAverager(period=case.average_every, warmup_steps=case.warmup_steps)
    opt = new_optimizer(case, ddp.parameters())
    lossf = torch.nn.CrossEntropyLoss()
    sampler = sampler_for(case, len(x), rank)
    loader = DataLoader(TensorDataset(x, y), batch_size=case.batch, sampler=sampler, drop_last=case.drop_last)
    losses, step, epoch = [], 0, 0
    while step < case.steps:
        sampler.set_epoch(epoch)
        ddp.train()
        for xb, yb in loader:
            if step == case.steps:
                break
            opt.zero_grad(set_to_none=True)
            loss = lossf(ddp(xb), yb)
            loss.backward()
            opt.step()
            if averager:
                averager.average_parameters(ddp.parameters())
            losses.append(float(loss))
            step += 1
        # End of epoch, as dtlab does it: an evaluation forward of this rank's test shard.
        ddp.eval()
        lo, hi = case.limit_test * rank // case.world, case.limit_test * (rank + 1) // case.world
        with torch.no_grad():
            ddp(xt[lo:hi])
        epoch += 1
    extra = {}
    if case.mode == "zero":  # the parameters each rank owns, by name, in the order they were assigned
        names = {id(p): n for n, p in model.named_parameters()}
        extra["zero_partition"] = [[names[id(p)] for g in groups for p in g["params"]]
                                   for groups in opt._partition_parameters()]
    return losses, state_of(model), extra


def ddp_worker(rank, world, jobs, port, results_dir):
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=120))
    for i, (key, case, init, dtype) in enumerate(jobs):
        losses, state, extra = ddp_case(rank, case, init, dtype)
        # Results go through files: a pipe would block a rank on megabytes of weights.
        with open(os.path.join(results_dir, f"{i}.rank{rank}.pickle"), "wb") as f:
            pickle.dump((losses, state, extra), f)
    dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


EXTRAS = {}  # per case key: what PyTorch's rank 0 reported beside losses and state (zero_partition)


def run_torch(jobs, work):
    """jobs: [(key, case, init, dtype)] -> {key: (losses[rank][step], state[rank])}."""
    torch.set_num_threads(1)
    results = {}
    by_world = {}
    rpc = None
    if any(case.kind == "pipeline" for _, case, _, _ in jobs):  # Pipe needs the RPC framework, even alone
        from torch.distributed import rpc
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
        rpc.init_rpc("worker", rank=0, world_size=1)
    for key, case, init, dtype in jobs:
        if case.kind == "ddp":
            by_world.setdefault(case.world, []).append((key, case, init, dtype))
        else:
            fn = {"single": torch_single, "sync": torch_sync, "dp": torch_dp, "pipeline": torch_pipeline}[case.kind]
            results[key] = fn(case, init, dtype)
    if rpc:
        rpc.shutdown()
    # One group of processes per world size runs all its cases: PyTorch starts once per rank.
    for world, group in by_world.items():
        results_dir = tempfile.mkdtemp(prefix=f"torch-w{world}-", dir=work)
        mp.spawn(ddp_worker, args=(world, group, free_port(), results_dir), nprocs=world)
        for i, (key, case, init, dtype) in enumerate(group):
            ranks = []
            for r in range(world):
                with open(os.path.join(results_dir, f"{i}.rank{r}.pickle"), "rb") as f:
                    ranks.append(pickle.load(f))
            results[key] = ([x[0] for x in ranks], [x[1] for x in ranks])
            if ranks[0][2]:
                EXTRAS[key] = ranks[0][2]
    return results


# ---- 5. comparison ----

@dataclasses.dataclass
class Diff:
    """Largest differences of one case; `rel` = |d| / |torch| for losses, and for tensors the
    largest |d| of a tensor over its largest |torch value| (relative to the tensor's scale)."""
    loss_abs: float = 0.0
    loss_rel: float = 0.0
    param_abs: float = 0.0
    param_rel: float = 0.0
    buffer_abs: float = 0.0
    buffer_rel: float = 0.0
    nbt_equal: bool = True
    checked: int = 0
    mismatches: list = dataclasses.field(default_factory=list)

    def fail(self, text):
        if len(self.mismatches) < 10:
            self.mismatches.append(text)
        else:
            self.mismatches[-1] = "... (more)"

    @property
    def ok(self):
        return not self.mismatches


def compare(case, mine, theirs, check=True):
    """mine, theirs: (losses[rank][step], state[rank]); mine is checked against theirs."""
    d = Diff()
    (ml, ms), (tl, ts) = mine, theirs
    if len(ml) != len(tl) or len(ms) != len(ts):
        d.fail(f"ranks: {len(ml)} vs {len(tl)}")
        return d
    for r in range(len(tl)):
        if len(ml[r]) != len(tl[r]):
            d.fail(f"rank {r}: {len(ml[r])} steps vs {len(tl[r])}")
            continue
        for s, (a, b) in enumerate(zip(ml[r], tl[r])):
            diff = abs(a - b) if a is not None else math.inf
            d.loss_abs = max(d.loss_abs, diff)
            d.loss_rel = max(d.loss_rel, diff / max(abs(b), 1e-30))
            d.checked += 1
            if check and not within(diff, b, TOLERANCES["loss"]):
                d.fail(f"rank {r} loss step {s}: dtlab {a!r} torch {b!r} |d| {diff:.3g}")
    for r in range(len(ts)):
        if set(ms[r]) != set(ts[r]):
            d.fail(f"rank {r}: tensors {sorted(set(ms[r]) ^ set(ts[r]))} in one side only")
            continue
        for name, b in ts[r].items():
            a = ms[r][name]
            if a.shape != b.shape:
                d.fail(f"rank {r} {name}: shape {a.shape} vs {b.shape}")
                continue
            if name.endswith("num_batches_tracked"):
                d.checked += 1
                if int(a) != int(b):
                    d.nbt_equal = False
                    d.fail(f"rank {r} {name}: dtlab {int(a)} torch {int(b)}")
                continue
            a64, b64 = a.astype(np.float64), b.astype(np.float64)
            diff = np.abs(a64 - b64)
            is_buffer = "running_" in name
            tol = TOLERANCES["buffer" if is_buffer else "param"]
            worst = float(diff.max()) if diff.size else 0.0
            rel = worst / max(float(np.abs(b64).max()), 1e-30) if diff.size else 0.0
            if is_buffer:
                d.buffer_abs, d.buffer_rel = max(d.buffer_abs, worst), max(d.buffer_rel, rel)
            else:
                d.param_abs, d.param_rel = max(d.param_abs, worst), max(d.param_rel, rel)
            d.checked += diff.size
            if check:
                bad = np.flatnonzero(diff > tol["atol"] + tol["rtol"] * np.abs(b64))
                for i in bad[:3]:
                    at = np.unravel_index(i, a.shape)
                    d.fail(f"rank {r} {name}{list(map(int, at))}: dtlab {float(a.flat[i])!r} "
                           f"torch {float(b.flat[i])!r} |d| {float(diff.flat[i]):.3g}")
    return d


# ---- 6. fixtures ----
#
# tests/fixtures/parity/<case>.json holds PyTorch's side of a case for tests/test_parity.cpp: the
# dtlab settings, the tolerances above, every rank's per-step losses and every rank's final state:
# buffers and parameters of up to FULL_MAX elements in full, num_batches_tracked as an integer, and
# larger parameters as a summary: numel, sum, sum of |x|, sum of squares, and N_SAMPLES values at
# evenly spaced indices. A rank > 0 lists only the tensors that differ from rank 0's. Pipeline cases
# get no fixture: tests/test_parity.cpp lists its cases and has none of them (its
# ParityFixtures.EveryFixtureIsTested would fail on an unlisted fixture).

FULL_MAX, N_SAMPLES = 512, 64


def sample_indices(n):
    return sorted({(k * (n - 1)) // (N_SAMPLES - 1) for k in range(N_SAMPLES)})


def tensor_entry(v):
    if v.dtype == np.int64:
        return {"int": int(v)}
    flat = v.ravel()
    if flat.size <= FULL_MAX:
        return {"values": [float(x) for x in flat]}
    f = flat.astype(np.float64)
    return {"numel": int(f.size), "sum": float(f.sum()), "abs_sum": float(np.abs(f).sum()),
            "sum_sq": float((f * f).sum()), "samples": [[i, float(flat[i])] for i in sample_indices(f.size)]}


# How a summary is checked (test_parity.cpp does the same; the harness applies it to dtlab's own
# run before it writes a fixture, so a committed fixture is known to pass). Elementwise tolerances
# tol_i = atol + rtol |x_i| have an L2 norm of at most T2 = sqrt(n) atol + rtol sqrt(sum x^2).
#  - sum of squares: |d sum x^2| = |sum (2 x_i + d_i) d_i| <= 2 sqrt(sum x^2) T2 + T2^2
#    (Cauchy-Schwarz: implied by the elementwise tolerance);
#  - sum and sum of |x|: differences of either sign add up like a random walk, to about
#    sqrt(sum d_i^2) <= T2 (the elementwise bound alone would allow n atol, too loose to be a test);
#  - the sampled values: elementwise.
def summary_tolerance(stat, s, tol):
    t2 = math.sqrt(s["numel"]) * tol["atol"] + tol["rtol"] * math.sqrt(s["sum_sq"])
    if stat == "sum_sq":
        return 2 * math.sqrt(s["sum_sq"]) * t2 + t2 * t2
    return t2


def check_summaries(mine, fixture):
    """dtlab's states against a fixture, as test_parity.cpp checks them: a list of failures."""
    bad = []
    for r, want in enumerate(fixture["ranks"]):
        for name, s in fixture["ranks"][0]["state"].items():
            s = want["state"].get(name, s)
            a = mine[1][r][name]
            if "int" in s:
                if int(a) != s["int"]:
                    bad.append(f"rank {r} {name}: {int(a)} vs {s['int']}")
                continue
            tol = TOLERANCES["buffer" if "running_" in name else "param"]
            f = a.astype(np.float64).ravel()
            if "values" in s:
                for i, b in enumerate(s["values"]):
                    if not within(abs(f[i] - b), b, tol):
                        bad.append(f"rank {r} {name}[{i}]: dtlab {f[i]!r} torch {b!r}")
                continue
            got = {"sum": f.sum(), "abs_sum": np.abs(f).sum(), "sum_sq": (f * f).sum()}
            for stat, v in got.items():
                if abs(v - s[stat]) > summary_tolerance(stat, s, tol):
                    bad.append(f"rank {r} {name} {stat}: dtlab {v!r} torch {s[stat]!r}")
            for i, b in s["samples"]:
                if not within(abs(f[i] - b), b, tol):
                    bad.append(f"rank {r} {name}[{i}]: dtlab {f[i]!r} torch {b!r}")
    return bad


def fixture_for(case, theirs):
    losses, states = theirs
    ranks = []
    for r, st in enumerate(states):
        entries = {k: tensor_entry(v) for k, v in st.items()
                   if r == 0 or not np.array_equal(v, states[0][k])}
        ranks.append({"losses": losses[r], "state": entries})
    settings = {k: v for k, v in dataclasses.asdict(case).items() if k not in ("name", "what")}
    settings.update(momentum=MOMENTUM, weight_decay=WEIGHT_DECAY)
    return {"format": FIXTURE_FORMAT, "generator": "tools/parity/parity.py", "torch": torch.__version__,
            "case": case.name, "what": case.what, "kind": case.kind, "settings": settings,
            "dtlab_command": "dtlab run " + " ".join(case.dtlab_args()),
            "tolerances": TOLERANCES, "ranks": ranks}


# ---- 7. main ----

def fmt(x):
    return f"{x:.2e}" if x else "0"


def main():
    p = argparse.ArgumentParser(description="dtlab vs PyTorch, step by step, on Fashion-MNIST")
    p.add_argument("--dtlab", default=os.path.join(ROOT, "build", "dtlab"), help="dtlab executable")
    p.add_argument("--cases", default="", help="comma-separated case names (default: all)")
    p.add_argument("--list", action="store_true", help="list the cases and exit")
    p.add_argument("--keep", metavar="DIR", help="keep the dtlab run directories under DIR")
    p.add_argument("--write-fixtures", action="store_true",
                   help=f"write PyTorch's side of each case to {os.path.relpath(FIXTURE_DIR, ROOT)}/")
    p.add_argument("--float64", action="store_true",
                   help="also run PyTorch in float64 and print how far float32 PyTorch and dtlab are from it")
    p.add_argument("--timeout", type=float, default=300, help="seconds one dtlab run may take")
    a = p.parse_args()

    cases = CASES
    if a.cases:
        names = [n.strip() for n in a.cases.split(",") if n.strip()]
        unknown = [n for n in names if n not in {c.name for c in CASES}]
        if unknown:
            p.error(f"--cases: unknown case {', '.join(unknown)}; --list shows them")
        cases = [c for c in CASES if c.name in names]
    if a.list:
        for c in CASES:
            print(f"{c.name:26s} {c.what}\n{'':26s} dtlab run {' '.join(c.dtlab_args())}")
        return 0
    if not os.path.exists(os.path.join(common.DATA_DIR, "train-images-idx3-ubyte.gz")):
        print(f"parity: skipped, Fashion-MNIST is not in {common.DATA_DIR} "
              "(apt-get install dataset-fashion-mnist, or set DTLAB_DATA_DIR)")
        return 77
    if not (os.path.isfile(a.dtlab) and os.access(a.dtlab, os.X_OK)):
        p.error(f"--dtlab: {a.dtlab} is not an executable (build it with tools/setup.sh)")

    t0 = time.time()
    work = a.keep or tempfile.mkdtemp(prefix="dtlab-parity-")
    os.makedirs(work, exist_ok=True)
    print(f"# parity: dtlab ({a.dtlab}) vs PyTorch {torch.__version__} (CPU; DDP over gloo, one process per "
          f"rank; Pipe in one process over RPC), Fashion-MNIST from {common.DATA_DIR}", flush=True)
    print(f"# SGD lr {LR} (cnn {CNN_LR}), momentum {MOMENTUM}, weight_decay {WEIGHT_DECAY} (Adam, AdamW: lr 1e-3, the same weight_decay); "
          f"OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE', '(not set)')}", flush=True)
    print("# pass: |dtlab - torch| <= atol + rtol |torch|, " +
          "; ".join(f"{k} {v['atol']:g} + {v['rtol']:g}" for k, v in TOLERANCES.items()) +
          "; num_batches_tracked (nbt) equal", flush=True)
    print("# rel: |d| / |torch loss|; for tensors, max |d| of a tensor / its max |torch value|", flush=True)
    mine, cmds, partitions, pipelines = {}, {}, {}, {}
    try:
        t_dtlab = time.time()
        for c in cases:
            out = os.path.join(work, c.name)
            cmds[c.name] = run_dtlab(a.dtlab, c, out, common.DATA_DIR, a.timeout)
            mine[c.name] = read_dtlab(c, out)
            if c.mode == "zero":
                partitions[c.name] = read_dtlab_partition(out)
            if c.mode == "pipeline":
                pipelines[c.name] = read_dtlab_pipeline(out)
        t_dtlab = time.time() - t_dtlab
        t_torch = time.time()
        jobs = [(c.name, c, os.path.join(work, c.name, "init.safetensors"), torch.float32) for c in cases]
        if a.float64:
            jobs += [(c.name + "/f64", c, os.path.join(work, c.name, "init.safetensors"), torch.float64)
                     for c in cases]
        theirs = run_torch(jobs, work)
        t_torch = time.time() - t_torch
    finally:
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)

    header = (f"{'case':26s} {'ranks':>5s} {'steps':>5s} {'max|dloss|':>10s} {'rel':>8s} {'max|dparam|':>11s} "
              f"{'rel':>8s} {'max|dbuf|':>9s} {'rel':>8s} {'nbt':>4s}  result")
    print(header)
    print("-" * len(header))
    failed = []
    for c in cases:
        d = compare(c, mine[c.name], theirs[c.name])
        if c.mode == "zero":
            want = EXTRAS.get(c.name, {}).get("zero_partition")
            got = partitions[c.name]
            if got != want:
                d.fail(f"ZeroRedundancyOptimizer's partition: dtlab {got} torch {want}")
        if c.mode == "pipeline":  # the stages PyTorch was given are the ones dtlab ran
            want = {"balance": c.balance, "microbatches": c.microbatches, "schedule": c.schedule,
                    "deferred_batch_norm": c.deferred_bn, "batchnorm": c.batchnorm}
            if pipelines[c.name] != want:
                d.fail(f"config.toml's pipeline: dtlab {pipelines[c.name]} case {want}")
        ranks = len(theirs[c.name][1])
        print(f"{c.name:26s} {ranks:5d} {c.steps:5d} {fmt(d.loss_abs):>10s} {fmt(d.loss_rel):>8s} "
              f"{fmt(d.param_abs):>11s} {fmt(d.param_rel):>8s} {fmt(d.buffer_abs):>9s} {fmt(d.buffer_rel):>8s} "
              f"{'=' if d.nbt_equal else '!=':>4s}  {'PASS' if d.ok else 'FAIL'}", flush=True)
        if not d.ok:
            failed.append(c.name)
            print(f"    {c.what}\n    {' '.join(cmds[c.name])}\n    first mismatches:")
            for m in d.mismatches:
                print("      " + m)
        if a.write_fixtures and d.ok and c.kind != "pipeline":  # (tests/test_parity.cpp runs no pipeline yet)
            fx = fixture_for(c, theirs[c.name])
            if c.name in EXTRAS:
                fx.update(EXTRAS[c.name])
            bad = check_summaries(mine[c.name], fx)
            if bad:
                failed.append(c.name)
                print(f"    fixture summaries fail for dtlab's own run: {bad[:5]}")
                continue
            os.makedirs(FIXTURE_DIR, exist_ok=True)
            with open(os.path.join(FIXTURE_DIR, c.name + ".json"), "w") as f:
                json.dump(fx, f, separators=(",", ":"))
                f.write("\n")
    print()
    for c in cases:
        print(f"# {c.name:26s} {c.what}")
    if a.float64:
        print("\n# distance from PyTorch float64 (same initial weights and data): PyTorch float32 | dtlab")
        print(f"{'case':26s} {'max|dloss|':>21s} {'max|dparam|':>21s} {'max|dbuf|':>21s}")
        for c in cases:
            ref = theirs[c.name + "/f64"]
            t32 = compare(c, theirs[c.name], ref, check=False)
            lab = compare(c, mine[c.name], ref, check=False)
            print(f"{c.name:26s} {fmt(t32.loss_abs):>10s} {fmt(lab.loss_abs):>10s} {fmt(t32.param_abs):>10s} "
                  f"{fmt(lab.param_abs):>10s} {fmt(t32.buffer_abs):>10s} {fmt(lab.buffer_abs):>10s}")
    print(f"# {len(cases) - len(failed)} of {len(cases)} cases passed in {time.time() - t0:.0f} s "
          f"(dtlab {t_dtlab:.0f} s, PyTorch {t_torch:.0f} s)" +
          (f"; fixtures in {os.path.relpath(FIXTURE_DIR, ROOT)}/" if a.write_fixtures else ""))
    if failed:
        print("FAILED: " + ", ".join(failed))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
