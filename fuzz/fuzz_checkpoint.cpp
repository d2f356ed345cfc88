// Fuzzes what `dtlab run --resume` reads from a checkpoint (lab/run/checkpoint.h): finding the
// newest committed one (COMMITTED, state.json and the CRC-32 of every file), state.json,
// rank<R>.json, rank<R>.safetensors, the rank's step records and trace events (run_wire.h:
// decode_rank_report) and the configuration state.json carries (config_from_toml).
//
// Each input rewrites one file of a valid one-rank checkpoint that the harness writes with the
// real writer (write_rank_checkpoint, commit_checkpoint). Input: byte 0 % 5 picks the file
// (0 state.json, 1 rank0.json, 2 rank0.safetensors, 3 rank0.records, 4 COMMITTED); the rest is
// its content. Byte 0 < 128: the checksums are made to match the fuzzed file (state.json's list,
// COMMITTED), so the input reaches the parsers; byte 0 >= 128: they are left as written, so the
// input exercises the checksum checks (a damaged file is refused).
// Expected errors: lab::Error (IoError, ConfigError, CommError). Anything else is a finding.
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <set>
#include <string>

#include <nlohmann/json.hpp>

#include "checkpoint.h"
#include "config.h"
#include "errors.h"
#include "fuzz_util.h"
#include "run_wire.h"

namespace fs = std::filesystem;

namespace {

lab::SafeTensor f32_tensor(const std::string& name, std::vector<int64_t> shape, float first) {
  lab::SafeTensor t{name, "F32", shape, {}};
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  for (int64_t i = 0; i < n; ++i) {
    const float v = first + 0.25f * static_cast<float>(i);
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    t.bytes.insert(t.bytes.end(), p, p + 4);
  }
  return t;
}

// A small checkpoint of a real shape: two parameters, a buffer, momentum, counters, one record
// with BatchNorm statistics, one event.
lab::RankCheckpoint base_rank() {
  lab::RankCheckpoint rc;
  rc.tensors = {f32_tensor("0.weight", {3, 4}, -1.0f), f32_tensor("0.bias", {3}, 0.5f),
                f32_tensor("1.running_mean", {3}, 0.0f), f32_tensor("optim.momentum.0.weight", {3, 4}, 0.1f)};
  rc.counters = {{"rank", 0},
                 {"bytes_sent", 1024},
                 {"collectives", 3},
                 {"loss_sum", 4.5},
                 {"correct", 7},
                 {"samples", 16},
                 {"buckets", nlohmann::json::array({nlohmann::json::array({0, 1})})},
                 {"stats", {{"traffic", nlohmann::json::object()}}}};
  lab::RankReport report;
  lab::StepRecord r;
  r.rank = 0;
  r.step = 1;
  r.batch_size = 8;
  r.loss = 2.25f;
  lab::BnLayerRecord l;
  l.layer = "1";
  l.count = 8;
  l.batch_mean = {0.1f, 0.2f, 0.3f};
  l.running_var = {0.9f, 0.9f, 0.9f};
  r.bn.push_back(l);
  report.records.push_back(r);
  lab::Event e{};
  e.op = "allreduce";
  e.what = "grad bucket";
  e.bytes = 48;
  report.events.push_back(e);
  rc.records = lab::encode_rank_report(report);
  rc.events = rc.records;
  return rc;
}

const char* intern(const std::string& s) {
  static std::set<std::string> names;
  return names.insert(s).first->c_str();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const int which = data[0] % 5;
  const bool match_checksums = data[0] < 128;
  const std::string fuzzed(reinterpret_cast<const char*>(data + 1), size - 1);
  static const lab::RankCheckpoint rank0 = base_rank();
  const std::string run = fuzz::scratch().file("run");
  std::error_code ec;
  fs::remove_all(run, ec);
  fs::create_directories(run, ec);

  lab::CheckpointState st;
  st.step = 4;
  st.epoch = 1;
  st.batch = 0;
  st.world_size = 1;
  st.model = "mlp";
  st.mode = "ddp";
  st.config_toml = "[model]\nmodel = \"mlp\"\n\n[distributed]\nworld_size = 1\n";
  lab::EpochRecord ep{};
  ep.steps = 4;
  st.epochs.push_back(ep);
  const char* const names[5] = {"state.json", "rank0.json", "rank0.safetensors", "rank0.records", "COMMITTED"};
  const std::string dir = run + "/checkpoints/step-00000004";
  try {
    lab::write_rank_checkpoint(run, st.step, 0, rank0);
    if (match_checksums && which >= 1 && which <= 3)  // before the commit lists the files' CRCs
      fuzz::write_file(run + "/checkpoints/.tmp-step-00000004/" + names[which], fuzzed);
    lab::commit_checkpoint(run, st);
  } catch (const lab::Error& e) {
    std::fprintf(stderr, "the harness's own checkpoint failed: %s\n", e.what());
    std::abort();
  }
  if (which == 0 || which == 4 || !match_checksums) fuzz::write_file(dir + "/" + names[which], fuzzed);
  if (which == 0 && match_checksums) fuzz::write_file(dir + "/COMMITTED", std::to_string(lab::crc32_of(fuzzed)) + "\n");

  try {
    const lab::FoundCheckpoint found = lab::find_checkpoint(run);
    const lab::CheckpointState s = lab::read_checkpoint_state(found.dir);
    (void)lab::config_from_toml(s.config_toml, found.dir + "/state.json");
    const lab::RankCheckpoint rc = lab::read_rank_checkpoint(found.dir, 0);
    if (!rc.records.empty()) (void)lab::decode_rank_report(rc.records, 0, intern);
    if (!rc.events.empty()) (void)lab::decode_rank_report(rc.events, 0, intern);
  } catch (const lab::Error&) {
  }
  return 0;
}
