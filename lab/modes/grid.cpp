#include "grid.h"

#include <map>
#include <set>

namespace lab {

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
