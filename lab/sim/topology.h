// A cluster as data, for `dtlab simulate`: nodes of GPUs, the links inside a node, the NICs that
// leave it, and the switches between nodes. Presets describe common machines; a TOML file
// describes any other (docs/simulate.md has the format).
//
// The model (the same words as the emulated link model, lab/comm/link_model.h, which is its
// one-switch case):
//   inside a node  every GPU has ONE full-duplex link to the node's switch (NVSwitch) or to the
//                  host's PCIe root: `intra_GBps` each way. A message between two GPUs of a node
//                  needs the sender's link out and the receiver's link in.
//   NICs           a node has `nics_per_node` NICs of `nic_Gbps` each way. A message between
//                  nodes also needs a NIC out of the sender's node and a NIC in of the receiver's
//                  (which NIC: the message's channel, or the GPU's local index, modulo the count).
//   switches       with `rails`, NIC i of every node plugs into leaf switch i of its group
//                  (rail-optimized, as DGX SuperPODs are cabled); without, all NICs of a node
//                  plug into one leaf. A leaf holds `nodes_per_leaf` nodes (0: every node on one
//                  non-blocking switch). Leaves meet at a spine; a leaf's uplink carries its
//                  nodes' NIC bandwidth divided by `oversubscription`. A message between leaves
//                  needs the sender leaf's uplink out and the receiver leaf's uplink in.
// Every link and NIC is one resource with its own bandwidth: messages that share one share its
// bandwidth (contention); a per-pair model has none.
//
// Latencies: `intra_latency_us` per message inside a node, `net_latency_us` per message between
// nodes (the wire's: used by the `wire` protocol; NCCL's protocols carry their own per-hop
// latencies, nccl_model.h).
#pragma once

#include <string>
#include <vector>

#include "link_model.h"

namespace lab {

struct Topology {
  std::string name;   // the preset's name or the file's
  std::string about;  // one line: what machine this is, and where its figures come from
  int nodes = 1;
  int gpus_per_node = 8;
  int cuda_arch = 900;            // the GPUs' compute capability x 100 (NCCL's per-architecture tables)
  bool nvlink = true;             // intra-node links are NVLink (NCCL's NVLink hop latencies); else PCIe
  double intra_GBps = 0;          // each GPU's link, each direction, 1e9 bytes per second
  double intra_latency_us = 0;
  int nics_per_node = 1;
  double nic_Gbps = 0;            // each NIC, each direction, 1e9 bits per second
  double net_latency_us = 0;
  bool rails = false;
  int nodes_per_leaf = 0;         // 0: one switch for all nodes
  double oversubscription = 1.0;  // >= 1

  int ranks() const { return nodes * gpus_per_node; }
  int leaves() const { return nodes_per_leaf > 0 ? (nodes + nodes_per_leaf - 1) / nodes_per_leaf : 1; }
  double intra_bytes_per_s() const { return intra_GBps * 1e9; }
  double nic_bytes_per_s() const { return nic_Gbps * 1e9 / 8; }
  // A leaf's uplink, each direction: the NIC bandwidth under it over the oversubscription (a rail
  // leaf holds one NIC per node).
  double uplink_bytes_per_s() const;
};

// The network of dtlab's emulated link model (lab/comm/link_model.h) for `world` ranks, as a
// topology: each rank's link (unlimited bandwidth: 1e6 GB/s) and latency within a node, with
// nodes its NICs and their latency added, with leaves their uplinks. PCIe latencies (the link
// model is not NVLink). Without nodes, or where `world` is not a multiple of the node's ranks,
// one switch of `world` ranks.
Topology link_model_topology(int world, const LinkModelOptions& opt);

// The presets, by name (dgx-h100, hgx-a100, pcie-eth, ...), each with its sources in `about`.
std::vector<std::string> topology_presets();
// Throws ConfigError naming `flag` and listing the presets when `name` is none of them.
Topology topology_preset(const std::string& name, const std::string& flag = "--topology");
// A TOML file (docs/simulate.md). Throws ConfigError naming the file, the key and the value.
Topology read_topology_file(const std::string& path);
// A preset's name, or else a path to a TOML file.
Topology topology_from_arg(const std::string& arg, const std::string& flag = "--topology");
// Throws ConfigError naming `where` and the field when a value is out of range.
void validate_topology(const Topology& t, const std::string& where);
// One line: "dgx-h100: 4 nodes x 8 GPUs, NVLink 370.8 GB/s, 8 x 400 Gbit/s NICs on rails, ..."
std::string topology_line(const Topology& t);
// The topology as a TOML file read_topology_file reads back to the same values.
std::string topology_toml(const Topology& t);

}  // namespace lab
