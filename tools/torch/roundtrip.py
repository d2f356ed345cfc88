"""Weights round trip between dtlab and PyTorch (ctest label `torch`; exit 77 = skipped when
python3-torch or Fashion-MNIST is missing).

1. dtlab's init.safetensors loads with load_state_dict(strict=True) into the reference module
   (dtlab_models.py), and equals PyTorch's own init for the same seed bit for bit.
2. A state_dict saved from PyTorch (after some SGD steps, running statistics and
   num_batches_tracked changed) is accepted by `dtlab run --init` and comes back, bit for bit, in
   that run's init.safetensors.
3. dtlab's final.safetensors loads into PyTorch, and PyTorch's eval-mode accuracy and loss on the
   run's test images equal those dtlab reported in summary.json.
Usage: roundtrip.py DTLAB_BINARY WORK_DIR
"""
import json
import os
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

dtlab, work = sys.argv[1], sys.argv[2]
common.skip_without_dataset("roundtrip")
os.makedirs(work, exist_ok=True)
failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)


def run(*args):
    r = subprocess.run([dtlab, "run", *args], capture_output=True, text=True)
    if r.returncode != 0:
        print(r.stdout, r.stderr)
        sys.exit(1)


for model in ["mlp", "cnn"]:
    a = os.path.join(work, model + "-a")
    run("--model", model, "--seed", "5", "--steps", "3", "--batch-size", "16", "--limit-train", "256",
        "--limit-test", "64", "--out", a, "--overwrite")  # (the work folder is reused from run to run)
    # 1. dtlab -> torch, and dtlab's init is torch's init
    m = MODELS[model]()
    missing = m.load_state_dict(st.load_file(os.path.join(a, "init.safetensors")), strict=True)
    check(not missing.missing_keys and not missing.unexpected_keys, f"{model}: init loads with strict=True")
    torch.manual_seed(5)
    ref = MODELS[model]()
    same = all(torch.equal(ref.state_dict()[k], v) for k, v in m.state_dict().items())
    check(same, f"{model}: dtlab's init for seed 5 equals torch.manual_seed(5) init bit for bit")

    # 2. torch -> dtlab --init
    torch.manual_seed(11)
    t = MODELS[model]()
    opt = torch.optim.SGD(t.parameters(), lr=0.1)
    for _ in range(2):
        opt.zero_grad()
        t(torch.randn(8, 1, 28, 28)).sum().backward()
        opt.step()
    src = os.path.join(work, model + "-from-torch.safetensors")
    st.save_file(t.state_dict(), src, {"format": "pt"})
    b = os.path.join(work, model + "-b")
    run("--model", model, "--init", src, "--steps", "1", "--batch-size", "16", "--limit-train", "64",
        "--limit-test", "16", "--out", b, "--overwrite")
    back = st.load_file(os.path.join(b, "init.safetensors"))
    same = list(back) == list(t.state_dict()) and all(torch.equal(back[k], v) for k, v in t.state_dict().items())
    check(same, f"{model}: torch state_dict -> dtlab --init -> init.safetensors is bit-exact (incl. num_batches_tracked)")

    # 3. final weights evaluate in torch exactly as dtlab evaluated them
    f = MODELS[model]()
    f.load_state_dict(st.load_file(os.path.join(a, "final.safetensors")), strict=True)
    f.eval()
    xt, yt = common.load_split(False, 64)
    with torch.no_grad():
        logits = f(xt)
    acc = float((logits.argmax(1) == yt).float().mean())
    loss = float(torch.nn.functional.cross_entropy(logits, yt))
    summary = json.load(open(os.path.join(a, "summary.json")))["test_eval_mode"]
    check(acc == summary["accuracy"] and abs(loss - summary["loss"]) <= 1e-5 * max(1.0, loss),
          f"{model}: torch evaluates final.safetensors like dtlab (acc {acc} vs {summary['accuracy']}, "
          f"loss {loss:.6f} vs {summary['loss']:.6f})")

print(f"{4 * 2 - len(failures)} passed, {len(failures)} failed")
sys.exit(1 if failures else 0)
