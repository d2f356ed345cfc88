// bn_stats.bin: the BatchNorm statistics of a run, beside metrics.jsonl (which keeps the scalars).
// As JSON text they made up almost all of a run directory (460 MB for 15 epochs of the mlp with 4
// ranks); here each value is a float32, and a value that is the same on every rank is stored once
// (SyncBN's statistics, the running statistics where broadcast_buffers keeps them equal).
//
// Which steps are recorded (--record-bn): "auto" (the default) every step of the first epoch,
// where the statistics move fastest, then every 10th step; "all"; "off"; or N: every N-th step.
//
// Format, little-endian:
//   header   "DTLABBN1" (8 bytes), u32 format version (1), u32 world size, u32 layers,
//            per layer: u32 name length, the name ("2" for module 2), u32 channels
//   record   one per recorded step, all ranks:
//            i64 step, i64 epoch, u32 layers, then per layer:
//              i64 count[world], i64 num_batches_tracked[world]
//              per field (batch_mean, batch_var, local_mean, local_var, running_mean, running_var):
//                u8 how: 0 absent, 1 the same on every rank (channels floats), 2 per rank (world x
//                channels floats, rank by rank; NaN where a rank has none, e.g. an idle
//                DataParallel device)
// In Python: tools/read_bn_stats.py (a few lines of struct and numpy) reads it into arrays.
#pragma once

#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include "run.h"

namespace lab {

constexpr int kBnStatsFormatVersion = 1;
constexpr int64_t kBnAutoEvery = 10;  // --record-bn auto: every step of epoch 0, then every 10th

// Whether step `step` of epoch `epoch` has its statistics recorded under --record-bn `policy`
// (validated by lab::validate).
bool bn_recorded(const std::string& policy, int64_t step, int64_t epoch);

class BnStatsWriter {
 public:
  // Creates (truncates) the file; throws IoError naming it. keep_bytes > 0: a resumed run's file,
  // cut to the size it had at the checkpoint (header included) and appended to.
  BnStatsWriter(const std::string& path, int world_size, uint64_t keep_bytes = 0);
  void flush();
  // records: every rank's record of one step, in rank order. The first call writes the header.
  void append(const std::vector<const StepRecord*>& records);
  const std::string& path() const { return m_path; }

 private:
  std::string m_path;
  int m_world;
  bool m_header = false;
  std::ofstream m_out;
};

// Every recorded step: records[i] holds the world's records of one step (rank, step, epoch and bn
// filled in; the other fields are zero). An empty file is a run that has recorded nothing yet
// (world_size 0, no steps). Throws IoError naming the file and what is wrong.
struct BnStatsFile {
  int world_size = 0;
  std::vector<std::pair<std::string, int>> layers;  // name, channels
  std::vector<std::vector<StepRecord>> steps;       // [recorded step][rank]
};
BnStatsFile read_bn_stats(const std::string& path);
BnStatsFile parse_bn_stats(const std::string& bytes, const std::string& name);

}  // namespace lab
