# several-cores: "threads inside one process are torch.set_num_threads: the intra-op pool that
# splits one operator (a matrix product, a convolution) over the cores". Checked in PyTorch 1.13:
# set_num_threads sets the intra-op thread count that parallel_info reports, separately from the
# inter-op pool. Exit 0 / 1 / 77.
import sys

try:
    import torch
except ImportError as e:
    print(f"no python3-torch here ({e})")
    sys.exit(77)

before_inter = torch.get_num_interop_threads()
torch.set_num_threads(2)
info = torch.__config__.parallel_info()
ok_get = torch.get_num_threads() == 2
ok_info = "at::get_num_threads() : 2" in info
ok_inter = torch.get_num_interop_threads() == before_inter
torch.set_num_threads(1)
ok_one = torch.get_num_threads() == 1
print(f"torch {torch.__version__}")
print("\n".join("  " + line for line in info.splitlines()[:6]))
print(f"  set_num_threads(2) -> get_num_threads() == 2: {ok_get}; parallel_info says 2: {ok_info}")
print(f"  inter-op threads unchanged ({before_inter}): {ok_inter}; set_num_threads(1) -> 1: {ok_one}")
sys.exit(0 if ok_get and ok_info and ok_inter and ok_one else 1)
