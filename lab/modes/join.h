// DDP with uneven inputs: torch.distributed.algorithms.join.Join around a DistributedDataParallel
// (`with ddp.join():`, PyTorch 1.13, divide_by_initial_world_size=True). Ranks that run out of
// data "join": they keep answering the collectives of the ranks still training, with zeros.
//
// Per training iteration of a rank still training (DDP.forward with a join config):
//   A  notify    allreduce(1): counts the ranks still training (Join.notify_join_context);
//   B  buffers   if broadcast_buffers and the previous forward was synchronized: the authoritative
//                rank is the HIGHEST rank still training (_find_common_rank: all_reduce MAX of
//                own rank, -1 for joined ranks; rank 0 may have joined with stale buffers), whose
//                buffers are broadcast to every rank, joined ones included;
//   C  sync?     allreduce(1 if this backward synchronizes, else 0)
//                (_check_global_requires_backward_grad_sync);
//   D  backward  the gradient buckets' allreduces, divided by the initial world size as usual.
// Per iteration of a joined rank (_DDPJoinHook.main_hook), matching them one for one:
//   A' allreduce(0): the number of ranks still training; 0 means everyone has joined: stop;
//   B' if it syncs buffers: find_common_rank with -1, then receive the broadcast;
//   C' allreduce(0): whether the others synchronize; the next B' follows that answer;
//   D' if so, one allreduce of zeros per gradient bucket, in bucket order: a joined rank adds
//      nothing, and the ranks still training still divide by the world size.
// A joined rank neither computes nor steps: its parameters and momentum stay where they were.
// When every rank has joined (A' returns 0 everywhere), the post hook (_sync_final_model) agrees
// on the last joiner (the highest rank among those that never shadowed an iteration) and
// broadcasts its parameters and buffers to all: every rank leaves with that model (but keeps its
// own optimizer momentum, as in PyTorch).
// dtlab has no MAX reduction: find_common_rank is an allgather of the candidates and a max.
#pragma once

#include "communicator.h"
#include "ddp.h"
#include "model.h"

namespace lab {

class DdpJoin {
 public:
  DdpJoin(Model& model, Communicator& comm, DdpReducer& reducer, bool broadcast_buffers);

  // A, B, C before a training forward of a rank still training; B only when
  // require_forward_param_sync. grad_sync: this iteration's backward synchronizes (not no_sync).
  void before_forward(bool require_forward_param_sync, bool grad_sync);
  // One iteration of the joined rank's main hook (A' to D'). Returns false, having done only A',
  // when every rank has joined. Updates require_forward_param_sync as DDP's join hook does.
  bool shadow_iteration(bool& require_forward_param_sync);
  // The post hook: parameters and buffers from the last joiner to every rank.
  void sync_final_model(bool is_last_joiner);

 private:
  int find_common_rank(bool candidate);

  Model& m_model;
  Communicator& m_comm;
  DdpReducer& m_reducer;
  bool m_broadcast_buffers;
};

}  // namespace lab
