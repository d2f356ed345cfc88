"""PyTorch's side of `dtlab eval --autocast bf16` (ctest torch.AutocastBf16; exit 77 = skipped when
python3-torch or Fashion-MNIST is missing).

What PyTorch 1.13 does for these models under torch.autocast("cpu", dtype=torch.bfloat16) (its
AutocastCPU dispatch table, `torch._C._dispatch_dump("aten::conv2d")` etc.): conv2d, linear and
addmm are lower_precision_fp ops (inputs, weights and bias cast to bf16, float32 accumulation, bf16
output); batch_norm, relu, max_pool2d and flatten have no autocast kernel and run in their input's
dtype (bf16 here); cross_entropy_loss is an fp32 op. dtlab emulates exactly that in float32
storage (lab/nn/model.h, Model::set_autocast), except the order in which oneDNN's bf16 kernels add
the products, so a few activations differ by one bf16 step and a prediction near a tie can flip.

Reference mode: a dtlab run's final.safetensors in dtlab_models.py's model, the test set in eval mode
under autocast and in float32: accuracy, loss, every sample's predicted class.
    autocast_reference.py --run DIR [--limit-test N] [--batch-size 1000] [--probe K] [--json OUT]

Check mode (the ctest): trains an mlp and a cnn with `dtlab run`, evaluates them with
`dtlab eval --autocast bf16 --json` and here, and compares:
  - dtlab's bf16 predictions with PyTorch's bf16 predictions on the 10000 test samples:
    agreement >= 99.9% (measured on this machine: see the printed figures);
  - dtlab's float32 accuracy with PyTorch's float32 accuracy (the same to 1 sample);
  - the probe samples' bf16 softmax outputs, dtlab against PyTorch.
    autocast_reference.py --check DTLAB_BINARY WORK_DIR
"""
import argparse
import json
import os
import re
import subprocess
import sys

try:
    import torch
except ImportError:
    print("python3-torch is not installed: skipped")
    sys.exit(77)

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "fixtures"))
import common  # noqa: E402  (the dataset, preprocessed exactly as dtlab does it)
import dtlab_safetensors as st  # noqa: E402
from dtlab_models import MODELS  # noqa: E402

MIN_AGREEMENT = 0.999  # dtlab bf16 vs PyTorch bf16, top-1, over the test set
MAX_PROBS_DIFF = 0.02  # dtlab bf16 vs PyTorch bf16, softmax outputs of the probe samples


def run_model_name(run_dir):
    with open(os.path.join(run_dir, "config.toml")) as f:
        text = f.read()
    m = re.search(r'^\s*model\s*=\s*"([a-z]+)"', text, re.M)
    if not m:
        raise SystemExit(f"{run_dir}/config.toml: no model = \"...\" line")
    return m.group(1)


def evaluate(run_dir, limit_test=0, batch_size=1000, probe=10, threads=2):
    """Both precisions: {"bf16": {...}, "fp32": {...}}, each with accuracy, loss, predictions, probe."""
    torch.set_num_threads(threads)
    name = run_model_name(run_dir)
    model = MODELS[name]()
    model.load_state_dict(st.load_file(os.path.join(run_dir, "final.safetensors")), strict=True)
    model.eval()
    x, y = common.load_split(False, limit_test)
    out = {}
    for precision in ["bf16", "fp32"]:
        logits = []
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
            for i in range(0, len(x), batch_size):
                z = model(x[i:i + batch_size])
                assert z.dtype == (torch.bfloat16 if precision == "bf16" else torch.float32), z.dtype
                logits.append(z.float())
        z = torch.cat(logits)
        pred = z.argmax(1)
        out[precision] = {
            "accuracy": float((pred == y).double().mean()),
            "loss": float(torch.nn.functional.cross_entropy(z, y)),
            "predictions": pred.tolist(),
            "probe": z[:probe].double().softmax(1).tolist(),
        }
    out["model"] = name
    out["samples"] = len(x)
    return out


def check(dtlab, work):
    os.makedirs(work, exist_ok=True)
    failures = []

    def ok(cond, what):
        print(("ok   " if cond else "FAIL ") + what, flush=True)
        if not cond:
            failures.append(what)

    for model, limit in [("mlp", 8192), ("cnn", 8192)]:
        run_dir = os.path.join(work, model)
        r = subprocess.run([dtlab, "run", "--model", model, "--epochs", "1", "--limit-train", str(limit),
                            "--out", run_dir, "--overwrite"], capture_output=True, text=True)
        if r.returncode != 0:
            print(r.stdout, r.stderr)
            return 1
        out_json = os.path.join(work, model + "-eval.json")
        r = subprocess.run([dtlab, "eval", "--run", run_dir, "--autocast", "bf16", "--probe", "100", "--json", out_json],
                           capture_output=True, text=True)
        if r.returncode != 0:
            print(r.stdout, r.stderr)
            if "autocast" in r.stdout + r.stderr:
                print("this dtlab has no `eval --autocast` (commands/command_line.cpp: add_eval_flags)")
            return 1
        print(r.stdout, end="")
        d = json.load(open(out_json))
        t = evaluate(run_dir, probe=100)
        n = t["samples"]
        ok(d["samples"] == n and len(d["predictions"]) == n, f"{model}: {n} test samples on both sides")
        same = sum(a == b for a, b in zip(d["predictions"], t["bf16"]["predictions"]))
        torch_flips = sum(a != b for a, b in zip(t["bf16"]["predictions"], t["fp32"]["predictions"]))
        print(f"  {model}: torch bf16 accuracy {t['bf16']['accuracy']:.4f} fp32 {t['fp32']['accuracy']:.4f}; "
              f"torch's own bf16 vs fp32 top-1 changes: {torch_flips} of {n}")
        ok(same / n >= MIN_AGREEMENT,
           f"{model}: dtlab bf16 predictions agree with torch.autocast's on {same} of {n} samples "
           f"({same / n:.4%}, bound {MIN_AGREEMENT:.1%})")
        ok(abs(d["fp32"]["accuracy"] - t["fp32"]["accuracy"]) <= 1.0 / n + 1e-12,
           f"{model}: float32 accuracy dtlab {d['fp32']['accuracy']:.4f} torch {t['fp32']['accuracy']:.4f}")
        ok(abs(d["accuracy"] - t["bf16"]["accuracy"]) <= (n - same) / n + 1e-12,
           f"{model}: bf16 accuracy dtlab {d['accuracy']:.4f} torch {t['bf16']['accuracy']:.4f}")
        diff = max(abs(a - b) for pa, pb in zip(d["probe"]["probs"], t["bf16"]["probe"]) for a, b in zip(pa, pb))
        ok(diff <= MAX_PROBS_DIFF,
           f"{model}: bf16 softmax of the first 100 samples, max |dtlab - torch| {diff:.2e} (bound {MAX_PROBS_DIFF})")
    print(f"{len(failures)} failed")
    return 1 if failures else 0


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--run", help="a dtlab run directory (config.toml, final.safetensors)")
    p.add_argument("--limit-test", type=int, default=0)
    p.add_argument("--batch-size", type=int, default=1000)
    p.add_argument("--probe", type=int, default=10)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--json", help="also write the figures and predictions here")
    p.add_argument("--check", nargs=2, metavar=("DTLAB_BINARY", "WORK_DIR"))
    a = p.parse_args()
    if a.check:
        common.skip_without_dataset("autocast_reference --check")
        return check(*a.check)
    if not a.run:
        p.error("--run DIR or --check DTLAB_BINARY WORK_DIR")
    r = evaluate(a.run, a.limit_test, a.batch_size, a.probe, a.threads)
    print(f"# torch {torch.__version__} {r['model']} {r['samples']} test samples, eval mode")
    for precision in ["bf16", "fp32"]:
        print(f"{precision}: accuracy {r[precision]['accuracy']:.4f} loss {r[precision]['loss']:.4f}")
    print("predictions (bf16): " + " ".join(str(c) for c in r["bf16"]["predictions"]))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(r, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
