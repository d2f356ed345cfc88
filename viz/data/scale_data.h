// The Scale view's data (viz/panel_scale.cpp), as plain C++: collectives on 8 to 4,096 GPUs from
// the simulator (lab/sim/collective_sim.h), and the emulated run's own allreduces beside the
// simulator's prediction for its link.
//
//   ScaleSettings   what the view's controls chose: a topology preset (or a simulate run's own
//                   topology), the collective, NCCL's protocol or the wire, the channels, the node
//                   count N (1 .. 512, powers of two) and the size S (1 KiB .. 8 GiB, powers of two)
//   ScaleCharts     the charts' points: every algorithm over the node counts at S (busbw and time
//                   against N) and over the sizes at N (busbw against S), each point one
//                   simulate_collective
//   ScaleSim        computes the points off the GUI thread and keeps every result (a simulated
//                   collective on 4,096 GPUs takes milliseconds; a chart of 24 sizes on 512 nodes a
//                   second): the view draws what is ready and asks again next frame
//   ring_tree_crossover   the first size where ring's time is below dbtree's
//   SimulateRun     a `dtlab simulate --json` result (a lesson's simulate run leaves it as result.json
//                   in its directory): its topology, collective, protocol, channels, algorithms, node
//                   counts and sizes
//   ScaleSetup      the view's settings for such a run at an observation's N and S (a lesson's
//                   [[observe]] with view = "scale": nodes, size), and the line saying where they came from
//   EmulatedRun     a run trained with the link model (--link-gbps, --link-latency-us, nodes with
//                   --link-gpus-per-node ...): its gradient buckets' allreduces as measured, and the
//                   simulator's `wire` prediction on the run's link as a Topology
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "collective_sim.h"
#include "config.h"
#include "events.h"
#include "run_data.h"
#include "topology.h"

namespace viz {

constexpr int kScaleMaxNodes = 512;                         // 4,096 GPUs of 8
constexpr uint64_t kScaleMinBytes = uint64_t{1} << 10;      // 1 KiB
constexpr uint64_t kScaleMaxBytes = uint64_t{8} << 30;      // 8 GiB

// Whether two topologies describe the same machine: every field but the node count, the name and
// the description.
bool scale_same_machine(const lab::Topology& a, const lab::Topology& b);

struct ScaleSettings {
  std::string preset = "dgx-h100";           // a preset's name; with `custom`, that topology's name
  std::optional<lab::Topology> custom;       // a simulate run's topology that is no preset (a file's, or a
                                             // preset with --gpus-per-node); its node count is ignored
  lab::SimCollective collective = lab::SimCollective::Allreduce;
  lab::SimProtocol protocol = lab::SimProtocol::Simple;
  int channels = 0;                          // NCCL's channels (0: the default, sim_default_channels)
  int nodes = 128;                           // a power of two, 1 .. kScaleMaxNodes
  uint64_t bytes = uint64_t{16} << 20;       // a power of two, kScaleMinBytes .. kScaleMaxBytes
  bool operator==(const ScaleSettings& o) const {
    return preset == o.preset && custom.has_value() == o.custom.has_value() &&
           (!custom || scale_same_machine(*custom, *o.custom)) && collective == o.collective && protocol == o.protocol &&
           channels == o.channels && nodes == o.nodes && bytes == o.bytes;
  }
  bool operator!=(const ScaleSettings& o) const { return !(*this == o); }
};

std::vector<int> scale_node_counts();          // 1, 2, 4, ..., 512
std::vector<uint64_t> scale_sizes();           // 1 KiB, 2 KiB, ..., 8 GiB
const std::vector<lab::SimAlgorithm>& scale_algorithms();  // ring, rhd, dbtree, hier
// "1 KiB", "64 MiB", "8 GiB": a size in powers of 1024, as `dtlab simulate --sizes` reads them.
std::string scale_size_text(uint64_t bytes);
// The preset (topology.h) on `nodes` nodes. Throws ConfigError for an unknown preset.
lab::Topology scale_topology(const std::string& preset, int nodes);
// The settings' topology (custom, else the preset) on `nodes` nodes.
lab::Topology scale_topology(const ScaleSettings& s, int nodes);

// One point of a chart: a collective of `bytes` on `nodes` nodes, once simulated.
struct ScalePoint {
  int nodes = 0, gpus = 0;
  uint64_t bytes = 0;
  bool ready = false;
  std::string error;    // the simulator threw (ready, no result)
  lab::SimResult r;
};

struct ScaleSeries {
  lab::SimAlgorithm algo = lab::SimAlgorithm::Ring;
  bool supported = true;  // sim_supports on every point's ranks
  std::string why;        // ... and why not
  std::vector<ScalePoint> points;
};

struct ScaleCharts {
  ScaleSettings settings;
  std::vector<ScaleSeries> by_nodes;  // [algorithm] over scale_node_counts(), at settings.bytes
  std::vector<ScaleSeries> by_size;   // [algorithm] over scale_sizes(), on settings.nodes nodes
  int missing = 0;                    // points of supported series not ready yet
  const ScaleSeries* nodes_series(lab::SimAlgorithm a) const;
  const ScaleSeries* size_series(lab::SimAlgorithm a) const;
};
// The charts' points for these settings, none computed yet (ScaleSim::fill computes them).
ScaleCharts scale_charts(const ScaleSettings& s);

// A collective to simulate, and the key its result is kept under (every field of the topology and
// the options, and the size).
struct ScaleJob {
  lab::Topology topo;
  lab::SimOptions opts;
  uint64_t bytes = 0;
  std::string key;
};
ScaleJob scale_job(const lab::Topology& t, const lab::SimOptions& o, uint64_t bytes);

// The results, computed on a worker thread (background) or on the caller's (not). Results are
// kept (up to kMaxKept; then the oldest go), so settings seen before draw at once.
class ScaleSim {
 public:
  static constexpr size_t kMaxKept = 200000;
  explicit ScaleSim(bool background = true);
  ~ScaleSim();
  ScaleSim(const ScaleSim&) = delete;
  ScaleSim& operator=(const ScaleSim&) = delete;

  // Fills the points of `c` whose results are known; the others are queued (replacing what was
  // queued before: only the latest settings are worth computing) or, with wait (or without a
  // worker), computed here before it returns. Returns c.missing.
  int fill(ScaleCharts& c, bool wait);
  // One collective: the kept result, or computed here.
  lab::SimResult get(const ScaleJob& j, std::string* error = nullptr);
  size_t kept() const;
  size_t queued() const;

 private:
  struct Entry {
    lab::SimResult r;
    std::string error;
  };
  static Entry compute(const ScaleJob& j);
  void store(const std::string& key, Entry e);  // under m_mu
  void work();

  mutable std::mutex m_mu;
  std::condition_variable m_cv;
  std::unordered_map<std::string, Entry> m_done;
  std::deque<std::string> m_order;  // keys in the order stored (the oldest go first)
  std::deque<ScaleJob> m_queue;
  bool m_stop = false;
  std::thread m_thread;
};

// Ring against NCCL's double binary tree (allreduce): the first size of by_size where ring's time
// is below dbtree's. known: both series are complete; index -1: dbtree is faster at every size.
// back: the first larger size where dbtree is as fast again (-1: ring stays faster up to 8 GiB; it
// happens where the ring's one channel is capped by one NIC under the wire protocol).
struct ScaleCrossover {
  bool known = false;
  int index = -1;
  uint64_t bytes = 0;
  int back = -1;
  uint64_t back_bytes = 0;
};
ScaleCrossover ring_tree_crossover(const ScaleCharts& c);

// ---- a simulate run ----

// What commands/simulate.cpp writes with --json: {"command": "simulate", "topology", "collective",
// "protocol", "channels", "points": [{nodes, ranks, bytes, algorithm, time_us, busbw_GBps, ...}]}.
// "topology" is the TOML text topology_toml writes (topology.h: read back to the same values); a
// preset's name, or an object of the same keys ({"name", "gpus_per_node", "intra": {...},
// "network": {...}}), are read too.
struct SimulateRun {
  std::string file;                 // its result.json
  lab::Topology topo;               // the machine the points ran on (topo.nodes: as written; the points have theirs)
  std::string preset;               // the preset whose values these are ("": none: a file's topology, or a preset
                                    // with --gpus-per-node)
  lab::SimCollective collective = lab::SimCollective::Allreduce;
  lab::SimProtocol protocol = lab::SimProtocol::Simple;
  int channels = 0;                 // --channels (0: the default)
  std::vector<lab::SimAlgorithm> algorithms;  // the points', in the order they first appear
  std::vector<int> nodes;           // the points' node counts, ascending
  std::vector<uint64_t> sizes;      // the points' sizes, ascending
  size_t points = 0;
};

// A simulate result: a .json file, or a directory holding result.json, whose "command" is "simulate".
bool looks_like_simulate_result(const std::string& path);
// Reads one. Throws lab::IoError (unreadable, not JSON, a field missing or wrong, naming the file
// and the field) or lab::ConfigError (a topology the simulator refuses).
SimulateRun load_simulate_result(const std::string& path);

// The Scale view set up for a simulate run: its topology (the preset, or the run's own), collective,
// protocol and channels; the algorithms it simulated drawn (the first one's time split and drawn
// over the topology); N and S the observation's (nodes, bytes; 0: of the run's, the one nearest the
// view's default of 128 nodes and 16 MiB). A value the view cannot show (not a power of two, out
// of its range) becomes the nearest it can, and `note` says so.
struct ScaleSetup {
  ScaleSettings settings;
  std::vector<lab::SimAlgorithm> algorithms;
  std::string source;               // where it came from (the run's directory or file)
  std::string line;                 // "From the simulate run ...: ..." (shown above the charts)
  std::string note;                 // values moved to what the view shows ("" none)
};
ScaleSetup scale_setup(const SimulateRun& r, int nodes = 0, uint64_t bytes = 0);

// ---- the emulated run ----

// A run's link model (lab::RunConfig's link_* settings) as a Topology, as `dtlab simulate
// --validate emulated` builds it: each rank a GPU whose link is link_gbps / 8 GB/s with
// link_latency_us per message (no bandwidth limit: 1e6 GB/s); one node of world_size GPUs, or
// with link_gpus_per_node nodes of that many, link_nics_per_node NICs of link_nic_gbps, a message
// between nodes paying link_latency_us + link_nic_latency_us, all nodes on one switch. false (and
// why) when the run has no link model.
bool emulated_topology(const lab::RunConfig& c, lab::Topology& t, std::string* why = nullptr);

// One gradient-bucket allreduce of the run, over the whole world: from the last rank's start to
// the last rank's end (the simulator starts every rank together; a rank that arrives early waits
// for the others, which the simulator does not count).
struct MeasuredCollective {
  uint64_t op_seq = 0;
  int64_t step = -1;
  uint64_t bytes = 0;
  double seconds = 0;
};
// Collective events of op "allreduce", what "grad bucket", over the world (group ""), recorded by
// every one of `world` ranks; in op_seq order.
std::vector<MeasuredCollective> measured_bucket_allreduces(const std::vector<std::vector<lab::Event>>& events,
                                                           int world);

struct EmulatedPoint {
  uint64_t bytes = 0;
  std::vector<double> seconds;  // each allreduce of this size, ascending
  double median_s = 0;
  lab::SimResult predicted;     // the simulator, wire protocol, on the run's link
};

struct EmulatedRun {
  std::string why_not;          // empty: the run's points are below
  int ranks = 0;
  lab::Topology topo;
  lab::SimAlgorithm algo = lab::SimAlgorithm::Ring;  // --allreduce ring: ring; tree: rhd
  std::string link;             // "1 Gbit/s links, 50 us per message, one switch"
  bool overlapped = false;      // DDP overlapped its allreduces with backward (the ranks' CPUs shared)
  std::vector<EmulatedPoint> points;  // one per bucket size, ascending
};
EmulatedRun emulated_run(const RunData& d);

}  // namespace viz
