#!/usr/bin/env python3
# The autocast lesson's claim, run in PyTorch: under torch.autocast("cpu", dtype=torch.bfloat16)
# an eval-mode forward of the lesson's cnn (two Conv2d + BatchNorm2d + ReLU + MaxPool2d blocks,
# Flatten, two Linear layers) returns bf16 from Conv2d and Linear (lower_precision_fp ops), and
# BatchNorm2d, ReLU, MaxPool2d and Flatten (no autocast entry) then run on bf16 tensors and return
# bf16: autocast does not keep "the rest" in float32. cross_entropy (an fp32 autocast op) computes
# in float32 from the bf16 logits. The bf16 convolutions run oneDNN's kernel (the profiler shows
# aten::mkldnn_convolution) and the bf16 Linear runs oneDNN's matmul primitive (ONEDNN_VERBOSE
# shows it; the float32 Linear does not go through oneDNN): PyTorch's speed under autocast is
# oneDNN's, not the lab's kernel's.
# Exit 0: PyTorch does that; 1: it does otherwise (printed); 77: no torch.
import sys

try:
    import torch
    import torch.nn as nn
except ImportError:
    print("python3-torch is not installed")
    sys.exit(77)

torch.manual_seed(0)
model = nn.Sequential(
    nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
    nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
    nn.Flatten(), nn.Linear(32 * 7 * 7, 128), nn.ReLU(), nn.Linear(128, 10)).eval()
seen = []  # (index, module name, input dtype, output dtype)
for i, m in enumerate(model):
    m.register_forward_hook(
        lambda m, inp, out, i=i: seen.append((i, type(m).__name__, inp[0].dtype, out.dtype)))

x = torch.randn(8, 1, 28, 28)
target = torch.arange(8) % 10
with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
    logits = model(x)
    loss = nn.functional.cross_entropy(logits, target)

ok = True
print(f"torch {torch.__version__}: torch.autocast('cpu', dtype=torch.bfloat16), eval-mode forward")
for i, name, din, dout in seen:
    print(f"  {i:2d} {name:12s} input {str(din):15s} output {dout}")
    if dout != torch.bfloat16:
        ok = False
        print(f"     ^ expected a bf16 output")
    if i > 0 and din != torch.bfloat16:
        ok = False
        print(f"     ^ expected a bf16 input (the previous layer's output)")
print(f"  cross_entropy on the bf16 logits: {loss.dtype}")
if loss.dtype != torch.float32:
    ok = False
    print("     ^ expected float32 (cross_entropy is on autocast's fp32 list)")
# PyTorch 1.13 sends bf16 convolutions and matrix products to oneDNN where mkldnn_bf16_device_check()
# holds (AVX512BW, VL and DQ on x86); elsewhere to its own kernels, and the oneDNN part is not asked.
flags = set()
try:
    for line in open("/proc/cpuinfo"):
        if line.startswith("flags"):
            flags = set(line.split(":", 1)[1].split())
            break
except OSError:
    pass
onednn_bf16 = {"avx512bw", "avx512vl", "avx512dq"} <= flags
print(f"  this CPU has AVX512BW/VL/DQ (oneDNN's bf16 path in 1.13): {onednn_bf16}")
from torch.profiler import profile
with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16), profile() as prof:
    model(x)
ops = {e.name for e in prof.events()}
print(f"  the bf16 Conv2d ran aten::mkldnn_convolution (oneDNN): {'aten::mkldnn_convolution' in ops}")
ok = ok and ("aten::mkldnn_convolution" in ops or not onednn_bf16)
# oneDNN logs every primitive it runs when ONEDNN_VERBOSE (DNNL_VERBOSE before 2.5) is set before
# it starts: a fresh process, a bf16 Linear under autocast, then the same Linear in float32.
import os
import subprocess
probe = """
import torch
m = torch.nn.Linear(784, 256).eval()
x = torch.randn(64, 784)
with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
    m(x)
print("--- float32", flush=True)
with torch.no_grad():
    m(x)
"""
env = dict(os.environ, ONEDNN_VERBOSE="1", DNNL_VERBOSE="1")
log = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True).stdout
bf16_part, _, fp32_part = log.partition("--- float32")
bf16_matmul = any(",exec," in l and ",matmul," in l and "src_bf16" in l for l in bf16_part.splitlines())
fp32_onednn = any(",exec," in l for l in fp32_part.splitlines())
print(f"  the bf16 Linear ran oneDNN's matmul: {bf16_matmul}; the float32 Linear went through oneDNN: {fp32_onednn}")
ok = ok and (bf16_matmul or not onednn_bf16) and not fp32_onednn
names = {name for _, name, _, _ in seen}
for must in ("BatchNorm2d", "ReLU", "MaxPool2d", "Conv2d", "Linear"):
    if must not in names:
        ok = False
        print(f"  no {must} ran")
print("claim holds" if ok else "claim does NOT hold")
sys.exit(0 if ok else 1)
