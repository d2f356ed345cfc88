// RankReport: what a rank in another process sends to rank 0's process at the end of a run (see
// Run's gather): its step records, its events and its final model state, so that rank 0 writes
// the same run directory as an emulated run. The wire format is compact and private to one dtlab
// build (both ends are processes of one MPI job): host byte order, no schema evolution.
//   u32 magic "DTLR" | u32 version | f64 clock_origin | f64 t0 | i64 trained_samples
//   u64 #records, then per record: i32 rank, i64 step, epoch, batch, batch_size, f32 loss,
//       i64 correct, u64 bytes_sent, f64 t, u64 #chunks then i64 each, f64 param_drift,
//       u8 grad_sync, i64 staleness, i64 version, f64 param_checksum, u8 skipped, str nonfinite,
//       u64 #bn layers, then per layer: str layer,
//       i64 count, 6 float arrays (u64 length + values), i64 num_batches_tracked,
//       u64 #memory points, then per point: str point, i64 bytes of each memory.h category
//   u64 #names, then str each          (the op/what strings of the events)
//   u64 #events, then per event: u8 kind, u8 phase, u32 op, u32 what, u32 group (name indices),
//       i32 tag, rank, src, dst, chunk, ring_step, u64 op_seq, i64 train_step, u64 bytes,
//       f64 t_start, t_end
//   u64 #tensors, then per tensor: str name, str dtype, u64 #dims, i64 dims, u64 #bytes, bytes
//   (str = u64 length + bytes)
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "events.h"
#include "run.h"
#include "safetensors.h"

namespace lab {

struct RankReport {
  double clock_origin = 0;  // steady-clock seconds at which now_seconds() was 0 in the sender
  double t0 = 0;            // now_seconds() when the sender's run started
  int64_t trained_samples = 0;  // the samples the rank counted as trained (modes that count them)
  std::vector<StepRecord> records;
  std::vector<Event> events;
  std::vector<SafeTensor> tensors;  // model_tensors(model): parameters and buffers
};

// Steady-clock seconds at which now_seconds() was 0 in this process (processes on one host share
// the steady clock, so the difference of two origins aligns their event times).
double clock_origin_seconds();

std::vector<char> encode_rank_report(const RankReport& report);
// Throws CommError naming from_rank when the bytes are malformed. Event names (op, what) are
// given static lifetime by `intern`.
RankReport decode_rank_report(const std::vector<char>& bytes, int from_rank,
                              const std::function<const char*(const std::string&)>& intern);

}  // namespace lab
