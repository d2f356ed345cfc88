#include "checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "errors.h"

namespace lab {

namespace fs = std::filesystem;

namespace {

std::string step_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step-%08lld", static_cast<long long>(step));
  return buf;
}

std::string read_all(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw IoError("cannot read " + path + ": " + std::strerror(errno));
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

void fsync_path(const std::string& path, bool directory) {
  const int fd = ::open(path.c_str(), directory ? (O_RDONLY | O_DIRECTORY) : O_RDONLY);
  if (fd < 0) throw IoError("cannot open " + path + " to sync it: " + std::strerror(errno));
  const int r = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (r != 0) throw IoError("cannot sync " + path + ": " + std::strerror(err));
}

// Writes and syncs one file (no rename: the checkpoint's directory is renamed as a whole).
void write_synced(const std::string& path, const std::string& bytes) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) throw IoError("cannot write " + path + ": " + std::strerror(errno));
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      ::close(fd);
      throw IoError("cannot write " + path + ": " + std::strerror(err));
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) throw IoError("cannot write " + path + ": " + std::strerror(errno));
}

std::string safetensors_bytes(const std::vector<SafeTensor>& tensors, const std::string& scratch) {
  write_safetensors(scratch, tensors, {{"format", "pt"}, {"producer", std::string("dtlab ") + kDtlabVersion}});
  std::string b = read_all(scratch);
  std::error_code ec;
  fs::remove(scratch, ec);
  return b;
}

}  // namespace

uint32_t crc32_of(const std::string& bytes) {
  uLong c = crc32(0L, Z_NULL, 0);
  size_t done = 0;
  while (done < bytes.size()) {  // zlib takes uInt lengths
    const uInt n = static_cast<uInt>(std::min<size_t>(bytes.size() - done, 1u << 30));
    c = crc32(c, reinterpret_cast<const Bytef*>(bytes.data() + done), n);
    done += n;
  }
  return static_cast<uint32_t>(c);
}

void write_file_atomic(const std::string& path, const std::string& bytes) {
  const std::string tmp = path + ".tmp";
  write_synced(tmp, bytes);
  if (std::rename(tmp.c_str(), path.c_str()) != 0)
    throw IoError("cannot rename " + tmp + " to " + path + ": " + std::strerror(errno));
  fsync_path(fs::path(path).parent_path().string(), true);
}

// ---- JSON forms ----

nlohmann::json epoch_json(const EpochRecord& e) {
  return {{"epoch", e.epoch},         {"steps", e.steps},       {"train_loss", e.train_loss},
          {"train_accuracy", e.train_acc}, {"test_loss", e.test_loss}, {"test_accuracy", e.test_acc},
          {"seconds", e.seconds},     {"samples_per_s", e.samples_per_s}, {"lr", e.lr}};
}

EpochRecord epoch_from_json(const nlohmann::json& j) {
  EpochRecord e;
  e.epoch = j.at("epoch").get<int64_t>();
  e.steps = j.at("steps").get<int64_t>();
  e.train_loss = j.at("train_loss").get<double>();
  e.train_acc = j.at("train_accuracy").get<double>();
  e.test_loss = j.at("test_loss").get<double>();
  e.test_acc = j.at("test_accuracy").get<double>();
  e.seconds = j.value("seconds", 0.0);
  e.samples_per_s = j.value("samples_per_s", 0.0);
  e.lr = j.at("lr").get<double>();
  return e;
}

nlohmann::json eval_json(const EvalPoint& p) {
  return {{"steps", p.steps},
          {"epoch", p.epoch},
          {"samples", p.samples},
          {"eval_mode", {{"accuracy", p.eval_mode.acc}, {"loss", p.eval_mode.loss}, {"samples", p.eval_mode.samples}}},
          {"train_mode", {{"accuracy", p.train_mode.acc}, {"loss", p.train_mode.loss}, {"samples", p.train_mode.samples}}},
          {"probe_label", p.probe_label},
          {"probe_eval", p.probe_eval},
          {"probe_train", p.probe_train}};
}

EvalPoint eval_from_json(const nlohmann::json& j) {
  EvalPoint p;
  p.steps = j.at("steps").get<int64_t>();
  p.epoch = j.at("epoch").get<int64_t>();
  p.samples = j.at("samples").get<int64_t>();
  auto res = [](const nlohmann::json& r) {
    EvalResult e;
    e.acc = r.at("accuracy").get<double>();
    e.loss = r.at("loss").get<double>();
    e.samples = r.at("samples").get<int64_t>();
    return e;
  };
  p.eval_mode = res(j.at("eval_mode"));
  p.train_mode = res(j.at("train_mode"));
  p.probe_label = j.at("probe_label").get<int>();
  p.probe_eval = j.at("probe_eval").get<std::vector<float>>();
  p.probe_train = j.at("probe_train").get<std::vector<float>>();
  return p;
}

nlohmann::json traffic_json(const TrafficStats& t) {
  nlohmann::json parts = nlohmann::json::array();
  for (const TrafficStats::Part& p : t.by_what)
    parts.push_back({{"what", p.what}, {"bytes_moved", p.bytes_moved}, {"sent", p.sent}, {"received", p.received}});
  return {{"bytes_moved", t.bytes_moved}, {"sent", t.sent}, {"received", t.received}, {"by_what", parts}};
}

TrafficStats traffic_from_json(const nlohmann::json& j) {
  TrafficStats t;
  t.bytes_moved = j.at("bytes_moved").get<uint64_t>();
  t.sent = j.at("sent").get<std::vector<uint64_t>>();
  t.received = j.at("received").get<std::vector<uint64_t>>();
  for (const auto& p : j.at("by_what"))
    t.by_what.push_back({p.at("what").get<std::string>(), p.at("bytes_moved").get<uint64_t>(),
                         p.at("sent").get<std::vector<uint64_t>>(), p.at("received").get<std::vector<uint64_t>>()});
  return t;
}

TrafficStats add_traffic(const TrafficStats& a, const TrafficStats& b) {
  TrafficStats t = a;
  const size_t n = std::max(a.sent.size(), b.sent.size());
  t.sent.resize(n, 0);
  t.received.resize(n, 0);
  t.bytes_moved += b.bytes_moved;
  for (size_t r = 0; r < b.sent.size(); ++r) t.sent[r] += b.sent[r];
  for (size_t r = 0; r < b.received.size(); ++r) t.received[r] += b.received[r];
  for (const TrafficStats::Part& p : b.by_what) {
    auto it = std::find_if(t.by_what.begin(), t.by_what.end(), [&](const TrafficStats::Part& q) { return q.what == p.what; });
    if (it == t.by_what.end()) {
      t.by_what.push_back(p);
      continue;
    }
    it->bytes_moved += p.bytes_moved;
    it->sent.resize(std::max(it->sent.size(), p.sent.size()), 0);
    it->received.resize(std::max(it->received.size(), p.received.size()), 0);
    for (size_t r = 0; r < p.sent.size(); ++r) it->sent[r] += p.sent[r];
    for (size_t r = 0; r < p.received.size(); ++r) it->received[r] += p.received[r];
  }
  t.rank0_share = t.bytes_moved > 0 && !t.sent.empty()
                      ? static_cast<double>(t.sent[0] + t.received[0]) / static_cast<double>(t.bytes_moved)
                      : 0.0;
  return t;
}

nlohmann::json overlap_json(const OverlapStats& o) {
  return {{"comm_seconds", o.comm_seconds}, {"hidden_seconds", o.hidden_seconds}};
}

OverlapStats overlap_from_json(const nlohmann::json& j) {
  OverlapStats o;
  o.comm_seconds = j.at("comm_seconds").get<std::vector<double>>();
  o.hidden_seconds = j.at("hidden_seconds").get<std::vector<double>>();
  for (double v : o.comm_seconds) o.comm_seconds_total += v;
  for (double v : o.hidden_seconds) o.hidden_seconds_total += v;
  o.hidden_fraction = o.comm_seconds_total > 0 ? o.hidden_seconds_total / o.comm_seconds_total : 0.0;
  return o;
}

namespace {
std::vector<double> add_vec(std::vector<double> a, const std::vector<double>& b) {
  a.resize(std::max(a.size(), b.size()), 0.0);
  for (size_t i = 0; i < b.size(); ++i) a[i] += b[i];
  return a;
}
}  // namespace

OverlapStats add_overlap(const OverlapStats& a, const OverlapStats& b) {
  return overlap_from_json(overlap_json(OverlapStats{add_vec(a.comm_seconds, b.comm_seconds),
                                                     add_vec(a.hidden_seconds, b.hidden_seconds)}));
}

nlohmann::json compute_json(const ComputeStats& c) {
  return {{"forward", c.forward}, {"backward", c.backward}, {"optimizer", c.optimizer}};
}

ComputeStats compute_from_json(const nlohmann::json& j) {
  ComputeStats c;
  c.forward = j.at("forward").get<std::vector<double>>();
  c.backward = j.at("backward").get<std::vector<double>>();
  c.optimizer = j.at("optimizer").get<std::vector<double>>();
  return c;
}

ComputeStats add_compute(const ComputeStats& a, const ComputeStats& b) {
  return ComputeStats{add_vec(a.forward, b.forward), add_vec(a.backward, b.backward), add_vec(a.optimizer, b.optimizer)};
}

// ---- writing ----

void write_rank_checkpoint(const std::string& run_dir, int64_t step, int rank, const RankCheckpoint& rc) {
  const std::string tmp = run_dir + "/checkpoints/.tmp-" + step_name(step);
  std::error_code ec;
  fs::create_directories(tmp, ec);
  if (ec) throw IoError("cannot create " + tmp + ": " + ec.message());
  const std::string stem = tmp + "/rank" + std::to_string(rank);
  write_synced(stem + ".safetensors", safetensors_bytes(rc.tensors, stem + ".scratch"));
  write_synced(stem + ".json", rc.counters.dump());
  // A killed earlier attempt at this checkpoint may have left its files in the same .tmp directory:
  // every file is written anew, and one this checkpoint does not have is removed (a stale
  // .records would add its steps again to a metrics.jsonl that already holds them). Rank 0's
  // write_rank_records comes after every rank's write_rank_checkpoint (the ranks tell it first).
  if (!rc.records.empty()) write_synced(stem + ".records", std::string(rc.records.begin(), rc.records.end()));
  else fs::remove(stem + ".records", ec);
  if (!rc.events.empty()) write_synced(stem + ".events", std::string(rc.events.begin(), rc.events.end()));
  else fs::remove(stem + ".events", ec);
}

void write_rank_records(const std::string& run_dir, int64_t step, int rank, const std::vector<char>& records) {
  const std::string tmp = run_dir + "/checkpoints/.tmp-" + step_name(step);
  write_synced(tmp + "/rank" + std::to_string(rank) + ".records", std::string(records.begin(), records.end()));
}

void commit_checkpoint(const std::string& run_dir, const CheckpointState& st) {
  const std::string root = run_dir + "/checkpoints";
  const std::string name = step_name(st.step);
  const std::string tmp = root + "/.tmp-" + name, dir = root + "/" + name;
  // every rank's files, with their CRCs
  nlohmann::json files = nlohmann::json::object();
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(tmp, ec)) {
    const std::string f = e.path().filename().string();
    files[f] = {{"bytes", fs::file_size(e.path())}, {"crc32", crc32_of(read_all(e.path().string()))}};
  }
  if (ec) throw IoError("cannot list " + tmp + ": " + ec.message());
  nlohmann::json ev = nlohmann::json::array(), ep = nlohmann::json::array();
  for (const EpochRecord& e : st.epochs) ep.push_back(epoch_json(e));
  for (const EvalPoint& p : st.evals) ev.push_back(eval_json(p));
  const nlohmann::json state = {{"format", "dtlab-checkpoint"},
                                {"format_version", kCheckpointFormatVersion},
                                {"producer", std::string("dtlab ") + kDtlabVersion},
                                {"step", st.step},
                                {"epoch", st.epoch},
                                {"batch", st.batch},
                                {"require_forward_param_sync", st.require_forward_param_sync},
                                {"world_size", st.world_size},
                                {"model", st.model},
                                {"mode", st.mode},
                                {"interrupted", st.interrupted},
                                {"config", st.config_toml},
                                {"epochs", ep},
                                {"evals", ev},
                                {"elapsed_seconds", st.elapsed},
                                {"eval_seconds", st.eval_seconds},
                                {"metrics_bytes", st.metrics_bytes},
                                {"bn_stats_bytes", st.bn_stats_bytes},
                                {"files", files}};
  const std::string text = state.dump(1) + "\n";
  write_synced(tmp + "/state.json", text);
  fsync_path(tmp, true);
  fs::remove_all(dir, ec);  // a stale, uncommitted directory of the same step
  if (std::rename(tmp.c_str(), dir.c_str()) != 0)
    throw IoError("cannot rename " + tmp + " to " + dir + ": " + std::strerror(errno));
  fsync_path(root, true);
  write_file_atomic(dir + "/COMMITTED", std::to_string(crc32_of(text)) + "\n");
  // keep this checkpoint and the one before it
  std::vector<std::string> committed;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    const std::string f = e.path().filename().string();
    if (f.rfind("step-", 0) == 0 && fs::exists(e.path() / "COMMITTED") && f < name) committed.push_back(f);
    else if ((f.rfind(".tmp-", 0) == 0 && f.substr(5) < name) ||
             (f.rfind("step-", 0) == 0 && f < name && !fs::exists(e.path() / "COMMITTED")))
      fs::remove_all(e.path(), ec);  // leftovers of older checkpoints killed while being written (a rank
                                     // that ran ahead may be writing the next one: not that)
  }
  std::sort(committed.begin(), committed.end());
  for (size_t i = 0; i + 1 < committed.size(); ++i) fs::remove_all(root + "/" + committed[i], ec);
}

// ---- reading ----

namespace {

std::string check_files(const std::string& dir, const nlohmann::json& listed);

// "" when dir is a committed, intact checkpoint; else what is wrong with it.
std::string check_checkpoint(const std::string& dir) {
  std::error_code ec;
  if (!fs::exists(dir + "/COMMITTED", ec)) return "not committed (it was being written when the run stopped)";
  std::string text, marker;
  try {
    text = read_all(dir + "/state.json");
    marker = read_all(dir + "/COMMITTED");
  } catch (const IoError& e) {
    return e.what();
  }
  if (std::to_string(crc32_of(text)) + "\n" != marker) return "state.json does not match its COMMITTED checksum";
  nlohmann::json st;
  try {
    st = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    return std::string("state.json is not JSON: ") + e.what();
  }
  if (!st.is_object() || !st.contains("format") || st["format"] != "dtlab-checkpoint")
    return "state.json is not a dtlab checkpoint";
  if (!st.contains("format_version") || !st["format_version"].is_number_integer())
    return "state.json has no format_version";
  if (st.value("format_version", -1) != kCheckpointFormatVersion)
    return "format version " + std::to_string(st.value("format_version", -1)) + ", this dtlab reads " +
           std::to_string(kCheckpointFormatVersion);
  if (!st.contains("files") || !st["files"].is_object()) return "state.json lists no files";
  try {
    return check_files(dir, st["files"]);
  } catch (const nlohmann::json::exception& e) {
    return std::string("state.json: ") + e.what();
  }
}

// "" when every file state.json lists has the listed size and CRC-32.
std::string check_files(const std::string& dir, const nlohmann::json& listed) {
  for (auto it = listed.begin(); it != listed.end(); ++it) {
    const std::string path = dir + "/" + it.key();
    std::string bytes;
    try {
      bytes = read_all(path);
    } catch (const IoError&) {
      return it.key() + " is missing";
    }
    if (!it.value().is_object() || bytes.size() != it.value().value("bytes", uint64_t{0}) ||
        crc32_of(bytes) != it.value().value("crc32", uint32_t{0}))
      return it.key() + " does not match its checksum (the file was damaged)";
  }
  return "";
}

}  // namespace

FoundCheckpoint find_checkpoint(const std::string& run_dir) {
  const std::string root = run_dir + "/checkpoints";
  std::vector<std::string> names;
  std::error_code ec;
  if (!fs::exists(run_dir, ec))
    throw IoError("--resume: " + run_dir + " does not exist", "give the run directory of a run written with --out DIR "
                                                                "and checkpoints (--checkpoint-every N)");
  if (!fs::is_directory(run_dir, ec)) throw IoError("--resume: " + run_dir + " is not a folder (a run directory is)");
  for (const auto& e : fs::directory_iterator(root, ec))
    if (e.path().filename().string().rfind("step-", 0) == 0) names.push_back(e.path().filename().string());
  if (ec || names.empty())
    throw IoError("--resume: " + run_dir + " has no checkpoint (" + root + ")",
                  "write checkpoints with --checkpoint-every N or --checkpoint-every-epoch");
  std::sort(names.rbegin(), names.rend());
  FoundCheckpoint found;
  for (const std::string& n : names) {
    const std::string problem = check_checkpoint(root + "/" + n);
    if (problem.empty()) {
      found.dir = root + "/" + n;
      found.step = std::strtoll(n.c_str() + 5, nullptr, 10);
      return found;
    }
    found.notes.push_back("checkpoint " + n + " is not used: " + problem);
  }
  std::string all;
  for (const std::string& s : found.notes) all += "\n  " + s;
  throw IoError("--resume: " + run_dir + " has no usable checkpoint:" + all,
                "the run must start again (without --resume)");
}

CheckpointState read_checkpoint_state(const std::string& dir) {
  const std::string text = read_all(dir + "/state.json");
  CheckpointState st;
  try {
    const nlohmann::json j = nlohmann::json::parse(text);
    st.step = j.at("step").get<int64_t>();
    st.epoch = j.at("epoch").get<int64_t>();
    st.batch = j.at("batch").get<int64_t>();
    st.require_forward_param_sync = j.at("require_forward_param_sync").get<bool>();
    st.world_size = j.at("world_size").get<int>();
    st.model = j.at("model").get<std::string>();
    st.mode = j.at("mode").get<std::string>();
    st.interrupted = j.value("interrupted", false);
    st.config_toml = j.at("config").get<std::string>();
    for (const auto& e : j.at("epochs")) st.epochs.push_back(epoch_from_json(e));
    for (const auto& e : j.at("evals")) st.evals.push_back(eval_from_json(e));
    st.elapsed = j.at("elapsed_seconds").get<double>();
    st.eval_seconds = j.at("eval_seconds").get<double>();
    st.metrics_bytes = j.at("metrics_bytes").get<uint64_t>();
    st.bn_stats_bytes = j.at("bn_stats_bytes").get<uint64_t>();
  } catch (const nlohmann::json::exception& e) {
    throw IoError(dir + "/state.json: " + e.what());
  }
  return st;
}

nlohmann::json read_rank_counters(const std::string& dir, int rank) {
  const std::string path = dir + "/rank" + std::to_string(rank) + ".json";
  try {
    return nlohmann::json::parse(read_all(path));
  } catch (const nlohmann::json::exception& e) {
    throw IoError(path + ": " + e.what());
  }
}

RankCheckpoint read_rank_checkpoint(const std::string& dir, int rank) {
  RankCheckpoint rc;
  const std::string stem = dir + "/rank" + std::to_string(rank);
  rc.tensors = read_safetensors(stem + ".safetensors");
  try {
    rc.counters = nlohmann::json::parse(read_all(stem + ".json"));
  } catch (const nlohmann::json::exception& e) {
    throw IoError(stem + ".json: " + e.what());
  }
  std::error_code ec;
  if (fs::exists(stem + ".records", ec)) {
    const std::string b = read_all(stem + ".records");
    rc.records.assign(b.begin(), b.end());
  }
  if (fs::exists(stem + ".events", ec)) {
    const std::string b = read_all(stem + ".events");
    rc.events.assign(b.begin(), b.end());
  }
  return rc;
}

}  // namespace lab
