// torch.distributed.optim.ZeroRedundancyOptimizer (PyTorch 1.13) = ZeRO stage 1: the optimizer's
// state is sharded, whole parameters at a time; gradients are not (DDP still allreduces them all).
//
// Partition (ZeroRedundancyOptimizer._partition_parameters): the parameters sorted by number of
// elements, largest first (a stable sort: ties keep registration order); each in turn goes to the
// rank with the smallest running total of elements so far (ties: the lowest rank). A rank's list
// keeps the order its parameters were assigned in.
//
// After its local optimizer steps its own parameters, every rank r in turn broadcasts them
// (_sync_params: src = r, for r = 0 .. N-1): one broadcast per parameter, in its list's order, or,
// with parameters_as_bucket_view, one per rank of its parameters laid end to end (the bucket).
// The gradient is DDP's allreduced one and the update is elementwise, so the parameters are
// bitwise those of DDP with the same optimizer (measured on 1.13/gloo; tests/test_zero.cpp).
#pragma once

#include <cstdint>
#include <vector>

namespace lab {

class Communicator;
class Model;

// Per rank, the indices (params() order) of the parameters it owns, in the order they were assigned.
std::vector<std::vector<int>> zero_partition(const std::vector<int64_t>& numels, int world);

// Every rank's parameters from their owner (_sync_params), on the host (a device's parameters are
// brought there and back). bucket_view: one broadcast per rank instead of one per parameter.
void zero_sync_params(Model& model, Communicator& comm, const std::vector<std::vector<int>>& partition,
                      bool bucket_view);

}  // namespace lab
