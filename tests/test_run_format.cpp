// The run directory's format (lab/run/run_format.h): every record written is read back field by
// field, for records built by hand (every field set, and every field at its default) and for
// every kind of run; a run directory of the current format kept as a fixture still opens.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <set>

#include "backends.h"
#include "errors.h"
#include "run.h"
#include "run_data.h"
#include "run_format.h"
#include "run_wire.h"
#include "test_util.h"

namespace {

// Bitwise float equality (NaN equals NaN): the format promises the float32 value back.
bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0 || (std::isnan(a) && std::isnan(b)); }
bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (!same_bits(a[i], b[i])) return false;
  return true;
}

// Every field the format writes; `with_bn` false: the BatchNorm arrays are in bn_stats.bin and the
// memory points not recorded (no --record-memory).
void expect_same_step(const lab::StepRecord& a, const lab::StepRecord& b, bool with_bn, const std::string& where) {
  SCOPED_TRACE(where);
  EXPECT_EQ(a.rank, b.rank);
  EXPECT_EQ(a.step, b.step);
  EXPECT_EQ(a.epoch, b.epoch);
  EXPECT_EQ(a.batch, b.batch);
  EXPECT_EQ(a.batch_size, b.batch_size);
  EXPECT_TRUE(same_bits(a.loss, b.loss)) << a.loss << " vs " << b.loss;
  EXPECT_EQ(a.correct, b.correct);
  EXPECT_EQ(a.bytes_sent, b.bytes_sent);
  EXPECT_EQ(a.t, b.t);
  EXPECT_EQ(a.chunks, b.chunks);
  EXPECT_EQ(a.param_drift, b.param_drift);
  EXPECT_EQ(a.grad_sync, b.grad_sync);
  EXPECT_EQ(std::isnan(a.param_checksum), std::isnan(b.param_checksum));
  if (!std::isnan(a.param_checksum)) {
    EXPECT_EQ(a.param_checksum, b.param_checksum);
  }
  EXPECT_EQ(a.skipped, b.skipped);
  EXPECT_EQ(a.nonfinite, b.nonfinite);
  EXPECT_EQ(a.staleness, b.staleness);
  EXPECT_EQ(a.version, b.version);
  if (!with_bn) {
    EXPECT_TRUE(b.memory.empty());
    return;
  }
  ASSERT_EQ(a.memory.size(), b.memory.size());
  for (size_t i = 0; i < a.memory.size(); ++i) {
    EXPECT_EQ(a.memory[i].point, b.memory[i].point);
    for (int c = 0; c < lab::kMemCategories; ++c) EXPECT_EQ(a.memory[i].bytes[c], b.memory[i].bytes[c]) << c;
  }
  ASSERT_EQ(a.bn.size(), b.bn.size());
  for (size_t i = 0; i < a.bn.size(); ++i) {
    const lab::BnLayerRecord &x = a.bn[i], &y = b.bn[i];
    EXPECT_EQ(x.layer, y.layer);
    EXPECT_EQ(x.count, y.count);
    EXPECT_TRUE(same_bits(x.batch_mean, y.batch_mean));
    EXPECT_TRUE(same_bits(x.batch_var, y.batch_var));
    EXPECT_TRUE(same_bits(x.local_mean, y.local_mean));
    EXPECT_TRUE(same_bits(x.local_var, y.local_var));
    EXPECT_TRUE(same_bits(x.running_mean, y.running_mean));
    EXPECT_TRUE(same_bits(x.running_var, y.running_var));
    EXPECT_EQ(x.num_batches_tracked, y.num_batches_tracked);
  }
}

lab::StepRecord every_field_set() {
  lab::StepRecord r;
  r.rank = 3;
  r.step = 41;
  r.epoch = 2;
  r.batch = 7;
  r.batch_size = 13;
  r.loss = 0.1f + 1e-8f;  // a float with no short decimal of its own
  r.correct = 9;
  r.bytes_sent = (uint64_t{1} << 40) + 5;
  r.t = 12.3456789012345;
  lab::BnLayerRecord b;
  b.layer = "1";
  b.count = 4 * 28 * 28;
  b.batch_mean = {0.25f, -1.0f / 3.0f, std::numeric_limits<float>::denorm_min()};
  b.batch_var = {1.0f, 2.0f / 7.0f, 3e38f};
  b.local_mean = {0.5f, 0.0f, -0.0f};  // SyncBN: the rank's own differ from the ones used
  b.local_var = {0.75f, 1e-30f, 4.0f};
  b.running_mean = {0.025f, -0.1f, 1e-7f};
  b.running_var = {0.9f, 1.1f, 1.0f};
  b.num_batches_tracked = 42;
  r.bn = {b, b};
  r.bn[1].layer = "5";
  r.chunks = {4, 4, 3, 2};
  r.param_drift = 0.0123456789;
  r.grad_sync = false;
  r.param_checksum = -123.456789012345678;
  r.skipped = true;
  r.nonfinite = "0.weight \"quoted\"";
  r.staleness = 2;
  r.version = 17;
  r.memory.resize(2);
  r.memory[0].point = "start";
  r.memory[1].point = "backward: reduce-scatter \"4\"";
  for (int c = 0; c < lab::kMemCategories; ++c) {
    r.memory[0].bytes[c] = 4 * (c + 1);
    r.memory[1].bytes[c] = (int64_t{1} << 40) + c;  // past 32 bits
  }
  return r;
}

// The names read from a trace, kept for the events that point at them (a set's strings never move).
const char* kept(const std::string& s) {
  static std::set<std::string> names;
  return names.insert(s).first->c_str();
}

lab::StepRecord read_back(const lab::StepRecord& r, bool with_bn) {
  return lab::step_record_from_json(nlohmann::json::parse(lab::step_record_line(r, with_bn, with_bn)));
}

}  // namespace

TEST(RunFormat, AStepRecordWithEveryFieldSetReadsBackBitForBit) {
  const lab::StepRecord r = every_field_set();
  expect_same_step(r, read_back(r, true), true, "with the BatchNorm arrays");
  const lab::StepRecord without = read_back(r, false);
  expect_same_step(r, without, false, "without them");
  EXPECT_TRUE(without.bn.empty());
}

TEST(RunFormat, AStepRecordWithEveryFieldAtItsDefaultReadsBackTheSame) {
  lab::StepRecord r;
  r.bn.resize(1);
  r.bn[0].layer = "1";
  r.bn[0].batch_mean = r.bn[0].local_mean = {1.5f};
  r.bn[0].batch_var = r.bn[0].local_var = {2.5f};  // equal: local_* not written, read back equal
  const std::string line = lab::step_record_line(r, true);
  for (const char* absent : {"chunks", "param_drift", "grad_sync", "param_checksum", "skipped", "nonfinite", "staleness",
                             "version", "local_mean", "running_mean", "memory"})
    EXPECT_EQ(line.find(absent), std::string::npos) << absent << " written at its default: " << line;
  expect_same_step(r, read_back(r, true), true, "defaults");
  // A NaN loss (DataParallel's devices other than 0) is written as null and read back as NaN.
  r.loss = std::numeric_limits<float>::quiet_NaN();
  EXPECT_NE(lab::step_record_line(r, false).find("\"loss\":null"), std::string::npos);
  EXPECT_TRUE(std::isnan(read_back(r, false).loss));
}

TEST(RunFormat, EpochAndEvaluationRecordsReadBack) {
  lab::EpochRecord e{3, 120, 0.51, 0.8125, 0.62, 0.79, 4.25, 1234.5, 0.0125};
  const nlohmann::json ej = lab::epoch_record_json(e);
  EXPECT_EQ(ej["kind"], "epoch");
  const lab::EpochRecord e2 = lab::epoch_record_from_json(ej);
  EXPECT_EQ(e2.epoch, e.epoch);
  EXPECT_EQ(e2.steps, e.steps);
  EXPECT_EQ(e2.train_loss, e.train_loss);
  EXPECT_EQ(e2.train_acc, e.train_acc);
  EXPECT_EQ(e2.test_loss, e.test_loss);
  EXPECT_EQ(e2.test_acc, e.test_acc);
  EXPECT_EQ(e2.seconds, e.seconds);
  EXPECT_EQ(e2.samples_per_s, e.samples_per_s);
  EXPECT_EQ(e2.lr, e.lr);

  lab::EvalPoint p;
  p.steps = 64;
  p.epoch = 1;
  p.samples = 1000;
  p.eval_mode = {0.43, 0.84, 0};
  p.train_mode = {0.47, 0.83, 0};
  p.probe_label = 9;
  p.probe_eval = {0.1f, 0.9f};
  p.probe_train = {0.3f, 0.7f};
  const nlohmann::json pj = lab::eval_point_json(p);
  EXPECT_EQ(pj["kind"], "eval");
  const lab::EvalPoint p2 = lab::eval_point_from_json(nlohmann::json::parse(pj.dump()));
  EXPECT_EQ(p2.steps, p.steps);
  EXPECT_EQ(p2.epoch, p.epoch);
  EXPECT_EQ(p2.samples, p.samples);
  EXPECT_EQ(p2.eval_mode.acc, p.eval_mode.acc);
  EXPECT_EQ(p2.eval_mode.loss, p.eval_mode.loss);
  EXPECT_EQ(p2.train_mode.acc, p.train_mode.acc);
  EXPECT_EQ(p2.train_mode.loss, p.train_mode.loss);
  EXPECT_EQ(p2.probe_label, p.probe_label);
  EXPECT_TRUE(same_bits(p2.probe_eval, p.probe_eval));
  EXPECT_TRUE(same_bits(p2.probe_train, p.probe_train));
}

TEST(RunFormat, MetricsReadingNamesTheFileAndLineAndSkipsKindsItDoesNotKnow) {
  testutil::TempDir d;
  const std::string path = d.file("metrics.jsonl");
  const lab::StepRecord r = every_field_set();
  testutil::write_file(path, lab::step_record_line(r, false) + "\n{\"kind\":\"future\",\"x\":1}\n\n" +
                                 lab::epoch_record_json(lab::EpochRecord{}).dump() + "\n");
  int steps = 0, epochs = 0, line = 0;
  lab::MetricsReader reader;
  reader.on_step = [&](lab::StepRecord&& s, int n) {
    ++steps;
    line = n;
    expect_same_step(r, s, false, "read from the file");
  };
  reader.on_epoch = [&](lab::EpochRecord&&) { ++epochs; };
  lab::read_metrics(path, reader);
  EXPECT_EQ(steps, 1);
  EXPECT_EQ(line, 1);
  EXPECT_EQ(epochs, 1);
  EXPECT_EQ(lab::read_metrics_json(path).size(), 3u);

  // Each damaged file is an IoError whose message names the file (and line) and what is wrong.
  auto expect_io_error = [&](const std::function<void()>& read, const std::string& says, const char* what) {
    try {
      read();
      ADD_FAILURE() << what << " was read";
    } catch (const lab::IoError& e) {
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
    }
  };
  testutil::write_file(path, lab::step_record_line(r, false) + "\n{\"kind\":\"step\",\"rank\":\"one\"}\n");
  expect_io_error([&] { lab::read_metrics(path, reader); }, path + ":2: bad record", "a step whose rank is a string");
  testutil::write_file(path, "{\"kind\":\"step\",\"step\":1e300}\n");
  expect_io_error([&] { lab::read_metrics(path, reader); }, path + ":1: bad record: 'step' is 1e+300",
                  "a step index of 1e300");
  testutil::write_file(path, "{\"kind\":\"step\"\n");
  expect_io_error([&] { lab::read_metrics_json(path); }, path + ":1: not JSON", "a cut line");
  expect_io_error([&] { lab::read_metrics(d.file("none.jsonl"), reader); }, "cannot read " + d.file("none.jsonl"),
                  "a missing file");
}

TEST(RunFormat, TraceEventsOfEveryKindReadBack) {
  testutil::TempDir d;
  std::vector<std::vector<lab::Event>> events(2);
  lab::Event compute;
  compute.kind = lab::EventKind::Compute;
  compute.phase = lab::Phase::Backward;
  compute.op = "conv2d";
  compute.train_step = 0;
  compute.t_start = 0.5;
  compute.t_end = 0.75;
  lab::Event coll;
  coll.kind = lab::EventKind::Collective;
  coll.op = "allreduce";
  coll.what = "grad bucket";
  coll.tag = 1;
  coll.op_seq = 7;
  coll.bytes = 4096;
  coll.train_step = 1;
  coll.t_start = 1.0;
  coll.t_end = 1.25;
  lab::Event chunk = coll;
  chunk.kind = lab::EventKind::Chunk;
  chunk.phase = lab::Phase::ReduceScatter;
  chunk.ring_step = 0;
  chunk.src = 1;
  chunk.dst = 0;
  chunk.chunk = 1;
  chunk.bytes = 2048;
  chunk.group = "dp";
  lab::Event kernels = compute;  // what a device did within the backward (--device)
  kernels.kind = lab::EventKind::Device;
  kernels.op = "conv2d";
  kernels.what = "kernels";
  kernels.tag = 3;
  kernels.t_start = 0.55;
  kernels.t_end = 0.6;
  lab::Event copy = kernels;
  copy.op = "copy to host";
  copy.what = "copy";
  copy.tag = -1;
  copy.bytes = 1200;
  lab::Event block = compute;  // a pipeline's forward of micro-batch 2, and its send to the next stage
  block.phase = lab::Phase::Forward;
  block.op = "forward";
  block.tag = 2;
  lab::Event send = chunk;
  send.phase = lab::Phase::Send;
  send.op = "send";
  send.what = "activations";
  send.tag = 2;
  send.ring_step = -1;
  lab::Event late = compute;
  late.train_step = 5;  // at or after max_step: not written
  events[1] = {compute, coll, chunk, kernels, copy, block, send, late};
  const std::string path = d.file("trace.json");
  lab::write_trace(path, events, 5, {{"train_samples", 256}, {"test_samples", 64}});
  const lab::TraceContents t = lab::read_trace(path, 2, kept);
  EXPECT_EQ(t.train_samples, 256);
  EXPECT_EQ(t.test_samples, 64);
  ASSERT_EQ(t.per_rank.size(), 2u);
  EXPECT_TRUE(t.per_rank[0].empty());
  ASSERT_EQ(t.per_rank[1].size(), 7u);
  for (size_t i = 0; i < 7; ++i) {
    const lab::Event &a = events[1][i], &b = t.per_rank[1][i];
    SCOPED_TRACE("event " + std::to_string(i));
    EXPECT_EQ(a.kind, b.kind);
    EXPECT_EQ(a.phase, b.phase);
    EXPECT_STREQ(a.op, b.op);
    EXPECT_STREQ(a.what, b.what);
    EXPECT_STREQ(a.group, b.group);
    EXPECT_EQ(a.tag, b.tag);
    EXPECT_EQ(b.rank, 1);
    EXPECT_EQ(a.src, b.src);
    EXPECT_EQ(a.dst, b.dst);
    EXPECT_EQ(a.chunk, b.chunk);
    EXPECT_EQ(a.ring_step, b.ring_step);
    EXPECT_EQ(a.op_seq, b.op_seq);
    EXPECT_EQ(a.train_step, b.train_step);
    EXPECT_EQ(a.bytes, b.bytes);
    EXPECT_NEAR(a.t_start, b.t_start, 1e-12);
    EXPECT_NEAR(a.t_end, b.t_end, 1e-12);
  }
  // the device's track is named only where a rank has device events
  const std::string text = testutil::read_file(path);
  EXPECT_NE(text.find(R"({"args":{"name":"device"},"name":"thread_name","ph":"M","pid":1,"tid":3})"), std::string::npos);
  EXPECT_EQ(text.find(R"("pid":0,"tid":3)"), std::string::npos);
}

// A rank in another process sends its events to rank 0's (run_wire.h): every kind, the device's
// included, arrives as it left; a kind past the last is refused by name.
TEST(RunWire, EventsOfEveryKindCrossProcessesAndAnUnknownKindIsRefused) {
  lab::RankReport rep;
  for (const lab::EventKind k : {lab::EventKind::Chunk, lab::EventKind::Collective, lab::EventKind::Compute, lab::EventKind::Device}) {
    lab::Event e;
    e.kind = k;
    e.phase = lab::Phase::Backward;
    e.op = k == lab::EventKind::Device ? "copy to host" : "allreduce";
    e.what = k == lab::EventKind::Device ? "copy" : "grad bucket";
    e.tag = 2;
    e.rank = 1;
    e.bytes = 640;
    e.train_step = 3;
    e.t_start = 0.25;
    e.t_end = 0.5;
    if (k == lab::EventKind::Chunk) e.group = "dp";  // a process group's (group_transport.h)
    rep.events.push_back(e);
  }
  rep.trained_samples = 96;  // (what a mode that counts its samples counted on the rank)
  const auto intern = kept;
  std::vector<char> bytes = lab::encode_rank_report(rep);
  const lab::RankReport back = lab::decode_rank_report(bytes, 1, intern);
  EXPECT_EQ(back.trained_samples, 96);
  ASSERT_EQ(back.events.size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(back.events[i].kind, rep.events[i].kind);
    EXPECT_STREQ(back.events[i].op, rep.events[i].op);
    EXPECT_STREQ(back.events[i].group, rep.events[i].group);
    EXPECT_EQ(back.events[i].bytes, 640u);
  }
  // the kind byte of the last event: one past Device
  const std::vector<char> device = lab::encode_rank_report([&] {
    lab::RankReport one;
    one.events = {rep.events[3]};
    return one;
  }());
  bytes = device;
  size_t at = std::string::npos;
  for (size_t i = 0; i + 1 < bytes.size(); ++i)  // u8 kind, u8 phase (Backward) just after the event count
    if (bytes[i] == static_cast<char>(lab::EventKind::Device) && bytes[i + 1] == static_cast<char>(lab::Phase::Backward) &&
        i >= 8 && bytes[i - 8] == 1) {
      at = i;
      break;
    }
  ASSERT_NE(at, std::string::npos);
  bytes[at] = static_cast<char>(static_cast<int>(lab::EventKind::kLastKind) + 1);
  try {
    lab::decode_rank_report(bytes, 1, intern);
    ADD_FAILURE() << "an unknown event kind was read";
  } catch (const lab::CommError& e) {
    EXPECT_NE(std::string(e.what()).find("an event of kind 4"), std::string::npos) << e.what();
  }
}

TEST(RunFormat, ASummaryOfANewerFormatIsRefusedByName) {
  testutil::TempDir d;
  const std::string path = d.file("summary.json");
  testutil::write_file(path, "{\"format_version\": 1, \"steps\": 12, \"steps_per_epoch\": 4, \"train_samples\": 256,"
                             " \"test_eval_mode\": {\"accuracy\": 0.5, \"loss\": 1.25, \"samples\": 64}}");
  const lab::SummaryFields s = lab::read_summary_fields(path);
  EXPECT_EQ(s.steps, 12);
  EXPECT_EQ(s.steps_per_epoch, 4);
  EXPECT_EQ(s.train_samples, 256);
  EXPECT_EQ(s.eval_mode.acc, 0.5);
  EXPECT_EQ(s.eval_mode.samples, 64);
  EXPECT_EQ(s.cuda_graphs, "");
  // a GPU run with --cuda-graphs: what its executor reports (cuda_executor.cpp: report_json)
  testutil::write_file(path, "{\"format_version\": 1, \"device\": {\"name\": \"cuda:0 (NVIDIA H200)\", \"rank0\": "
                             "{\"cuda_graphs\": {\"captured\": 1, \"replayed\": 17, \"eager\": 2}}}}");
  EXPECT_EQ(lab::read_summary_fields(path).cuda_graphs, "1 captured, 17 replayed, 2 eager");
  testutil::write_file(path, "{\"format_version\": 2, \"producer\": \"dtlab 9.0\"}");
  try {
    lab::read_summary_fields(path);
    FAIL() << "format 2 was read";
  } catch (const lab::IoError& e) {
    EXPECT_NE(std::string(e.what()).find(path + ": format_version 2 is a newer run directory format than 1"),
              std::string::npos)
        << e.what();
    EXPECT_NE(e.hint().find("dtlab 9.0"), std::string::npos) << e.hint();
  }
}

// Every kind of run: what the run held in memory (its step records as the app's live view gets
// them, its epochs and evaluations) is what its run directory gives back.
struct RunKind {
  const char* name;
  std::function<void(lab::RunConfig&)> set;
};

class RunFormatRuns : public ::testing::TestWithParam<RunKind> {};

TEST_P(RunFormatRuns, WhatTheRunHeldIsWhatItsDirectoryGivesBack) {
  DTLAB_REQUIRE_DATASET();
  testutil::TempDir d;
  lab::RunConfig c = testutil::small_run("mlp", 2, d.path(), 6);
  GetParam().set(c);
  lab::Run run(c, lab::make_world);
  std::vector<lab::StepRecord> live;
  run.set_step_sink([&](const std::vector<lab::StepRecord>& recs) { live.insert(live.end(), recs.begin(), recs.end()); });
  const lab::RunSummary& summary = run.run();
  ASSERT_FALSE(live.empty());

  std::vector<lab::StepRecord> read;
  std::vector<lab::EpochRecord> epochs;
  std::vector<lab::EvalPoint> evals;
  lab::MetricsReader reader;
  reader.on_step = [&](lab::StepRecord&& r, int) { read.push_back(std::move(r)); };
  reader.on_epoch = [&](lab::EpochRecord&& e) { epochs.push_back(e); };
  reader.on_eval = [&](lab::EvalPoint&& p) { evals.push_back(std::move(p)); };
  lab::read_metrics(d.file(lab::run_files::kMetrics), reader);
  ASSERT_EQ(read.size(), live.size());
  for (size_t i = 0; i < live.size(); ++i)
    expect_same_step(live[i], read[i], false, "record " + std::to_string(i) + " (step " + std::to_string(live[i].step) +
                                                  ", rank " + std::to_string(live[i].rank) + ")");

  const auto snap = run.snapshot();
  ASSERT_EQ(epochs.size(), snap->epochs.size());
  for (size_t i = 0; i < epochs.size(); ++i) {
    EXPECT_EQ(epochs[i].steps, snap->epochs[i].steps);
    EXPECT_EQ(epochs[i].test_acc, snap->epochs[i].test_acc);
    EXPECT_EQ(epochs[i].train_loss, snap->epochs[i].train_loss);
    EXPECT_EQ(epochs[i].lr, snap->epochs[i].lr);
  }
  ASSERT_EQ(evals.size(), snap->evals.size());
  for (size_t i = 0; i < evals.size(); ++i) {
    EXPECT_EQ(evals[i].steps, snap->evals[i].steps);
    EXPECT_EQ(evals[i].eval_mode.acc, snap->evals[i].eval_mode.acc);
    EXPECT_EQ(evals[i].train_mode.loss, snap->evals[i].train_mode.loss);
    EXPECT_TRUE(same_bits(evals[i].probe_eval, snap->evals[i].probe_eval));
  }

  // The summary the app shows, and the trace: every event the run wrote (trace_steps covers them).
  // What the app shows of the live run (Run::summary_fields) is what it shows of the directory.
  const lab::SummaryFields s = lab::read_summary_fields(d.file(lab::run_files::kSummary));
  const lab::SummaryFields live_s = run.summary_fields();
  EXPECT_EQ(s.steps, c.steps);
  EXPECT_EQ(s.model, c.model);
  EXPECT_FALSE(s.interrupted);
  for (const lab::SummaryFields* f : {&s, &live_s}) {
    EXPECT_EQ(f->eval_mode.acc, summary.eval_mode.acc);
    EXPECT_EQ(f->eval_mode.samples, summary.eval_mode.samples);
    EXPECT_EQ(f->train_mode.loss, summary.train_mode.loss);
    EXPECT_EQ(f->samples_per_s, summary.samples_per_s);
  }
  EXPECT_EQ(live_s.model, s.model);
  EXPECT_EQ(live_s.steps, s.steps);
  EXPECT_EQ(live_s.steps_per_epoch, s.steps_per_epoch);
  EXPECT_EQ(live_s.test_samples, s.test_samples);
  EXPECT_EQ(live_s.train_seconds, s.train_seconds);
  EXPECT_EQ(live_s.device_name, s.device_name);
  const lab::TraceContents t = lab::read_trace(d.file(lab::run_files::kTrace), c.world_size, kept);
  size_t events = 0;
  for (const auto& r : t.per_rank) events += r.size();
  EXPECT_GT(events, 0u);
}

INSTANTIATE_TEST_SUITE_P(
    Kinds, RunFormatRuns,
    ::testing::Values(RunKind{"ddp_eval_every", [](lab::RunConfig& c) { c.eval_every = 3; c.eval_samples = 32; }},
                      RunKind{"ddp_cnn_sync_bn", [](lab::RunConfig& c) { c.model = "cnn"; c.bn = "sync"; }},
                      RunKind{"ddp_no_sync", [](lab::RunConfig& c) { c.no_sync_steps = 1; }},
                      RunKind{"ddp_nondeterministic", [](lab::RunConfig& c) { c.nondeterministic = true; c.allreduce = "naive"; }},
                      RunKind{"dp", [](lab::RunConfig& c) { c.mode = "dp"; c.batch_size = 32; }},
                      RunKind{"local_sgd", [](lab::RunConfig& c) { c.mode = "local-sgd"; c.average_every = 2; }},
                      RunKind{"async", [](lab::RunConfig& c) { c.mode = "async"; c.async_schedule = "seeded"; }}),
    [](const ::testing::TestParamInfo<RunKind>& i) { return std::string(i.param.name); });

// A run directory of format 1 written by this dtlab and kept (tests/fixtures/run_dir_v1, its
// README.txt says how) opens as it did: the numbers below are the ones its files hold.
TEST(RunFormat, AKeptRunDirectoryOfThisFormatStillOpens) {
  const std::string dir = std::string(DTLAB_FIXTURES_DIR) + "/run_dir_v1";
  const viz::RunData d = viz::load_run_dir(dir);
  EXPECT_EQ(d.world(), 2);
  EXPECT_EQ(d.steps_done(), 6);
  const lab::StepRecord* r = d.record(5, 1);
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->rank, 1);
  EXPECT_EQ(r->loss, 1.3947245f);
  EXPECT_EQ(r->correct, 8);
  EXPECT_EQ(r->bytes_sent, 5661936u);
  ASSERT_NE(d.record(0, 0), nullptr);
  EXPECT_FALSE(d.record(0, 0)->bn.empty()) << "the first step's BatchNorm statistics, from bn_stats.bin";
  EXPECT_TRUE(d.summary.valid);
  EXPECT_EQ(d.summary.steps, 6);
  EXPECT_EQ(d.summary.eval_mode.acc, 0.640625);
  EXPECT_EQ(d.steps_per_epoch, 8);
  EXPECT_EQ(d.train_size, 256);
  ASSERT_EQ(d.evals.size(), 4u);  // after 1, 2, 3 and 6 iterations
  EXPECT_EQ(d.evals[3].steps, 6);
  ASSERT_EQ(d.epochs.size(), 1u);
  EXPECT_EQ(d.epochs[0].steps, 6);
  size_t collectives = 0;
  for (const auto& rank : d.events)
    for (const lab::Event& e : rank) collectives += e.kind == lab::EventKind::Collective;
  EXPECT_GT(collectives, 0u);
}
