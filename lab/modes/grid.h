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

// "replica 0: 0 2 | replica 1: 1 3": the world ranks of each data-parallel replica, stage by stage;
// with tensor parallelism each stage's slices in brackets ("replica 0: [0 1] [4 5] | ...").
std::string grid_placement_text(const GridShape& g);

// {"dp": D, "pp": P, "tp": T, "ranks": [{"rank", "d", "p", "t"}...], "groups": {"dp": [[...], ...],
// "pp": ..., "tp": ...} (the axes of more than one rank), "bytes_per_iteration_by_group": {"dp": ...}}:
// bytes of the training iterations' messages (Chunk events) over each kind of group, per iteration;
// messages over the whole world count as "world".
nlohmann::json grid_summary(const GridShape& g, const std::vector<std::vector<Event>>& events);

}  // namespace lab
