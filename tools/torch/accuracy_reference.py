"""PyTorch's side of dtlab's accuracy runs (tools/accuracy_vs_torch.sh): the same model, data,
initial weights and schedule as `dtlab run`, trained by a plain PyTorch loop on the full
Fashion-MNIST, test accuracy in eval mode after every epoch.

  - model: tools/torch/dtlab_models.py's mlp or cnn after torch.manual_seed(seed), which dtlab
    reproduces bit for bit;
  - data: the Debian package's files, normalized as dtlab does (tools/fixtures/common.py);
    shuffled like DistributedSampler (one permutation from seed + epoch);
  - one process with the global batch (world size x per-rank batch): N ranks with SyncBatchNorm
    see exactly these batches (the union of the ranks' batch k is the permutation's slice k), and
    PyTorch 1.13 runs SyncBatchNorm on GPUs only;
  - SGD (lr, momentum, weight decay), CosineAnnealingLR(T_max = epochs) or a constant rate, stepped
    at the end of every epoch;
  - evaluation: model.eval(), batches of 1000, like dtlab's end-of-epoch evaluation.
The last line is `test_accuracy <final eval-mode accuracy>`.

Usage: /usr/bin/python3 tools/torch/accuracy_reference.py --model cnn --batch-size 128 --epochs 15
           --lr 0.05 --weight-decay 5e-4 --lr-schedule cosine [--threads 2] [--seed 0]
"""
import argparse
import os
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "fixtures"))
import common  # noqa: E402  (dataset as dtlab preprocesses it, and the reference models)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", choices=["mlp", "cnn"], required=True)
    p.add_argument("--batch-size", type=int, required=True, help="the global batch")
    p.add_argument("--epochs", type=int, required=True)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--lr-schedule", choices=["constant", "cosine"], default="constant")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    x, y = common.load_split(True, 0)
    xt, yt = common.load_split(False, 0)
    torch.manual_seed(a.seed)
    model = common.MODELS[a.model]()
    opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=a.momentum, weight_decay=a.weight_decay)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=a.epochs) if a.lr_schedule == "cosine" else None
    lossf = torch.nn.CrossEntropyLoss()
    print(f"# torch {torch.__version__} {a.model} batch {a.batch_size} epochs {a.epochs} lr {a.lr} "
          f"momentum {a.momentum} weight_decay {a.weight_decay} schedule {a.lr_schedule} seed {a.seed}", flush=True)
    acc = 0.0
    for epoch in range(a.epochs):
        t0 = time.time()
        model.train()
        g = torch.Generator()
        g.manual_seed(a.seed + epoch)  # DistributedSampler.set_epoch(epoch)
        perm = torch.randperm(len(x), generator=g)
        for i in range(0, len(perm), a.batch_size):
            idx = perm[i:i + a.batch_size]
            opt.zero_grad(set_to_none=True)
            lossf(model(x[idx]), y[idx]).backward()
            opt.step()
        if sched:
            sched.step()
        model.eval()
        correct, loss = 0, 0.0
        with torch.no_grad():
            for i in range(0, len(xt), 1000):
                out = model(xt[i:i + 1000])
                loss += float(lossf(out, yt[i:i + 1000])) * len(out)
                correct += int((out.argmax(1) == yt[i:i + 1000]).sum())
        acc = correct / len(xt)
        print(f"epoch {epoch + 1}/{a.epochs} test accuracy {acc:.4f} loss {loss / len(xt):.4f} "
              f"({time.time() - t0:.0f} s)", flush=True)
    print(f"test_accuracy {acc:.4f}")


if __name__ == "__main__":
    sys.exit(main())
