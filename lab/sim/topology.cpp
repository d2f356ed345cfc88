#include "topology.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <fstream>
#include <set>
#include <sstream>

#include "errors.h"
#include "toml_parse.h"

namespace lab {

Topology link_model_topology(int world, const LinkModelOptions& opt) {
  world = std::max(1, world);
  Topology t;
  t.name = "emulated";
  t.about = "dtlab's emulated link model (lab/comm/link_model.h)";
  t.nvlink = false;
  t.intra_GBps = opt.bytes_per_s > 0 ? opt.bytes_per_s / 1e9 : 1e6;
  t.intra_latency_us = opt.latency_s * 1e6;
  t.nics_per_node = 1;
  t.nic_Gbps = t.intra_GBps * 8;
  t.net_latency_us = t.intra_latency_us;
  if (opt.has_nodes() && world % opt.gpus_per_node == 0) {
    t.gpus_per_node = opt.gpus_per_node;
    t.nodes = world / opt.gpus_per_node;
    t.nics_per_node = std::max(1, opt.nics_per_node);
    if (opt.nic_bytes_per_s > 0) t.nic_Gbps = opt.nic_bytes_per_s * 8 / 1e9;
    t.net_latency_us = (opt.latency_s + opt.nic_latency_s) * 1e6;
    t.nodes_per_leaf = opt.nodes_per_leaf;
    t.oversubscription = opt.oversubscription;
  } else {
    t.gpus_per_node = world;
    t.nodes = 1;
  }
  return t;
}

double Topology::uplink_bytes_per_s() const {
  const int per_leaf_nodes = nodes_per_leaf > 0 ? nodes_per_leaf : nodes;
  const int nics_per_leaf_node = rails ? 1 : nics_per_node;
  return per_leaf_nodes * nics_per_leaf_node * nic_bytes_per_s() / oversubscription;
}

namespace {

// The presets. Bandwidths are what NCCL's topology search assumes for the links (its
// src/graph/topo.h: SM90_NVLINK_BW 20.6 GB/s per NVLink 4 link, 18 links per H100 SXM;
// SM80_NVLINK_BW 20.0 GB/s per NVLink 3 link, 12 per A100 SXM), which single-node nccl-tests
// runs meet within a few percent (365-370 GB/s busbw on 8 H100, 228-232 on 8 A100); NICs at their
// line rate. Latencies: NCCL's LL per-hop figures (tuning.cc), the closest it has to the wire's.
struct Preset {
  const char* name;
  Topology t;
};

Topology make(const char* name, const char* about, int arch, int gpus, bool nvlink, double intra_GBps, double intra_lat,
              int nics, double nic_Gbps, double net_lat, bool rails, int nodes_per_leaf, double oversub) {
  Topology t;
  t.name = name;
  t.about = about;
  t.nodes = 1;
  t.gpus_per_node = gpus;
  t.cuda_arch = arch;
  t.nvlink = nvlink;
  t.intra_GBps = intra_GBps;
  t.intra_latency_us = intra_lat;
  t.nics_per_node = nics;
  t.nic_Gbps = nic_Gbps;
  t.net_latency_us = net_lat;
  t.rails = rails;
  t.nodes_per_leaf = nodes_per_leaf;
  t.oversubscription = oversub;
  return t;
}

const std::vector<Preset>& presets() {
  static const std::vector<Preset> p = {
      {"dgx-h100",
       make("dgx-h100",
            "DGX/HGX H100: 8 H100 SXM on NVSwitch (18 NVLink 4 links x 20.6 GB/s = 370.8 GB/s, NCCL's figure), "
            "8 x 400 Gbit/s NICs on rails, 32 nodes per leaf (a SuperPOD scalable unit), non-blocking spine",
            900, 8, true, 18 * 20.6, 0.6, 8, 400, 2.7, true, 32, 1.0)},
      {"hgx-a100",
       make("hgx-a100",
            "DGX/HGX A100: 8 A100 SXM on NVSwitch (12 NVLink 3 links x 20 GB/s = 240 GB/s, NCCL's figure), "
            "8 x 200 Gbit/s HDR NICs on rails, 20 nodes per leaf, non-blocking spine",
            800, 8, true, 12 * 20.0, 0.6, 8, 200, 2.7, true, 20, 1.0)},
      {"pcie-eth",
       make("pcie-eth",
            "8 PCIe 4.0 GPUs without NVLink (24 GB/s each way through the host), one 100 Gbit/s Ethernet NIC per node, "
            "16 nodes per leaf, 2:1 oversubscribed uplinks",
            800, 8, false, 24, 1.0, 1, 100, 10.0, false, 16, 2.0)},
  };
  return p;
}

std::string preset_list() {
  std::string s;
  for (const auto& p : presets()) s += (s.empty() ? "" : ", ") + std::string(p.name);
  return s;
}

std::string num(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

// The shortest text that reads back to the same double (a TOML float: always with a '.' or 'e').
std::string exact(double v) {
  char buf[64];
  for (int digits = 6; digits <= 17; ++digits) {
    std::snprintf(buf, sizeof buf, "%.*g", digits, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  std::string s = buf;
  if (s.find_first_of(".en") == std::string::npos) s += ".0";
  return s;
}

}  // namespace

std::vector<std::string> topology_presets() {
  std::vector<std::string> out;
  for (const auto& p : presets()) out.push_back(p.name);
  return out;
}

Topology topology_preset(const std::string& name, const std::string& flag) {
  for (const auto& p : presets())
    if (name == p.name) return p.t;
  throw ConfigError(flag + " " + name + ": not a preset (" + preset_list() + ") or a .toml file");
}

void validate_topology(const Topology& t, const std::string& where) {
  auto bad = [&](const std::string& field, const std::string& value, const std::string& why) {
    throw ConfigError(where + ": " + field + " = " + value + ": " + why);
  };
  if (t.nodes < 1) bad("nodes", std::to_string(t.nodes), "at least 1");
  if (t.gpus_per_node < 1) bad("gpus_per_node", std::to_string(t.gpus_per_node), "at least 1");
  if (t.cuda_arch < 100 || t.cuda_arch > 2000)
    bad("cuda_arch", std::to_string(t.cuda_arch), "a compute capability x 100 (700 Volta, 800 Ampere, 900 Hopper, 1000 Blackwell)");
  if (t.ranks() > (1 << 20)) bad("nodes", std::to_string(t.nodes), "more than 1,048,576 GPUs in all");
  if (!(t.intra_GBps > 0) || !std::isfinite(t.intra_GBps)) bad("intra.GBps", num(t.intra_GBps), "a bandwidth > 0");
  if (!(t.intra_latency_us >= 0) || !std::isfinite(t.intra_latency_us))
    bad("intra.latency_us", num(t.intra_latency_us), "a latency >= 0");
  if (t.nics_per_node < 1) bad("network.nics_per_node", std::to_string(t.nics_per_node), "at least 1");
  if (!(t.nic_Gbps > 0) || !std::isfinite(t.nic_Gbps)) bad("network.nic_Gbps", num(t.nic_Gbps), "a bandwidth > 0");
  if (!(t.net_latency_us >= 0) || !std::isfinite(t.net_latency_us))
    bad("network.latency_us", num(t.net_latency_us), "a latency >= 0");
  if (t.nodes_per_leaf < 0) bad("network.nodes_per_leaf", std::to_string(t.nodes_per_leaf), "0 (one switch) or more");
  if (!(t.oversubscription >= 1) || !std::isfinite(t.oversubscription))
    bad("network.oversubscription", num(t.oversubscription), "1 (non-blocking) or more");
}

Topology read_topology_file(const std::string& path) {
  toml::table tbl;
  try {
    tbl = parse_toml_file(path);
  } catch (const toml::parse_error& e) {
    std::ostringstream s;
    s << path << ":" << e.source().begin.line << ": " << e.description();
    throw ConfigError(s.str());
  }
  Topology t;
  t.name = path;
  t.nics_per_node = 1;
  // Every key is known, of its type: a misspelt key is an error, not a silent default.
  const std::set<std::string> top = {"name", "about", "nodes", "gpus_per_node", "cuda_arch", "intra", "network"};
  const std::set<std::string> intra = {"kind", "GBps", "latency_us"};
  const std::set<std::string> net = {"nics_per_node", "nic_Gbps", "latency_us", "rails", "nodes_per_leaf",
                                     "oversubscription"};
  auto unknown = [&](const std::string& key) {
    throw ConfigError(path + ": unknown key '" + key +
                      "' (keys: name, about, nodes, gpus_per_node, cuda_arch, [intra] kind, GBps, latency_us, [network] "
                      "nics_per_node, nic_Gbps, latency_us, rails, nodes_per_leaf, oversubscription)");
  };
  auto number = [&](const toml::node& n, const std::string& key) -> double {
    if (auto v = n.value<double>()) return *v;
    throw ConfigError(path + ": " + key + " must be a number");
  };
  auto integer = [&](const toml::node& n, const std::string& key) -> int {
    auto v = n.value<int64_t>();
    if (!v || !n.is_integer()) throw ConfigError(path + ": " + key + " must be an integer");
    if (*v < -(1LL << 30) || *v > (1LL << 30)) throw ConfigError(path + ": " + key + " = " + std::to_string(*v) + ": out of range");
    return static_cast<int>(*v);
  };
  auto text = [&](const toml::node& n, const std::string& key) -> std::string {
    if (auto v = n.value<std::string>()) return *v;
    throw ConfigError(path + ": " + key + " must be a string");
  };
  auto boolean = [&](const toml::node& n, const std::string& key) -> bool {
    if (auto v = n.value<bool>(); v && n.is_boolean()) return *v;
    throw ConfigError(path + ": " + key + " must be true or false");
  };
  bool have_intra = false, have_net = false, have_nodes_gpus = false;
  for (const auto& [k, v] : tbl) {
    const std::string key(k.str());
    if (!top.count(key)) unknown(key);
    if (key == "name") t.name = text(v, key);
    else if (key == "about") t.about = text(v, key);
    else if (key == "nodes") t.nodes = integer(v, key);
    else if (key == "cuda_arch") t.cuda_arch = integer(v, key);
    else if (key == "gpus_per_node") { t.gpus_per_node = integer(v, key); have_nodes_gpus = true; }
    else if (key == "intra" || key == "network") {
      const toml::table* sub = v.as_table();
      if (!sub) throw ConfigError(path + ": [" + key + "] must be a table");
      for (const auto& [sk, sv] : *sub) {
        const std::string skey(sk.str());
        const std::string full = key + "." + skey;
        if (key == "intra") {
          have_intra = true;
          if (!intra.count(skey)) unknown(full);
          if (skey == "kind") {
            const std::string kind = text(sv, full);
            if (kind != "nvlink" && kind != "pcie")
              throw ConfigError(path + ": intra.kind = \"" + kind + "\": nvlink or pcie");
            t.nvlink = kind == "nvlink";
          } else if (skey == "GBps") t.intra_GBps = number(sv, full);
          else t.intra_latency_us = number(sv, full);
        } else {
          have_net = true;
          if (!net.count(skey)) unknown(full);
          if (skey == "nics_per_node") t.nics_per_node = integer(sv, full);
          else if (skey == "nic_Gbps") t.nic_Gbps = number(sv, full);
          else if (skey == "latency_us") t.net_latency_us = number(sv, full);
          else if (skey == "rails") t.rails = boolean(sv, full);
          else if (skey == "nodes_per_leaf") t.nodes_per_leaf = integer(sv, full);
          else t.oversubscription = number(sv, full);
        }
      }
    }
  }
  if (!have_nodes_gpus) throw ConfigError(path + ": gpus_per_node is missing");
  if (!have_intra || t.intra_GBps == 0) throw ConfigError(path + ": [intra] GBps is missing");
  if (!have_net || t.nic_Gbps == 0) throw ConfigError(path + ": [network] nic_Gbps is missing");
  validate_topology(t, path);
  return t;
}

Topology topology_from_arg(const std::string& arg, const std::string& flag) {
  for (const auto& p : presets())
    if (arg == p.name) return p.t;
  if (arg.size() > 5 && arg.compare(arg.size() - 5, 5, ".toml") == 0) {
    std::ifstream f(arg);
    if (!f) throw ConfigError(flag + " " + arg + ": cannot read the file");
    return read_topology_file(arg);
  }
  return topology_preset(arg, flag);
}

std::string topology_line(const Topology& t) {
  std::ostringstream s;
  s << t.name << ": " << t.nodes << (t.nodes == 1 ? " node" : " nodes") << " x " << t.gpus_per_node << " GPUs ("
    << t.ranks() << "), " << (t.nvlink ? "NVLink " : "PCIe ") << num(t.intra_GBps) << " GB/s, " << t.nics_per_node
    << " x " << num(t.nic_Gbps) << " Gbit/s NIC" << (t.nics_per_node == 1 ? "" : "s") << (t.rails ? " on rails" : "");
  if (t.nodes_per_leaf > 0 && t.leaves() > 1)
    s << ", " << t.leaves() << " leaves of " << t.nodes_per_leaf << " nodes";
  else
    s << ", one switch";
  if (t.oversubscription > 1 && t.leaves() > 1) s << ", " << num(t.oversubscription) << ":1 oversubscribed";
  return s.str();
}

std::string topology_toml(const Topology& t) {
  std::ostringstream o;
  auto q = [](const std::string& s) {
    std::string out = "\"";
    for (char c : s) {
      if (c == '"' || c == '\\') out += '\\';
      out += c;
    }
    return out + "\"";
  };
  o << "name = " << q(t.name) << "\n";
  o << "about = " << q(t.about) << "\n";
  o << "nodes = " << t.nodes << "\n";
  o << "gpus_per_node = " << t.gpus_per_node << "\n";
  o << "cuda_arch = " << t.cuda_arch << "\n\n[intra]\n";
  o << "kind = " << (t.nvlink ? "\"nvlink\"" : "\"pcie\"") << "\n";
  o << "GBps = " << exact(t.intra_GBps) << "\n";
  o << "latency_us = " << exact(t.intra_latency_us) << "\n\n[network]\n";
  o << "nics_per_node = " << t.nics_per_node << "\n";
  o << "nic_Gbps = " << exact(t.nic_Gbps) << "\n";
  o << "latency_us = " << exact(t.net_latency_us) << "\n";
  o << "rails = " << (t.rails ? "true" : "false") << "\n";
  o << "nodes_per_leaf = " << t.nodes_per_leaf << "\n";
  o << "oversubscription = " << exact(t.oversubscription) << "\n";
  return o.str();
}

}  // namespace lab
