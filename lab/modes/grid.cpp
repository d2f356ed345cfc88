#include "grid.h"

#include <map>
#include <set>
#include <utility>

#include "communicator.h"
#include "errors.h"
#include "mode.h"
#include "model.h"
#include "safetensors.h"
#include "tensor_parallel.h"

namespace lab {

namespace {

ModeSetting grid_axis_setting(const char* axis, int64_t min, const char* pytorch, std::string help) {
  ModeSetting m;
  m.field = m.label = axis;
  m.flag = std::string("--") + axis;
  m.min = min;
  m.pytorch = pytorch;
  m.help = std::move(help);
  return m;
}

}  // namespace

ModeSetting grid_dp_setting(std::string help) {
  return grid_axis_setting("dp", 1, "data-parallel group size", std::move(help));
}

ModeSetting grid_tp_setting(std::string help) {
  return grid_axis_setting("tp", 0, "Megatron-LM's tensor_model_parallel_size", std::move(help));
}

namespace {

// Runs f on a group's communicator at the world's step, adding what it sent to the world's count.
template <class F>
void on_group(Communicator& group, Communicator& world, int64_t step, F&& f) {
  const uint64_t before = group.bytes_sent();
  const int64_t was = group.train_step();
  group.set_train_step(step);
  f();
  group.set_train_step(was);
  if (&group != &world) world.add_bytes_sent(group.bytes_sent() - before);
}

}  // namespace

void save_slices(Model& sliced, ModeCheckpoint& mc) {
  for (SafeTensor t : model_tensors(sliced)) {
    t.name = "tp." + t.name;
    mc.tensors.push_back(std::move(t));
  }
}

void restore_slices(Model& sliced, const ModeCheckpoint& mc, int rank) {
  std::vector<SafeTensor> mine;
  for (const SafeTensor& t : mc.tensors)
    if (t.name.rfind("tp.", 0) == 0) {
      mine.push_back(t);
      mine.back().name = t.name.substr(3);
    }
  load_model_tensors(sliced, mine, "the checkpoint of rank " + std::to_string(rank) + " (its slices, tp.*)");
}

std::vector<std::string> slice_param_names(Model& sliced, const std::vector<Param*>& params) {
  return param_names(sliced, params, "tp.");
}

void allreduce_over_group(float* data, size_t count, const CollectiveInfo& info, Communicator& group,
                          Communicator& world) {
  on_group(group, world, world.train_step(), [&] { group.allreduce_sum(data, count, info); });
}

void average_over_group(const std::vector<Param*>& params, Communicator& group, Communicator& world, int tag,
                        std::vector<float>& flat) {
  size_t n = 0;
  for (const Param* p : params) n += p->grad.data.size();
  flat.resize(n);
  const float scale = static_cast<float>(1.0 / group.world_size());  // PyTorch multiplies by 1/world_size
  size_t off = 0;
  for (const Param* p : params)
    for (float g : p->grad.data) flat[off++] = g * scale;
  on_group(group, world, world.train_step(), [&] { group.allreduce_sum(flat.data(), n, CollectiveInfo{"grad bucket", tag}); });
  off = 0;
  for (Param* p : params)
    for (float& g : p->grad.data) g = flat[off++];
  std::vector<float>().swap(flat);
}

void gather_slices(TensorParallelModel& tp, Communicator& group, Communicator& world, Model& whole) {
  const size_t n = tp.packed_floats(), ranks = static_cast<size_t>(group.world_size());
  std::vector<float> packed(n), gathered(n * ranks);
  tp.pack(packed.data());
  // (an evaluation's, not an iteration's: a periodic evaluation comes while the step is still set)
  on_group(group, world, -1, [&] { group.allgather(packed.data(), n, gathered.data(), CollectiveInfo{"tp shards", -1}); });
  for (size_t r = 0; r < ranks; ++r) tp.unpack(gathered.data() + r * n, static_cast<int>(r), whole);
  tp.store_whole(whole);
}

std::string grid_placement_text(const GridShape& g) {
  std::string s;
  for (int d = 0; d < g.dp; ++d) {
    s += (d ? " | " : "") + std::string("replica ") + std::to_string(d) + ":";
    for (int p = 0; p < g.pp; ++p) {  // a stage's slices in brackets: "[0 1]"
      s += g.tp > 1 ? " [" : " ";
      for (int t = 0; t < g.tp; ++t) s += (t ? " " : "") + std::to_string(g.rank_of({d, p, t}));
      if (g.tp > 1) s += "]";
    }
  }
  return s;
}

nlohmann::json grid_summary(const GridShape& g, const std::vector<std::vector<Event>>& events) {
  nlohmann::json ranks = nlohmann::json::array();
  for (int r = 0; r < g.size(); ++r) {
    const GridCoords c = g.coords(r);
    ranks.push_back({{"rank", r}, {"d", c.d}, {"p", c.p}, {"t", c.t}});
  }
  // Each group once: the groups of every rank, deduplicated by their members
  auto groups_of = [&](std::vector<int> (GridShape::*members)(int) const) {
    std::set<std::vector<int>> seen;
    nlohmann::json out = nlohmann::json::array();
    for (int r = 0; r < g.size(); ++r) {
      std::vector<int> m = (g.*members)(r);
      if (seen.insert(m).second) out.push_back(m);
    }
    return out;
  };
  nlohmann::json groups = nlohmann::json::object();
  if (g.dp > 1) groups["dp"] = groups_of(&GridShape::data_group);
  if (g.pp > 1) groups["pp"] = groups_of(&GridShape::pipeline_group);
  if (g.tp > 1) groups["tp"] = groups_of(&GridShape::tensor_group);
  std::map<std::string, uint64_t> bytes;
  std::set<int64_t> iterations;
  for (const auto& rank_events : events)
    for (const Event& e : rank_events)
      if (e.kind == EventKind::Chunk && e.train_step >= 0) {
        bytes[e.group[0] ? e.group : "world"] += e.bytes;
        iterations.insert(e.train_step);
      }
  nlohmann::json per_group = nlohmann::json::object();
  for (const auto& [name, b] : bytes)
    per_group[name] = static_cast<double>(b) / static_cast<double>(std::max<size_t>(1, iterations.size()));
  return {{"dp", g.dp}, {"pp", g.pp}, {"tp", g.tp}, {"ranks", ranks}, {"groups", groups},
          {"bytes_per_iteration_by_group", per_group},
          {"what", "Megatron-LM's placement, world rank = t + T (d + D p): the slices of a layer (t) on neighbouring "
                   "ranks, then the data-parallel replicas (d), then the pipeline stages (p); groups: the ranks that "
                   "differ in one coordinate; bytes: what the training iterations' messages carried in each kind of "
                   "group, per iteration"}};
}

}  // namespace lab
