// nn.DataParallel as PyTorch 1.13 runs it: ONE process, one DataLoader, k devices. dtlab emulates
// device i as rank thread i, so the replicas compute concurrently and every transfer between
// device 0 and device i is a real message (recorded as an event, slowed by a simulated link).
//
// One training iteration on a global batch of B samples (data_parallel.py: scatter, replicate,
// parallel_apply, gather; then loss, backward, step on device 0):
//   1. scatter    device 0 -> i: chunk i of the inputs. Chunks as torch.chunk: ceil(B/k) samples
//                 each, the last one shorter, and fewer than k chunks when B is small
//                 (B = 10, k = 4: 3, 3, 3, 1; B = 6, k = 4: 2, 2, 2 and device 3 idles).
//   2. replicate  device 0 -> i (every device with a chunk, every iteration): the module's
//                 parameters AND buffers. Replica 0 is the module itself (broadcast_coalesced
//                 returns the source tensors for the source device), so only replica 0's
//                 BatchNorm buffer updates survive; the others' are overwritten next iteration.
//   3. forward    every replica on its own chunk, in train mode: its own BatchNorm statistics.
//                 A chunk of one sample raises the batch-of-one error on that replica.
//   4. gather     device i -> 0: the replica's outputs (n_i, 10), concatenated on device 0.
//   5. loss       on device 0, over the whole batch (mean over B); dlogits (B, 10).
//   6. scatter    device 0 -> i: rows of dlogits (Gather's backward is a Scatter).
//   7. backward   every replica on its chunk.
//   8. reduce     device i -> 0: the replica's gradients; device 0 adds them to its own in device
//                 order, ((g0 + g1) + g2) + ... (comm.reduce_add: the root's tensor, then the
//                 others one by one) - the sum, not the mean: the loss already divided by B.
//   9. step       SGD on device 0.
// Device 0 carries every transfer: the master bottleneck DDP removes. This is PyTorch's path
// without NCCL: torch/csrc/cuda/comm.cpp's broadcast copies the flattened parameters to each
// device in turn, torch/nn/parallel/comm.py's reduce_add adds each device's gradients, copied to
// device 0, to device 0's in device order. With NCCL (nccl::is_available), broadcast_coalesced
// and reduce_add_coalesced call NCCL's broadcast and reduce instead, which pass the bytes from
// device to device (and sum in NCCL's order). On the simulated network (link_model.h) device 0's
// sends leave through its one link out one after another, and the gradients come in through its
// one link in one after another: (N-1) model sizes each way per iteration.
//
// Data order: DataLoader(dataset, batch_size=B, shuffle=True,
// generator=torch.Generator().manual_seed(seed)) - SingleProcessLoader.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "communicator.h"
#include "model.h"
#include "optim.h"
#include "torch_rng.h"

namespace lab {

// torch.chunk(tensor of `batch` rows, chunks): sizes of the pieces (ceil(batch/chunks) each, the
// last one the remainder); empty for batch 0.
std::vector<int64_t> torch_chunk_sizes(int64_t batch, int chunks);

// The batches of DataLoader(dataset of `length`, batch_size, shuffle, drop_last,
// generator=torch.Generator().manual_seed(seed)), epoch after epoch. With shuffle, each epoch's
// iterator first draws a 64-bit base seed from the generator (_BaseDataLoaderIter), then
// RandomSampler draws randperm(length) and a second, discarded randperm(length) for its empty tail;
// the generator's state carries over to the next epoch. Without shuffle: 0..length-1.
class SingleProcessLoader {
 public:
  SingleProcessLoader(int64_t length, int64_t batch_size, bool shuffle, bool drop_last, uint64_t seed);
  std::vector<std::vector<int64_t>> next_epoch();

 private:
  int64_t m_length, m_batch;
  bool m_shuffle, m_drop_last;
  TorchGenerator m_gen;
};

struct DpStepResult {
  std::vector<int64_t> chunks;  // torch.chunk sizes of this batch over the devices
  int64_t my_chunk = 0;         // samples this device worked on (0: idle this iteration)
  float loss = 0;               // device 0: the loss over the whole batch; others: NaN
  int correct = 0;              // device 0: over the whole batch
};

class DataParallelDevice {
 public:
  // device = comm.rank(), devices k = comm.world_size(). opt: the module's optimizer (used on
  // device 0 only).
  DataParallelDevice(Model& model, Communicator& comm, Optimizer& opt);

  // One training iteration (steps 1-9 above), called by every device with the same `batch`.
  // x: (B, 1, 28, 28) and labels (B,) are read on device 0 only. where: "batch 3 of epoch 0", for
  // the batch-of-one hint. before_backward: called before this device's backward (failure
  // injection).
  DpStepResult train_step(const Tensor& x, const std::vector<int>& labels, int64_t batch, const std::string& where,
                          const std::function<void()>& before_backward = {});
  // Replicate only: device 0's parameters and buffers to every other device (before evaluating).
  void replicate_all();

 private:
  void send(int peer, const void* data, size_t bytes, uint64_t seq, Phase phase, const char* op, const char* what);
  void recv(int peer, void* data, size_t bytes, uint64_t seq);
  template <class Body>
  void collective(const char* op, const char* what, uint64_t seq, uint64_t bytes, Body&& body);
  std::vector<uint8_t> pack_state();
  void unpack_state(const std::vector<uint8_t>& bytes);

  Model& m_model;
  Communicator& m_comm;
  Optimizer& m_opt;
  int m_device, m_devices;
  Tensor m_x, m_logits, m_dlogits;  // this device's chunk (n, 1, 28, 28), outputs and their grad (n, 10)
  std::vector<float> m_grads;       // flat gradients (device i's send; device 0's receive buffer)
};

}  // namespace lab
