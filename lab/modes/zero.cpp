// ZeroRedundancyOptimizer's partition and parameter sync: see zero.h.
#include "zero.h"

#include <algorithm>
#include <cstring>
#include <numeric>

#include "communicator.h"
#include "model.h"
#include "mutation.h"

namespace lab {

std::vector<std::vector<int>> zero_partition(const std::vector<int64_t>& numels, int world) {
  std::vector<int> order(numels.size());
  std::iota(order.begin(), order.end(), 0);
  // sorted(params, key=numel, reverse=True): Python's sort is stable, reverse=True keeps ties in order
  if (!mutated("zero-partition-unsorted"))  // a lesson's mutation test (mutation.h)
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return numels[a] > numels[b]; });
  std::vector<std::vector<int>> per_rank(static_cast<size_t>(world));
  std::vector<int64_t> sizes(static_cast<size_t>(world), 0);
  for (int i : order) {
    // _get_min_index: the first rank with the smallest total
    const size_t r = static_cast<size_t>(std::min_element(sizes.begin(), sizes.end()) - sizes.begin());
    per_rank[r].push_back(i);
    sizes[r] += numels[static_cast<size_t>(i)];
  }
  return per_rank;
}

void zero_sync_params(Model& model, Communicator& comm, const std::vector<std::vector<int>>& partition,
                      bool bucket_view) {
  const std::vector<Param*> params = model.params();
  model.to_host(kStateParams);  // a device's parameters (executor.h: residency)
  std::vector<float> bucket;
  for (int src = 0; src < comm.world_size(); ++src) {
    const std::vector<int>& mine = partition[static_cast<size_t>(src)];
    if (!bucket_view) {
      for (int i : mine) {
        Tensor& v = params[static_cast<size_t>(i)]->value;
        comm.broadcast(v.ptr(), v.data.size() * sizeof(float), src, CollectiveInfo{"zero params", i});
      }
      continue;
    }
    // the rank's bucket: its parameters end to end (the parameters are views into it in PyTorch)
    bucket.clear();
    for (int i : mine) {
      const Tensor& v = params[static_cast<size_t>(i)]->value;
      bucket.insert(bucket.end(), v.data.begin(), v.data.end());
    }
    comm.broadcast(bucket.data(), bucket.size() * sizeof(float), src, CollectiveInfo{"zero bucket", src});
    size_t off = 0;
    for (int i : mine) {
      Tensor& v = params[static_cast<size_t>(i)]->value;
      std::memcpy(v.ptr(), bucket.data() + off, v.data.size() * sizeof(float));
      off += v.data.size();
    }
  }
  model.host_changed(kStateParams);
}

}  // namespace lab
