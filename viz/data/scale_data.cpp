#include "scale_data.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include "errors.h"
#include "mode.h"
#include "toml_parse.h"

namespace viz {

std::vector<int> scale_node_counts() {
  std::vector<int> out;
  for (int n = 1; n <= kScaleMaxNodes; n *= 2) out.push_back(n);
  return out;
}

std::vector<uint64_t> scale_sizes() {
  std::vector<uint64_t> out;
  for (uint64_t s = kScaleMinBytes; s <= kScaleMaxBytes; s *= 2) out.push_back(s);
  return out;
}

const std::vector<lab::SimAlgorithm>& scale_algorithms() {
  static const std::vector<lab::SimAlgorithm> a = {lab::SimAlgorithm::Ring, lab::SimAlgorithm::Rhd,
                                                   lab::SimAlgorithm::DbTree, lab::SimAlgorithm::Hier};
  return a;
}

std::string scale_size_text(uint64_t b) {
  const char* unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  double v = static_cast<double>(b);
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  char buf[32];
  if (v == std::floor(v)) std::snprintf(buf, sizeof buf, "%.0f %s", v, unit[u]);
  else std::snprintf(buf, sizeof buf, "%.3g %s", v, unit[u]);
  return buf;
}

lab::Topology scale_topology(const std::string& preset, int nodes) {
  lab::Topology t = lab::topology_preset(preset, "the Scale view's topology");
  t.nodes = std::max(1, nodes);
  return t;
}

lab::Topology scale_topology(const ScaleSettings& s, int nodes) {
  if (!s.custom) return scale_topology(s.preset, nodes);
  lab::Topology t = *s.custom;
  t.nodes = std::max(1, nodes);
  return t;
}

bool scale_same_machine(const lab::Topology& a, const lab::Topology& b) {
  return a.gpus_per_node == b.gpus_per_node && a.cuda_arch == b.cuda_arch && a.nvlink == b.nvlink &&
         a.intra_GBps == b.intra_GBps && a.intra_latency_us == b.intra_latency_us && a.nics_per_node == b.nics_per_node &&
         a.nic_Gbps == b.nic_Gbps && a.net_latency_us == b.net_latency_us && a.rails == b.rails &&
         a.nodes_per_leaf == b.nodes_per_leaf && a.oversubscription == b.oversubscription;
}

const ScaleSeries* ScaleCharts::nodes_series(lab::SimAlgorithm a) const {
  for (const ScaleSeries& s : by_nodes)
    if (s.algo == a) return &s;
  return nullptr;
}

const ScaleSeries* ScaleCharts::size_series(lab::SimAlgorithm a) const {
  for (const ScaleSeries& s : by_size)
    if (s.algo == a) return &s;
  return nullptr;
}

ScaleCharts scale_charts(const ScaleSettings& s) {
  ScaleCharts c;
  c.settings = s;
  const int gpn = scale_topology(s, 1).gpus_per_node;
  auto series = [&](lab::SimAlgorithm a, const std::vector<std::pair<int, uint64_t>>& at) {
    ScaleSeries out;
    out.algo = a;
    for (const auto& [nodes, bytes] : at) {
      std::string why;
      if (out.supported && !lab::sim_supports(a, s.collective, nodes * gpn, &why)) {
        out.supported = false;
        out.why = why;
      }
      ScalePoint p;
      p.nodes = nodes;
      p.gpus = nodes * gpn;
      p.bytes = bytes;
      out.points.push_back(p);
    }
    if (out.supported) c.missing += static_cast<int>(out.points.size());
    return out;
  };
  std::vector<std::pair<int, uint64_t>> over_nodes, over_sizes;
  for (int n : scale_node_counts()) over_nodes.push_back({n, s.bytes});
  for (uint64_t b : scale_sizes()) over_sizes.push_back({s.nodes, b});
  for (lab::SimAlgorithm a : scale_algorithms()) {
    c.by_nodes.push_back(series(a, over_nodes));
    c.by_size.push_back(series(a, over_sizes));
  }
  return c;
}

ScaleJob scale_job(const lab::Topology& t, const lab::SimOptions& o, uint64_t bytes) {
  ScaleJob j;
  j.topo = t;
  j.opts = o;
  j.bytes = bytes;
  char buf[512];
  std::snprintf(buf, sizeof buf, "%d %d %d %d %.17g %.17g %d %.17g %.17g %d %d %.17g|%d %d %d %d %d|%llu", t.nodes,
                t.gpus_per_node, t.cuda_arch, t.nvlink ? 1 : 0, t.intra_GBps, t.intra_latency_us, t.nics_per_node,
                t.nic_Gbps, t.net_latency_us, t.rails ? 1 : 0, t.nodes_per_leaf, t.oversubscription,
                static_cast<int>(o.collective), static_cast<int>(o.algorithm), static_cast<int>(o.protocol), o.channels,
                o.exact ? 1 : 0, static_cast<unsigned long long>(bytes));
  j.key = buf;
  return j;
}

// ---- ScaleSim ----

ScaleSim::ScaleSim(bool background) {
  if (background) m_thread = std::thread([this] { work(); });
}

ScaleSim::~ScaleSim() {
  {
    std::lock_guard<std::mutex> lock(m_mu);
    m_stop = true;
    m_queue.clear();
  }
  m_cv.notify_all();
  if (m_thread.joinable()) m_thread.join();
}

ScaleSim::Entry ScaleSim::compute(const ScaleJob& j) {
  Entry e;
  try {
    e.r = lab::simulate_collective(j.topo, j.opts, j.bytes);
  } catch (const std::exception& ex) {
    e.error = ex.what();
  }
  return e;
}

void ScaleSim::store(const std::string& key, Entry e) {
  if (m_done.count(key)) return;
  while (m_done.size() >= kMaxKept && !m_order.empty()) {
    m_done.erase(m_order.front());
    m_order.pop_front();
  }
  m_done.emplace(key, std::move(e));
  m_order.push_back(key);
}

void ScaleSim::work() {
  std::unique_lock<std::mutex> lock(m_mu);
  for (;;) {
    m_cv.wait(lock, [&] { return m_stop || !m_queue.empty(); });
    if (m_stop) return;
    ScaleJob j = std::move(m_queue.front());
    m_queue.pop_front();
    if (m_done.count(j.key)) continue;
    lock.unlock();
    Entry e = compute(j);
    lock.lock();
    store(j.key, std::move(e));
  }
}

int ScaleSim::fill(ScaleCharts& c, bool wait) {
  const bool here = wait || !m_thread.joinable();
  std::vector<ScaleJob> todo;
  auto visit = [&](std::vector<ScaleSeries>& all, bool apply) {
    for (ScaleSeries& s : all) {
      if (!s.supported) continue;
      for (ScalePoint& p : s.points) {
        if (p.ready) continue;
        lab::SimOptions o;
        o.collective = c.settings.collective;
        o.algorithm = s.algo;
        o.protocol = c.settings.protocol;
        o.channels = c.settings.channels;
        ScaleJob j = scale_job(scale_topology(c.settings, p.nodes), o, p.bytes);
        auto it = m_done.find(j.key);
        if (it != m_done.end()) {
          p.ready = true;
          p.r = it->second.r;
          p.error = it->second.error;
        } else if (!apply) {
          todo.push_back(std::move(j));
        }
      }
    }
  };
  {
    std::lock_guard<std::mutex> lock(m_mu);
    visit(c.by_nodes, false);
    visit(c.by_size, false);
    if (!here) {
      // the worker takes them in this order: the busbw and time charts first (ten node counts
      // each), then the sizes
      m_queue.assign(todo.begin(), todo.end());
      if (!todo.empty()) m_cv.notify_one();
    } else {
      m_queue.clear();
    }
  }
  if (here) {
    for (const ScaleJob& j : todo) {
      Entry e = compute(j);
      std::lock_guard<std::mutex> lock(m_mu);
      store(j.key, std::move(e));
    }
    std::lock_guard<std::mutex> lock(m_mu);
    visit(c.by_nodes, true);
    visit(c.by_size, true);
  }
  int missing = 0;
  for (const auto* all : {&c.by_nodes, &c.by_size})
    for (const ScaleSeries& s : *all)
      if (s.supported)
        for (const ScalePoint& p : s.points) missing += p.ready ? 0 : 1;
  c.missing = missing;
  return missing;
}

lab::SimResult ScaleSim::get(const ScaleJob& j, std::string* error) {
  {
    std::lock_guard<std::mutex> lock(m_mu);
    auto it = m_done.find(j.key);
    if (it != m_done.end()) {
      if (error) *error = it->second.error;
      return it->second.r;
    }
  }
  Entry e = compute(j);
  if (error) *error = e.error;
  const lab::SimResult r = e.r;
  std::lock_guard<std::mutex> lock(m_mu);
  store(j.key, std::move(e));
  return r;
}

size_t ScaleSim::kept() const {
  std::lock_guard<std::mutex> lock(m_mu);
  return m_done.size();
}

size_t ScaleSim::queued() const {
  std::lock_guard<std::mutex> lock(m_mu);
  return m_queue.size();
}

ScaleCrossover ring_tree_crossover(const ScaleCharts& c) {
  ScaleCrossover x;
  const ScaleSeries* ring = c.size_series(lab::SimAlgorithm::Ring);
  const ScaleSeries* tree = c.size_series(lab::SimAlgorithm::DbTree);
  if (!ring || !tree || !ring->supported || !tree->supported || ring->points.size() != tree->points.size()) return x;
  for (size_t i = 0; i < ring->points.size(); ++i)
    if (!ring->points[i].ready || !tree->points[i].ready || !ring->points[i].error.empty() ||
        !tree->points[i].error.empty())
      return x;
  x.known = true;
  for (size_t i = 0; i < ring->points.size(); ++i) {
    const bool ring_faster = ring->points[i].r.time_s < tree->points[i].r.time_s;
    if (x.index < 0 && ring_faster) {
      x.index = static_cast<int>(i);
      x.bytes = ring->points[i].bytes;
    } else if (x.index >= 0 && !ring_faster) {
      x.back = static_cast<int>(i);
      x.back_bytes = ring->points[i].bytes;
      break;
    }
  }
  return x;
}

// ---- a simulate run ----

namespace {

using nlohmann::json;

const char* kSimHint = "the Scale view opens what `dtlab simulate --json FILE` writes (a lesson's simulate run leaves "
                       "it as result.json in its directory)";

const char* json_type(const json& j) {
  switch (j.type()) {
    case json::value_t::object: return "an object";
    case json::value_t::array: return "an array";
    case json::value_t::string: return "a string";
    case json::value_t::boolean: return "a boolean";
    case json::value_t::null: return "null";
    default: return "a number";
  }
}

// A TOML table as JSON (the topology's TOML text, read as its object form is).
json toml_to_json(const toml::node& n, const std::string& where) {
  if (const toml::table* t = n.as_table()) {
    json o = json::object();
    for (const auto& [k, v] : *t) o[std::string(k.str())] = toml_to_json(v, where);
    return o;
  }
  if (n.is_string()) return *n.value<std::string>();
  if (n.is_integer()) return *n.value<int64_t>();
  if (n.is_floating_point()) return *n.value<double>();
  if (n.is_boolean()) return *n.value<bool>();
  throw lab::IoError(where + ": arrays and dates are no topology's values", kSimHint);
}

// The keys of a topology file (docs/simulate.md; lab/sim/topology.cpp read_topology_file), from
// their JSON form.
lab::Topology topology_from_object(const json& o, const std::string& where) {
  auto bad = [&](const std::string& key, const std::string& what) {
    throw lab::IoError(where + (key.empty() ? "" : "/" + key) + ": " + what, kSimHint);
  };
  auto number = [&](const json& v, const std::string& key) {
    if (!v.is_number()) bad(key, std::string("must be a number, got ") + json_type(v));
    return v.get<double>();
  };
  auto integer = [&](const json& v, const std::string& key) {
    if (!v.is_number_integer() || v.get<int64_t>() < -(int64_t{1} << 30) || v.get<int64_t>() > (int64_t{1} << 30))
      bad(key, "must be an integer");
    return static_cast<int>(v.get<int64_t>());
  };
  auto text = [&](const json& v, const std::string& key) {
    if (!v.is_string()) bad(key, std::string("must be a string, got ") + json_type(v));
    return v.get<std::string>();
  };
  auto boolean = [&](const json& v, const std::string& key) {
    if (!v.is_boolean()) bad(key, "must be true or false");
    return v.get<bool>();
  };
  if (!o.is_object()) bad("", std::string("expected a topology (an object, a TOML text or a preset's name), got ") + json_type(o));
  lab::Topology t;
  t.name = "the run's topology";
  t.nics_per_node = 1;
  bool gpus = false, intra = false, nic = false;
  for (const auto& [key, v] : o.items()) {
    if (key == "name") t.name = text(v, key);
    else if (key == "about") t.about = text(v, key);
    else if (key == "nodes") t.nodes = integer(v, key);
    else if (key == "gpus_per_node") { t.gpus_per_node = integer(v, key); gpus = true; }
    else if (key == "cuda_arch") t.cuda_arch = integer(v, key);
    else if (key == "intra" || key == "network") {
      if (!v.is_object()) bad(key, std::string("must be a table, got ") + json_type(v));
      for (const auto& [sk, sv] : v.items()) {
        const std::string full = key + "/" + sk;
        if (key == "intra") {
          if (sk == "kind") {
            const std::string kind = text(sv, full);
            if (kind != "nvlink" && kind != "pcie") bad(full, "\"" + kind + "\": nvlink or pcie");
            t.nvlink = kind == "nvlink";
          } else if (sk == "GBps") { t.intra_GBps = number(sv, full); intra = true; }
          else if (sk == "latency_us") t.intra_latency_us = number(sv, full);
          else bad(full, "unknown key");
        } else {
          if (sk == "nics_per_node") t.nics_per_node = integer(sv, full);
          else if (sk == "nic_Gbps") { t.nic_Gbps = number(sv, full); nic = true; }
          else if (sk == "latency_us") t.net_latency_us = number(sv, full);
          else if (sk == "rails") t.rails = boolean(sv, full);
          else if (sk == "nodes_per_leaf") t.nodes_per_leaf = integer(sv, full);
          else if (sk == "oversubscription") t.oversubscription = number(sv, full);
          else bad(full, "unknown key");
        }
      }
    } else {
      bad(key, "unknown key");
    }
  }
  if (!gpus) bad("gpus_per_node", "missing");
  if (!intra) bad("intra/GBps", "missing");
  if (!nic) bad("network/nic_Gbps", "missing");
  if (t.nodes < 1) t.nodes = 1;
  lab::validate_topology(t, where);
  return t;
}

lab::Topology topology_from_result(const json& v, const std::string& where) {
  if (v.is_string()) {
    const std::string s = v.get<std::string>();
    if (s.find('=') == std::string::npos) return lab::topology_preset(s, where);  // a preset's name
    toml::table t;
    try {
      t = lab::parse_toml(s, where);
    } catch (const toml::parse_error& e) {
      throw lab::IoError(where + ": line " + std::to_string(e.source().begin.line) + " of its TOML: " +
                             std::string(e.description()),
                         kSimHint);
    }
    return topology_from_object(toml_to_json(t, where), where);
  }
  return topology_from_object(v, where);
}

json read_json_file(const std::string& file) {
  std::ifstream f(file, std::ios::binary);
  if (!f) throw lab::IoError("cannot read " + file, kSimHint);
  try {
    return json::parse(f);
  } catch (const json::exception& e) {
    throw lab::IoError(file + ": not JSON: " + e.what(), kSimHint);
  }
}

bool command_is_simulate(const std::string& file) {
  try {
    std::ifstream f(file, std::ios::binary);
    if (!f) return false;
    const json j = json::parse(f);
    return j.is_object() && j.value("command", "") == "simulate";
  } catch (const json::exception&) {
    return false;
  }
}

int log2_floor(uint64_t v) {
  int l = 0;
  while (l < 63 && (uint64_t{1} << (l + 1)) <= v) ++l;
  return l;
}

// The power of two nearest `v` (by ratio) in [lo, hi] (powers of two themselves).
uint64_t nearest_power_of_two(uint64_t v, uint64_t lo, uint64_t hi) {
  if (v <= lo) return lo;
  if (v >= hi) return hi;
  const uint64_t below = uint64_t{1} << log2_floor(v);
  const uint64_t above = below == v ? v : below * 2;
  return static_cast<double>(v) / static_cast<double>(below) <= static_cast<double>(above) / static_cast<double>(v)
             ? below
             : above;
}

// Of `values` (ascending), the one nearest `target` by ratio; a tie goes to the larger.
template <typename T>
T nearest_of(const std::vector<T>& values, T target) {
  T best = values.front();
  double bd = 1e300;
  for (T v : values) {
    const double d = std::fabs(std::log(static_cast<double>(v) / static_cast<double>(target)));
    if (d <= bd + 1e-12) {
      bd = d;
      best = v;
    }
  }
  return best;
}

std::string dir_name(const std::string& path) {
  std::filesystem::path p(path);
  while (!p.empty() && p.filename().empty()) p = p.parent_path();  // a trailing '/'
  return p.filename().string();
}

}  // namespace

bool looks_like_simulate_result(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_regular_file(path, ec)) return command_is_simulate(path);
  if (!std::filesystem::is_directory(path, ec) || std::filesystem::exists(path + "/config.toml", ec)) return false;
  if (std::filesystem::exists(path + "/result.json", ec)) return command_is_simulate(path + "/result.json");
  // a lesson's simulate run without its result: outcome.json says which command ran (loading then says what is missing)
  return command_is_simulate(path + "/outcome.json");
}

SimulateRun load_simulate_result(const std::string& path) {
  std::error_code ec;
  SimulateRun r;
  r.file = std::filesystem::is_directory(path, ec) ? path + "/result.json" : path;
  const json j = read_json_file(r.file);
  auto bad = [&](const std::string& ptr, const std::string& what) { throw lab::IoError(r.file + ": " + ptr + ": " + what, kSimHint); };
  if (!j.is_object()) bad("", std::string("expected an object, got ") + json_type(j));
  auto field = [&](const char* key) -> const json& {
    const auto it = j.find(key);
    if (it == j.end()) bad(std::string("/") + key, "missing");
    return *it;
  };
  auto text = [&](const char* key) {
    const json& v = field(key);
    if (!v.is_string()) bad(std::string("/") + key, std::string("expected a string, got ") + json_type(v));
    return v.get<std::string>();
  };
  const std::string command = text("command");
  if (command != "simulate") bad("/command", "\"" + command + "\": the Scale view shows `dtlab simulate` results");
  r.topo = topology_from_result(field("topology"), r.file + ": /topology");
  for (const std::string& p : lab::topology_presets())
    if (p == r.topo.name && scale_same_machine(lab::topology_preset(p), r.topo)) r.preset = p;
  r.collective = lab::parse_sim_collective(text("collective"), r.file + ": /collective");
  r.protocol = lab::parse_sim_protocol(text("protocol"), r.file + ": /protocol");
  if (j.contains("channels")) {
    const json& c = j["channels"];
    if (!c.is_number_integer() || c.get<int64_t>() < 0 || c.get<int64_t>() > 1024)
      bad("/channels", "expected 0 (the default) or a channel count");
    r.channels = static_cast<int>(c.get<int64_t>());
  }
  const json& points = field("points");
  if (!points.is_array()) bad("/points", std::string("expected an array, got ") + json_type(points));
  for (size_t i = 0; i < points.size(); ++i) {
    const json& p = points[i];
    const std::string at = "/points/" + std::to_string(i);
    if (!p.is_object()) bad(at, std::string("expected an object, got ") + json_type(p));
    const auto n = p.find("nodes"), b = p.find("bytes"), a = p.find("algorithm");
    if (n == p.end() || !n->is_number_integer() || n->get<int64_t>() < 1 || n->get<int64_t>() > (int64_t{1} << 24))
      bad(at + "/nodes", "expected a node count");
    if (b == p.end() || !b->is_number_unsigned() || b->get<uint64_t>() == 0) bad(at + "/bytes", "expected a size in bytes");
    if (a == p.end() || !a->is_string()) bad(at + "/algorithm", "expected an algorithm's name");
    const lab::SimAlgorithm algo = lab::parse_sim_algorithm(a->get<std::string>(), r.file + ": " + at + "/algorithm");
    if (std::find(r.algorithms.begin(), r.algorithms.end(), algo) == r.algorithms.end()) r.algorithms.push_back(algo);
    r.nodes.push_back(static_cast<int>(n->get<int64_t>()));
    r.sizes.push_back(b->get<uint64_t>());
  }
  r.points = points.size();
  std::sort(r.nodes.begin(), r.nodes.end());
  r.nodes.erase(std::unique(r.nodes.begin(), r.nodes.end()), r.nodes.end());
  std::sort(r.sizes.begin(), r.sizes.end());
  r.sizes.erase(std::unique(r.sizes.begin(), r.sizes.end()), r.sizes.end());
  return r;
}

ScaleSetup scale_setup(const SimulateRun& r, int nodes, uint64_t bytes) {
  ScaleSetup u;
  ScaleSettings& s = u.settings;
  if (!r.preset.empty()) {
    s.preset = r.preset;
  } else {
    s.preset = r.topo.name;
    s.custom = r.topo;
    s.custom->nodes = 1;
  }
  s.collective = r.collective;
  s.protocol = r.protocol;
  s.channels = r.channels;
  for (lab::SimAlgorithm a : r.algorithms)
    if (std::find(scale_algorithms().begin(), scale_algorithms().end(), a) != scale_algorithms().end())
      u.algorithms.push_back(a);
  const ScaleSettings defaults;
  const uint64_t want_n =
      nodes > 0 ? static_cast<uint64_t>(nodes)
                : r.nodes.empty() ? static_cast<uint64_t>(defaults.nodes)
                                  : static_cast<uint64_t>(nearest_of<int>(r.nodes, defaults.nodes));
  const uint64_t want_b = bytes > 0 ? bytes : r.sizes.empty() ? defaults.bytes : nearest_of<uint64_t>(r.sizes, defaults.bytes);
  s.nodes = static_cast<int>(nearest_power_of_two(want_n, 1, kScaleMaxNodes));
  s.bytes = nearest_power_of_two(want_b, kScaleMinBytes, kScaleMaxBytes);
  if (static_cast<uint64_t>(s.nodes) != want_n)
    u.note += "N: " + std::to_string(want_n) + " nodes are shown as " + std::to_string(s.nodes) +
              " (the view draws powers of two from 1 to " + std::to_string(kScaleMaxNodes) + " nodes). ";
  if (s.bytes != want_b)
    u.note += "S: " + std::to_string(want_b) + " bytes are shown as " + scale_size_text(s.bytes) +
              " (the view draws powers of two from 1 KiB to 8 GiB). ";
  if (!u.note.empty()) u.note.pop_back();

  const bool in_dir = std::filesystem::path(r.file).filename() == "result.json";
  u.source = in_dir ? std::filesystem::path(r.file).parent_path().string() : r.file;
  std::string algos;
  for (size_t i = 0; i < r.algorithms.size(); ++i)
    algos += std::string(i == 0 ? "" : i + 1 == r.algorithms.size() ? " and " : ", ") + lab::sim_algorithm_name(r.algorithms[i]);
  // "1 to 512 nodes (10 counts)", "2 and 128 nodes", "16 MiB", "1 KiB to 8 GiB (24 sizes)"
  auto range = [](const std::vector<std::string>& v, const std::string& unit, const char* many) {
    const std::string u = unit.empty() ? "" : " " + unit;
    if (v.empty()) return std::string("none");
    if (v.size() == 1) return v[0] + u;
    if (v.size() == 2) return v[0] + " and " + v[1] + u;
    return v.front() + " to " + v.back() + u + " (" + std::to_string(v.size()) + " " + many + ")";
  };
  std::vector<std::string> ns, ss;
  for (int n : r.nodes) ns.push_back(std::to_string(n));
  for (uint64_t b : r.sizes) ss.push_back(scale_size_text(b));
  const bool one_node = r.nodes.size() == 1 && r.nodes[0] == 1;
  u.line = "From " + (in_dir ? "the simulate run " + dir_name(u.source) : u.source) + ": " +
           lab::sim_collective_name(r.collective) + " as " + (algos.empty() ? std::string("no algorithm") : algos) +
           " on " + (r.preset.empty() ? "its own topology (" + r.topo.name + ")" : r.preset) + ", protocol " +
           lab::sim_protocol_name(r.protocol) + (r.channels > 0 ? ", " + std::to_string(r.channels) + " channels" : "") +
           ", " + range(ns, one_node ? "node" : "nodes", "counts") + ", " + range(ss, "", "sizes") + ". Shown at N = " +
           std::to_string(s.nodes) + " node" + (s.nodes == 1 ? "" : "s") + ", S = " + scale_size_text(s.bytes) +
           "; the charts are the same simulation over every N and S.";
  return u;
}

// ---- the emulated run ----

bool emulated_topology(const lab::RunConfig& c, lab::Topology& t, std::string* why) {
  if (!c.link_model()) {
    if (why) *why = "no link model";
    return false;
  }
  t = lab::link_model_topology(c.world_size, lab::link_model_options(c));
  t.name = "this run's link";
  t.about = "the emulated link model of the run (lab/comm/link_model.h)";
  return true;
}

std::vector<MeasuredCollective> measured_bucket_allreduces(const std::vector<std::vector<lab::Event>>& events,
                                                           int world) {
  struct Agg {
    int ranks = 0;
    int64_t step = -1;
    uint64_t bytes = 0;
    double last_start = 0, last_end = 0;
  };
  std::map<uint64_t, Agg> by_seq;
  for (const auto& log : events)
    for (const lab::Event& e : log) {
      if (e.kind != lab::EventKind::Collective || std::string(e.op) != "allreduce" ||
          std::string(e.what) != "grad bucket" || (e.group && e.group[0]))
        continue;
      Agg& a = by_seq[e.op_seq];
      if (a.ranks == 0) {
        a.last_start = e.t_start;
        a.last_end = e.t_end;
      }
      a.last_start = std::max(a.last_start, e.t_start);
      a.last_end = std::max(a.last_end, e.t_end);
      a.step = e.train_step;
      a.bytes = e.bytes;
      ++a.ranks;
    }
  std::vector<MeasuredCollective> out;
  for (const auto& [seq, a] : by_seq) {
    if (a.ranks != world || world < 1) continue;
    MeasuredCollective m;
    m.op_seq = seq;
    m.step = a.step;
    m.bytes = a.bytes;
    m.seconds = a.last_end - a.last_start;
    out.push_back(m);
  }
  return out;
}

EmulatedRun emulated_run(const RunData& d) {
  EmulatedRun er;
  const lab::RunConfig& c = d.cfg;
  er.ranks = c.world_size;
  if (d.phase == RunPhase::Empty && !d.live) {
    er.why_not = "no run is open";
    return er;
  }
  std::string why;
  if (!emulated_topology(c, er.topo, &why)) {
    er.why_not = "this run has " + why;
    return er;
  }
  char link[200];
  if (c.link_gbps > 0) std::snprintf(link, sizeof link, "%g Gbit/s links, %g us per message", c.link_gbps, c.link_latency_us);
  else std::snprintf(link, sizeof link, "unlimited bandwidth, %g us per message", c.link_latency_us);
  er.link = link;
  if (er.topo.nodes > 1) {
    char nodes[200];
    std::snprintf(nodes, sizeof nodes, ", %d nodes of %d with %d x %g Gbit/s NIC%s (+%g us)", er.topo.nodes,
                  er.topo.gpus_per_node, er.topo.nics_per_node, er.topo.nic_Gbps, er.topo.nics_per_node == 1 ? "" : "s",
                  c.link_nic_latency_us);
    er.link += nodes;
  } else {
    er.link += ", one switch";
  }
  er.overlapped = c.mode == "ddp" && c.overlap;
  if (c.allreduce == "ring") er.algo = lab::SimAlgorithm::Ring;
  else if (c.allreduce == "tree") er.algo = lab::SimAlgorithm::Rhd;
  else {
    er.why_not = "--allreduce " + c.allreduce + " has no counterpart in the simulator (ring and tree have)";
    return er;
  }
  if (c.world_size < 2) {
    er.why_not = "one rank has nothing to allreduce";
    return er;
  }
  const std::vector<MeasuredCollective> m = measured_bucket_allreduces(d.events, c.world_size);
  if (m.empty()) {
    er.why_not = d.live ? "no gradient-bucket allreduce recorded yet"
                        : "the run recorded no gradient-bucket allreduce over its whole world (--mode " + c.mode + ")";
    return er;
  }
  std::map<uint64_t, std::vector<double>> by_bytes;
  for (const MeasuredCollective& x : m) by_bytes[x.bytes].push_back(x.seconds);
  lab::SimOptions o;
  o.collective = lab::SimCollective::Allreduce;
  o.algorithm = er.algo;
  o.protocol = lab::SimProtocol::Wire;
  for (auto& [bytes, secs] : by_bytes) {
    EmulatedPoint p;
    p.bytes = bytes;
    std::sort(secs.begin(), secs.end());
    p.seconds = secs;
    const size_t n = secs.size();
    p.median_s = n % 2 ? secs[n / 2] : (secs[n / 2 - 1] + secs[n / 2]) / 2;
    try {
      p.predicted = lab::simulate_collective(er.topo, o, bytes);
    } catch (const std::exception& e) {
      er.why_not = std::string("the simulator refused this run's link: ") + e.what();
      er.points.clear();
      return er;
    }
    er.points.push_back(std::move(p));
  }
  return er;
}

}  // namespace viz
