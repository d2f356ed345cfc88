# matrix-chain: "torch.linalg.multi_dot picks the order with the fewest FLOPs": for A1 (8 x 2048)
# A2 A3 (2048 x 2048) A4 (2048 x 8) it never multiplies the two square matrices. Checked in
# PyTorch 1.13 by recording the shapes of the matrix products multi_dot calls (the profiler),
# and the result against the left-to-right product. Exit 0 / 1 / 77.
import sys

try:
    import torch
    from torch.profiler import ProfilerActivity, profile
except ImportError as e:
    print(f"no python3-torch here ({e})")
    sys.exit(77)

torch.manual_seed(0)
dims = [8, 2048, 2048, 2048, 8]
mats = [torch.rand(dims[i], dims[i + 1]) * 2 - 1 for i in range(4)]
with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
    out = torch.linalg.multi_dot(mats)
products = [e.input_shapes[:2] for e in prof.events() if e.name == "aten::mm"]
flops = sum(2 * a[0] * a[1] * b[1] for a, b in products if len(a) == 2 and len(b) == 2)
square = [p for p in products if p == [[2048, 2048], [2048, 2048]]]
ref = ((mats[0] @ mats[1]) @ mats[2]) @ mats[3]
rel = ((out - ref).abs().max() / ref.abs().max()).item()
print(f"torch {torch.__version__}: multi_dot's products {products}")
print(f"  FLOPs {flops} (cheapest order: {2 * (8 * 2048 * 2048 * 2 + 8 * 2048 * 8)}); square products: {len(square)}; "
      f"max difference from ((A1 A2) A3) A4: {rel:.2g} of the largest entry")
sys.exit(0 if products and not square and flops == 2 * (8 * 2048 * 2048 * 2 + 8 * 2048 * 8) and rel < 1e-4 else 1)
