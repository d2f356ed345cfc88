# reproducibility: "on GPUs, same seed is not same bits unless asked: cuDNN picks algorithms by
# benchmarking (torch.backends.cudnn.benchmark) and some of them are nondeterministic
# (torch.backends.cudnn.deterministic; use_deterministic_algorithms lists Conv2d on CUDA), some
# CUDA kernels add with atomics (index_add, scatter_add_), and cuBLAS needs CUBLAS_WORKSPACE_CONFIG=:4096:8 (or :16:8) to be deterministic."
# Checked against PyTorch 1.13 itself: the flags exist with these defaults, and
# torch.use_deterministic_algorithms's own documentation lists exactly these causes. (A GPU run
# would show the differences themselves; this machine may have none.) Exit 0 / 1 / 77.
import sys

try:
    import torch
except ImportError as e:
    print(f"no python3-torch here ({e})")
    sys.exit(77)

doc = torch.use_deterministic_algorithms.__doc__ or ""
found = {
    "cudnn.benchmark defaults to False": torch.backends.cudnn.benchmark is False,
    "cudnn.deterministic defaults to False": torch.backends.cudnn.deterministic is False,
    "deterministic algorithms are off by default": torch.are_deterministic_algorithms_enabled() is False,
    "the docs name CUBLAS_WORKSPACE_CONFIG": "CUBLAS_WORKSPACE_CONFIG" in doc and ":4096:8" in doc,
    "the docs list Conv2d on CUDA as normally nondeterministic": "torch.nn.Conv2d` when called on CUDA tensor" in doc,
    "the docs list CUDA index_add and scatter_add_ (atomic adds)": "torch.index_add` when called on CUDA tensor" in doc
    and "scatter_add_` when called on a CUDA tensor" in doc,
}
print(f"torch {torch.__version__}")
for what, ok in found.items():
    print(f"  {'yes' if ok else 'NO '}  {what}")
sys.exit(0 if all(found.values()) else 1)
