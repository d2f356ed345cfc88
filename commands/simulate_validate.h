// dtlab simulate --validate emulated|nccl|published: the simulator (lab/sim) against three
// references, each a table with its tolerance, one command each. The exit code is 1 when a row
// that is a check falls outside its tolerance.
//
//   emulated   dtlab's own ranks (threads) on the emulated link model (lab/comm/link_model.h) time
//              the same allreduces the simulator predicts with the wire protocol: one switch at
//              N = 2, 3, 4, 8, 16 and two levels (4 nodes x 4, a slower shared NIC), ring and
//              rhd, sizes from 64 KiB to 4 MiB, and two leaves with 2:1 uplinks. Within 15%: the
//              emulation adds thread wake-ups and the adds themselves to the wire's time (a point
//              outside is measured again, up to 3 times, and the fastest counts: load only adds
//              time). The simulator's steps wait for each other; the emulated ranks do not, so
//              where a rank may start its next step early and meet a message of the step before
//              on a link (rhd's fold for N not a power of two: the core's first exchange meets
//              the fold-in at the receiving rank), emulation is slower than the step model: 14%
//              for rhd on 3 ranks. Those rows are shown, not checked, as are host-bound rows
//              (more than 4 ranks per core, steps under 100 us: ring at 64 KiB on 16 ranks and 2
//              cores), whose time is the host's turn-taking. Each row notes how late the host woke
//              the waiting ranks. The quick rows (the tests): the 4-rank ones, 32 times slower.
//   nccl       NCCL 2.30.7's cost model (nccl_model.h) and the simulator with NCCL's protocols on
//              dgx-h100 nodes, 1 to 512 nodes x 1 KiB to 8 GiB: the fraction of (nodes, size)
//              where both pick the same algorithm, and per node count the size bin where ring
//              overtakes the tree in each.
//   published  measurements from NCCL's users and vendors (sources in the table): single-node
//              plateaus, the multi-node plateau near NICs x NIC bandwidth, the 2-node tree
//              exception, the small-message ring latency doubling from 4 to 8 nodes, SimAI's
//              efficiency at 16 MiB.
#pragma once

#include <string>
#include <vector>

#include "nccl_model.h"
#include "simulate.h"
#include "topology.h"

namespace lab {

// What NCCL's topology search would report for this topology (nccl_model.h's inputs).
NcclModelInputs nccl_inputs_for(const Topology& t, int channels);

struct ValidationRow {
  std::string what;       // the point, in words
  std::string source;     // where the reference comes from
  double reference = 0;   // the measured or modelled figure
  double simulated = 0;
  std::string unit;
  // within: |simulated / reference - 1| <= tolerance; above: simulated > reference; at_most:
  // simulated <= reference x (1 + tolerance); shown: a figure of the model beside the checks, not one
  std::string rule = "within";
  double tolerance = 0;
  bool pass = true;
  std::string note;  // printed after the source (the emulated rows: how late the host woke the ranks)
};

std::vector<ValidationRow> validate_published();
std::vector<ValidationRow> validate_nccl(std::FILE* out);
std::vector<ValidationRow> validate_emulated(bool quick);

int simulate_validate(const SimulateOptions& o, const std::string& argv0);

}  // namespace lab
