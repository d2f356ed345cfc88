// What a mode that places its ranks on a grid of parallelism (group_transport.h: data x pipeline x
// tensor) reports: the placement, in the run header and in summary.json's "grid" section, the
// record the grid views read.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "events.h"
#include "group_transport.h"

namespace lab {

class Communicator;
class Model;
struct ModeSetting;
struct Param;
class TensorParallelModel;

// The grid's axes as settings of the modes that place ranks on it (pipeline, tensor): --dp (at
// least 1) and --tp (0: the mode's default), each with the help the mode gives it.
ModeSetting grid_dp_setting(std::string help);
ModeSetting grid_tp_setting(std::string help);

// What a grid mode runs over a group's communicator (Communicator::sub), recorded at the world
// communicator's step (train_step: -1 for an evaluation's) and counted in the rank's bytes sent.
//   average_over_group: DDP's averaging of `params`' gradients over a data-parallel group: one
//     bucket, each gradient multiplied by 1/D (as PyTorch does), summed by the group's allreduce
//     ("grad bucket", tag), written back. flat: the bucket's buffer (freed after).
//   gather_slices: every slice of a tensor-parallel group into `whole` (an allgather of each rank's
//     packed slices, "tp shards", recorded outside any iteration), then what every rank holds whole.
//   allreduce_over_group: a sum over the group (f's and g's allreduce of a tensor-parallel group).
struct CollectiveInfo;
void allreduce_over_group(float* data, size_t count, const CollectiveInfo& info, Communicator& group,
                          Communicator& world);
void average_over_group(const std::vector<Param*>& params, Communicator& group, Communicator& world, int tag,
                        std::vector<float>& flat);
void gather_slices(TensorParallelModel& tp, Communicator& group, Communicator& world, Model& whole);

// Checkpoints of a rank that holds slices (tensor_parallel.h): its sliced model's parameters and
// buffers as tensors named "tp.<state_dict name>" (the whole model the rank keeps is stale between
// evaluations), and back; the optimizer's parameters (some of the sliced model's) by those names.
struct ModeCheckpoint;
void save_slices(Model& sliced, ModeCheckpoint& mc);
void restore_slices(Model& sliced, const ModeCheckpoint& mc, int rank);
std::vector<std::string> slice_param_names(Model& sliced, const std::vector<Param*>& params);

// "replica 0: 0 2 | replica 1: 1 3": the world ranks of each data-parallel replica, stage by stage;
// with tensor parallelism each stage's slices in brackets ("replica 0: [0 1] [4 5] | ...").
std::string grid_placement_text(const GridShape& g);

// {"dp": D, "pp": P, "tp": T, "ranks": [{"rank", "d", "p", "t"}...], "groups": {"dp": [[...], ...],
// "pp": ..., "tp": ...} (the axes of more than one rank), "bytes_per_iteration_by_group": {"dp": ...}}:
// bytes of the training iterations' messages (Chunk events) over each kind of group, per iteration;
// messages over the whole world count as "world".
nlohmann::json grid_summary(const GridShape& g, const std::vector<std::vector<Event>>& events);

}  // namespace lab
