// DistributedDataParallel's mechanics, as PyTorch 1.13 does them:
//  - construction broadcasts rank 0's parameters and buffers;
//  - gradients are grouped into buckets; each gradient is multiplied by 1/world_size while it is
//    copied into its bucket, and a bucket's allreduce (sum) starts once all of its gradients are
//    ready, buckets launched strictly in bucket-index order;
//  - the first iteration uses a single bucket holding every parameter; after it, buckets are
//    rebuilt in the order gradients became ready (reverse registration order), the first bucket
//    capped at 1 MiB and the others at bucket_cap_mb (a bucket closes once it reaches its cap);
//  - broadcast_buffers: before a forward that follows a synchronized training forward (and before
//    the first), rank 0's buffers overwrite every rank's.
#pragma once

#include <cstdint>
#include <vector>

#include "communicator.h"
#include "model.h"

namespace lab {

constexpr size_t kDefaultFirstBucketBytes = 1024 * 1024;

// PyTorch's compute_bucket_assignment_by_size for dense float32 tensors.
// param_bytes[i]: size of parameter i; order: the order in which to fill buckets;
// limits: cap of bucket 0, 1, ...; the last cap repeats. Returns parameter indices per bucket.
std::vector<std::vector<int>> compute_bucket_assignment(const std::vector<size_t>& param_bytes,
                                                        const std::vector<int>& order,
                                                        const std::vector<size_t>& limits);

class DdpReducer {
 public:
  DdpReducer(Model& model, Communicator& comm, double bucket_cap_mb);
  // Call before each backward.
  void prepare_for_backward();
  // The Model::backward hook: parameter i's gradient is final.
  void mark_param_ready(int i);
  // Call after backward: checks every bucket was reduced, records the ready order and rebuilds
  // buckets after the first iteration.
  void finalize_backward();

  const std::vector<std::vector<int>>& buckets() const { return m_buckets; }
  bool rebuilt() const { return m_rebuilt; }

 private:
  void reduce_bucket(size_t b);

  Model& m_model;
  Communicator& m_comm;
  std::vector<Param*> m_params;
  size_t m_cap_bytes;
  std::vector<std::vector<int>> m_buckets;
  std::vector<int> m_bucket_of;      // param index -> bucket
  std::vector<int> m_pending;        // per bucket: gradients not yet ready
  std::vector<char> m_ready;         // per param
  std::vector<int> m_ready_order;    // first iteration's ready order
  size_t m_next_bucket = 0;
  bool m_rebuilt = false;
  std::vector<float> m_flat;         // bucket contents, flattened
};

// Flattened float and int64 buffers of the model, broadcast from rank 0 (DDP's _sync_buffers).
void broadcast_buffers(Model& model, Communicator& comm);
// Parameters and buffers from rank 0 (DDP construction).
void broadcast_state(Model& model, Communicator& comm);

}  // namespace lab
