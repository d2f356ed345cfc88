"""PyTorch's side of the GPU timings (tools/gpu_check.sh): one training step of the lab's two models
(forward, cross-entropy, backward, SGD with momentum) on a GPU, eager and captured whole in a CUDA
Graph, optionally torch.compile'd, at each batch size: median milliseconds per step.

The numerics match dtlab's defaults: TF32 off for matrix products and convolutions
(torch.backends.cuda.matmul.allow_tf32 = cudnn.allow_tf32 = False), cudnn.benchmark off unless
--cudnn-benchmark. The models are dtlab_models.py's (beside this file), the ones every other
PyTorch tool of the repository uses.

    gpu_train_bench.py [--device cuda] [--models cnn,mlp] [--batch-sizes 32,64,256]
                       [--seconds 0.3] [--rounds 5] [--compile] [--cudnn-benchmark] [--json OUT]

Runs on the CPU too (--device cpu: eager only), which is how it is checked without a GPU.
Exit 77 when torch is missing, 2 for --device cuda without a GPU.
"""
import argparse
import json
import statistics
import sys
import time

try:
    import torch
    from torch import nn
except ImportError:
    print("torch is not installed: skipped")
    sys.exit(77)

from dtlab_models import MODELS  # noqa: E402  (beside this file: a script's directory is on sys.path)


def median_ms(step, sync, seconds, rounds):
    """Median milliseconds per step over `rounds` rounds of about `seconds` each, after warm-up."""
    for _ in range(5):
        step()
    sync()
    t0 = time.perf_counter()
    step()
    sync()
    per_round = max(1, int(seconds / max(time.perf_counter() - t0, 1e-6)))
    times = []
    for _ in range(rounds):
        sync()
        t0 = time.perf_counter()
        for _ in range(per_round):
            step()
        sync()
        times.append((time.perf_counter() - t0) / per_round)
    return statistics.median(times) * 1e3


def training(model_name, batch, device, compiled=False):
    """(model, step): one SGD step on a fixed random batch, all of it on `device`."""
    torch.manual_seed(0)
    model = MODELS[model_name]().to(device)
    if compiled:
        model = torch.compile(model)
    g = torch.Generator().manual_seed(batch)
    x = torch.randn(batch, 1, 28, 28, generator=g).to(device)
    y = torch.randint(0, 10, (batch,), generator=g).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    lossf = nn.CrossEntropyLoss()

    def step():
        opt.zero_grad(set_to_none=False)  # static gradient buffers: what a CUDA Graph replays
        lossf(model(x), y).backward()
        opt.step()
    return model, step


def graphed_step(model_name, batch, device):
    """The whole step captured in one CUDA Graph (PyTorch's "whole network capture" recipe): warm-up
    on a side stream, capture, then each step is one replay."""
    _, step = training(model_name, batch, device)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    return graph.replay


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--models", default="cnn,mlp")
    p.add_argument("--batch-sizes", default="32,64,256")
    p.add_argument("--seconds", type=float, default=0.3)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--compile", action="store_true", help="also time torch.compile (slow to start)")
    p.add_argument("--cudnn-benchmark", action="store_true")
    p.add_argument("--json", help="write the figures here")
    a = p.parse_args()
    cuda = a.device.startswith("cuda")
    if cuda and not torch.cuda.is_available():
        print(f"gpu_train_bench: --device {a.device}: torch {torch.__version__} sees no GPU", file=sys.stderr)
        sys.exit(2)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.benchmark = a.cudnn_benchmark
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    out = {"producer": "tools/torch/gpu_train_bench.py", "torch": torch.__version__, "device": a.device,
           "device_name": torch.cuda.get_device_name(a.device) if cuda else "cpu",
           "cudnn": torch.backends.cudnn.version() if cuda else None,
           "allow_tf32": False, "cudnn_benchmark": a.cudnn_benchmark, "rows": []}
    print(f"# torch {torch.__version__} on {out['device_name']}; TF32 off; cudnn.benchmark {a.cudnn_benchmark}")
    print(f"{'model':>6} {'batch':>6} {'eager_ms':>9} {'graph_ms':>9} {'compile_ms':>10}")
    for name in a.models.split(","):
        for batch in (int(b) for b in a.batch_sizes.split(",")):
            row = {"model": name, "batch_size": batch}
            row["eager_ms"] = median_ms(training(name, batch, a.device)[1], sync, a.seconds, a.rounds)
            row["cuda_graph_ms"] = median_ms(graphed_step(name, batch, a.device), sync, a.seconds, a.rounds) if cuda else None
            row["compile_ms"] = (median_ms(training(name, batch, a.device, True)[1], sync, a.seconds, a.rounds)
                                 if a.compile else None)
            out["rows"].append(row)
            fmt = lambda v: f"{v:.3f}" if v is not None else "-"  # noqa: E731
            print(f"{name:>6} {batch:>6} {fmt(row['eager_ms']):>9} {fmt(row['cuda_graph_ms']):>9} "
                  f"{fmt(row['compile_ms']):>10}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()
