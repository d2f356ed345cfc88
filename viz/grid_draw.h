// The grid of parallelism a run's ranks are placed on (lab/comm/group_transport.h), its traffic in
// one iteration by kind of group, and its drawing: the Grid view's (panel_grid.cpp), also drawn by
// the Pipeline view under --dp.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <utility>

#include "group_transport.h"
#include "run_data.h"

namespace viz {

enum GridKind { kGridDp = 0, kGridPp, kGridTp, kGridKinds };

// The run's grid: --mode pipeline (dp x stages), --mode tensor (dp x tp); every other mode is one
// data-parallel group of the whole world.
lab::GridShape run_grid(const lab::RunConfig& c);

struct GridTraffic {
  std::map<int, uint64_t> bytes[kGridKinds];      // per group of each kind (group_index), this iteration
  std::map<std::pair<int, int>, uint64_t> pairs;  // pipeline neighbours (lower rank, higher rank)
  std::set<std::string> what[kGridKinds];         // what the trace says travels in each kind
  uint64_t other = 0;                             // bytes over the whole world of a grid of several axes
  bool empty() const { return bytes[kGridDp].empty() && bytes[kGridPp].empty() && bytes[kGridTp].empty() && !other; }
};
// The messages (Chunk events) of training iteration `step`, by the group they travelled in.
GridTraffic grid_traffic(const RunData& d, const lab::GridShape& g, int64_t step);

// The ranks as boxes: a row per replica, a box per stage holding its slices; the groups between
// them with the iteration's bytes; a rank's groups on hover.
void draw_rank_grid(const lab::GridShape& g, const GridTraffic& t);

}  // namespace viz
