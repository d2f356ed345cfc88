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
// When a bucket's allreduce runs (BucketLaunch):
//  - CommThread: as in DDP, on the rank's communication thread (CommWorker) as soon as the bucket
//    is ready, in bucket-index order, while backward goes on computing earlier layers' gradients;
//  - AfterBackward (--no-overlap): every bucket after the whole backward, on the rank's thread;
//  - InHook: inside the ready hook, on the backward thread (backward waits for each allreduce).
// The bucket contents, the order of the collectives and the ring's reduction order are the same in
// all three, so the gradients are bitwise identical; only the timing differs.
// Where the buckets live: on a device whose memory the allreduce can work in (the model's
// executor has device_memory(), keeps its gradients there when asked, and the ring runs on a
// device-aware transport: Communicator::allreduce_on_device), the buckets are device memory and a
// gradient never visits the host: it is copied into its bucket and scaled there (or divided, by a
// hook), reduced chunk by chunk between the ranks' buckets, and copied back, as DDP does with CUDA
// tensors. Gradients the host keeps (BatchNorm's, finished on the host) go up into their bucket
// and come back down. Otherwise (the CPU; MPI ranks, the tree and the naive gather, which stage
// the device's buckets through the host) the buckets are host memory.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "comm_worker.h"
#include "communicator.h"
#include "model.h"

namespace lab {

enum class BucketLaunch { InHook, CommThread, AfterBackward };

constexpr size_t kDefaultFirstBucketBytes = 1024 * 1024;

// PyTorch's compute_bucket_assignment_by_size for dense float32 tensors.
// param_bytes[i]: size of parameter i; order: the order in which to fill buckets;
// limits: cap of bucket 0, 1, ...; the last cap repeats. Returns parameter indices per bucket.
std::vector<std::vector<int>> compute_bucket_assignment(const std::vector<size_t>& param_bytes,
                                                        const std::vector<int>& order,
                                                        const std::vector<size_t>& limits);

class DdpReducer {
 public:
  // launch CommThread needs a worker (owned by the rank, see comm_worker.h).
  DdpReducer(Model& model, Communicator& comm, double bucket_cap_mb, BucketLaunch launch = BucketLaunch::InHook,
             CommWorker* worker = nullptr);
  // Decides where the buckets live (above), once; prepare_for_backward does it too. A mode calls it
  // before a backward that is not reduced (no_sync), so that the gradients it accumulates are
  // already where the buckets will read them.
  void place();
  // Call before each backward.
  void prepare_for_backward();
  // The Model::backward hook: parameter i's gradient is final.
  void mark_param_ready(int i);
  // Call after backward: waits for (or runs) the buckets' allreduces, copies the averaged
  // gradients back, records the ready order and rebuilds buckets after the first iteration.
  void finalize_backward();

  // With a communication hook (post-localSGD), DDP copies gradients into the bucket unscaled and
  // the hook divides the bucket by the world size (tensor.div_), which can differ in the last bit
  // from DDP's own multiplication by 1/world_size when the world size is not a power of two.
  void set_divide_in_hook(bool on);
  // DDP join: a rank that ran out of data shadows one backward pass by allreducing a zero bucket
  // per bucket, in bucket order (_match_all_reduce_for_bwd_pass), on the calling thread.
  void allreduce_zero_buckets();

  const std::vector<std::vector<int>>& buckets() const { return m_buckets; }
  // Whether the buckets live on the model's device (above); decided at the first backward.
  bool buckets_on_device() const { return m_mem != nullptr; }
  bool rebuilt() const { return m_rebuilt; }
  // Bytes of the gradient buckets (memory.h's "comm_buffers"): every bucket's gradients, as
  // PyTorch's Reducer allocates them at DDP's construction (dtlab sizes its buffers at the first
  // backward that uses them; a resumed local SGD run past its warm-up never does).
  int64_t bucket_bytes() const {
    int64_t b = 0;
    for (size_t i = 0; i < m_buckets.size(); ++i) b += static_cast<int64_t>(bucket_size(i)) * 4;
    return b;
  }
  // From a checkpoint: the buckets as the reducer had them (after the rebuild, in the first
  // iteration's gradient-ready order).
  void restore_buckets(const std::vector<std::vector<int>>& buckets, bool rebuilt);

 private:
  void launch_bucket(size_t b);
  void copy_in(size_t b);
  void allreduce_bucket(size_t b);
  void copy_out(size_t b);

  Model& m_model;
  Communicator& m_comm;
  BucketLaunch m_launch;
  CommWorker* m_worker;
  bool m_divide = false;
  std::vector<Param*> m_params;
  size_t m_cap_bytes;
  std::vector<std::vector<int>> m_buckets;
  std::vector<int> m_bucket_of;      // param index -> bucket
  std::vector<int> m_pending;        // per bucket: gradients not yet ready
  std::vector<char> m_ready;         // per param
  std::vector<int> m_ready_order;    // first iteration's ready order
  size_t m_next_bucket = 0;
  bool m_rebuilt = false;
  bool m_launch_unfinished = false;  // mutation ddp-launch-unfinished-bucket (mutation.h), read per iteration
  // Per bucket: its gradients, flattened and scaled (one buffer per bucket: with CommThread the
  // rank thread fills bucket b + 1 while the worker reduces bucket b).
  std::vector<std::vector<float>> m_flat;
  // The same in device memory, when the buckets live there (m_mem set).
  struct DeviceBucket {
    DeviceMemory* mem = nullptr;
    float* data = nullptr;
    size_t capacity = 0, count = 0;
    DeviceBucket() = default;
    DeviceBucket(const DeviceBucket&) = delete;
    DeviceBucket& operator=(const DeviceBucket&) = delete;
    DeviceBucket(DeviceBucket&& o) noexcept { *this = std::move(o); }
    DeviceBucket& operator=(DeviceBucket&& o) noexcept;
    ~DeviceBucket();
    void resize(DeviceMemory& m, size_t n);  // count = n; grown (contents dropped) as needed
  };
  DeviceMemory* m_mem = nullptr;
  bool m_placed = false;  // where the buckets live has been decided
  std::vector<DeviceBucket> m_dflat;
  size_t bucket_size(size_t b) const;
};

// Flattened float and int64 buffers of the model, broadcast from `root` (DDP's _sync_buffers:
// rank 0, or with join the common rank agreed on by the ranks still training).
void broadcast_buffers(Model& model, Communicator& comm, int root = 0);
// Parameters and buffers from `root` (DDP construction; with join, the final model sync).
void broadcast_state(Model& model, Communicator& comm, int root = 0);

}  // namespace lab
