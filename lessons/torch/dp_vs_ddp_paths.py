"""dp-vs-ddp: what PyTorch 1.13's nn.DataParallel and DistributedDataParallel do, as the lesson
states it. DataParallel needs GPUs, so this reads the functions it calls (inspect.getsource) and
runs the parts that run on the CPU:
  1. DataParallel.forward: scatter, replicate (every forward), parallel_apply, gather.
  2. replicate copies parameters and buffers with comm.broadcast_coalesced; the gradients flow
     back through Broadcast.backward -> ReduceAddCoalesced -> comm.reduce_add_coalesced ->
     comm.reduce_add.
  3. reduce_add uses NCCL's reduce when nccl.is_available(inputs); otherwise (the path the lab
     shows) device 0's tensor plus every other device's, copied to device 0, in device order.
     (broadcast_coalesced is C++: torch/csrc/cuda/comm.cpp, cited in the lesson.)
  4. DDP's constructor broadcasts the module's state with dist._broadcast_coalesced in buckets of
     250 MiB (broadcast_bucket_size); the route is the backend's.
  5. scatter cuts the batch like torch.chunk (32 each for 128 over 4 devices); DistributedSampler
     (shuffle=False) gives rank r the samples r, r + 4, r + 8, ...
  6. SyncBatchNorm supports DistributedDataParallel only (its documentation).
Exit 0: every claim holds; 1: PyTorch does otherwise (printed); 77: no torch."""
import importlib
import inspect
import re
import sys

try:
    import torch
    fn = importlib.import_module("torch.nn.parallel._functions")
    comm = importlib.import_module("torch.nn.parallel.comm")
    rep = importlib.import_module("torch.nn.parallel.replicate")  # the module, not the function it exports
    from torch.nn.parallel import DataParallel, DistributedDataParallel
    from torch.utils.data import DistributedSampler
except ImportError:
    print("skipped: no python3-torch")
    sys.exit(77)

failed = []


def expect(what, ok):
    print(("holds: " if ok else "DOES NOT HOLD: ") + what)
    if not ok:
        failed.append(what)


def code(f):
    return re.sub(r"\s+", " ", inspect.getsource(f))


fwd = code(DataParallel.forward)
order = [fwd.find(s) for s in ("self.scatter(", "self.replicate(", "self.parallel_apply(", "self.gather(")]
expect("DataParallel.forward calls scatter, replicate, parallel_apply, gather in that order, every forward",
       all(i >= 0 for i in order) and order == sorted(order))
expect("replicate copies parameters and buffers with comm.broadcast_coalesced (through Broadcast.apply)",
       "Broadcast.apply(" in code(rep._broadcast_coalesced_reshape)
       and "comm.broadcast_coalesced(" in code(rep._broadcast_coalesced_reshape)
       and "comm.broadcast_coalesced(" in code(fn.Broadcast.forward)
       and "_broadcast_coalesced_reshape(params" in code(rep.replicate))
expect("the replicas' gradients are summed by ReduceAddCoalesced -> comm.reduce_add_coalesced -> reduce_add",
       "ReduceAddCoalesced.apply(" in code(fn.Broadcast.backward)
       and "comm.reduce_add_coalesced(" in code(fn.ReduceAddCoalesced.forward)
       and "reduce_add(flat_tensors, destination)" in code(comm.reduce_add_coalesced))
ra = code(comm.reduce_add)
nccl_at, else_at = ra.find("if nccl.is_available(inputs):"), ra.find("else:", ra.find("nccl.reduce("))
fallback = ra[else_at:]
expect("reduce_add uses NCCL's reduce when NCCL is available, else adds on the destination device in device "
       "order: inputs[root] + nonroot[0], then += each further one",
       nccl_at >= 0 and "nccl.reduce(inputs" in ra and else_at > nccl_at
       and "result = inputs[root_index] + nonroot[0].to(" in fallback
       and "for other in nonroot[1:]: result.add_(other.to(" in fallback)
init = code(DistributedDataParallel.__init__)
expect("DDP's constructor broadcasts the module's state (_sync_module_states) in buckets of 250 MiB",
       "self.broadcast_bucket_size = int(250 * 1024 * 1024)" in init and "_sync_module_states(" in init)
sizes = [len(c) for c in torch.chunk(torch.arange(128), 4)]
expect(f"torch.chunk cuts 128 samples over 4 devices into {sizes}", sizes == [32, 32, 32, 32])
shard = list(DistributedSampler(range(1024), num_replicas=4, rank=1, shuffle=False))
expect(f"DistributedSampler(shuffle=False) gives rank 1 the samples {shard[:4]}...",
       shard == list(range(1, 1024, 4)))
doc = re.sub(r"\s+", " ", torch.nn.SyncBatchNorm.__doc__)
expect("SyncBatchNorm's documentation: it supports DistributedDataParallel (one GPU per process) only",
       "only supports :class:`~torch.nn.DistributedDataParallel` (DDP) with single GPU per process" in doc)
if failed:
    sys.exit(1)
