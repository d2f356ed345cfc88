// RankReport encoding: see run_wire.h for the layout. Supported: same build at both ends (host
// byte order). Not supported: reading reports of another dtlab version (the version word is
// checked and a mismatch is an error).
#include "run_wire.h"

#include <array>

#include <chrono>
#include <cstring>
#include <map>

#include "errors.h"

namespace lab {

namespace {

constexpr uint32_t kMagic = 0x524c5444;  // "DTLR"
constexpr uint32_t kVersion = 5;  // 4: events name their process group; 5: trained_samples

class Writer {
 public:
  template <class T>
  void put(T v) {
    const char* p = reinterpret_cast<const char*>(&v);
    m_buf.insert(m_buf.end(), p, p + sizeof v);
  }
  void bytes(const void* p, size_t n) {
    put<uint64_t>(n);
    const char* c = static_cast<const char*>(p);
    m_buf.insert(m_buf.end(), c, c + n);
  }
  void str(const std::string& s) { bytes(s.data(), s.size()); }
  void floats(const std::vector<float>& v) { bytes(v.data(), v.size() * sizeof(float)); }
  std::vector<char> take() { return std::move(m_buf); }

 private:
  std::vector<char> m_buf;
};

class Reader {
 public:
  Reader(const std::vector<char>& b, int from) : m_buf(b), m_from(from) {}
  template <class T>
  T get() {
    need(sizeof(T));
    T v;
    std::memcpy(&v, m_buf.data() + m_pos, sizeof v);
    m_pos += sizeof v;
    return v;
  }
  // A count of items of at least min_item_bytes each: bounded by what is left.
  uint64_t count(size_t min_item_bytes) {
    const uint64_t n = get<uint64_t>();
    if (min_item_bytes > 0 && n > (m_buf.size() - m_pos) / min_item_bytes) bad("a count past the end");
    return n;
  }
  std::string str() {
    const uint64_t n = count(1);
    std::string s(m_buf.data() + m_pos, n);
    m_pos += n;
    return s;
  }
  std::vector<float> floats() {
    const uint64_t n = count(1);
    if (n % sizeof(float)) bad("a float array of " + std::to_string(n) + " bytes");
    std::vector<float> v(n / sizeof(float));
    if (n) std::memcpy(v.data(), m_buf.data() + m_pos, n);
    m_pos += n;
    return v;
  }
  std::vector<uint8_t> raw() {
    const uint64_t n = count(1);
    std::vector<uint8_t> v(m_buf.begin() + static_cast<std::ptrdiff_t>(m_pos),
                           m_buf.begin() + static_cast<std::ptrdiff_t>(m_pos + n));
    m_pos += n;
    return v;
  }
  bool at_end() const { return m_pos == m_buf.size(); }
  [[noreturn]] void bad(const std::string& what) const {
    throw CommError("rank 0: the end-of-run report from rank " + std::to_string(m_from) + " is malformed: " + what +
                        " (at byte " + std::to_string(m_pos) + " of " + std::to_string(m_buf.size()) + ")",
                    "every process must run the same dtlab build");
  }

 private:
  void need(size_t n) {
    if (m_buf.size() - m_pos < n) bad("it ends early");
  }
  const std::vector<char>& m_buf;
  int m_from;
  size_t m_pos = 0;
};

}  // namespace

double clock_origin_seconds() {
  const double abs_now =
      std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  return abs_now - now_seconds();
}

std::vector<char> encode_rank_report(const RankReport& r) {
  Writer w;
  w.put(kMagic);
  w.put(kVersion);
  w.put(r.clock_origin);
  w.put(r.t0);
  w.put(r.trained_samples);
  w.put<uint64_t>(r.records.size());
  for (const StepRecord& s : r.records) {
    w.put<int32_t>(s.rank);
    w.put(s.step);
    w.put(s.epoch);
    w.put(s.batch);
    w.put(s.batch_size);
    w.put(s.loss);
    w.put(s.correct);
    w.put(s.bytes_sent);
    w.put(s.t);
    w.put<uint64_t>(s.chunks.size());
    for (int64_t c : s.chunks) w.put(c);
    w.put(s.param_drift);
    w.put<uint8_t>(s.grad_sync ? 1 : 0);
    w.put(s.staleness);
    w.put(s.version);
    w.put(s.param_checksum);
    w.put<uint8_t>(s.skipped ? 1 : 0);
    w.str(s.nonfinite);
    w.put<uint64_t>(s.bn.size());
    for (const BnLayerRecord& b : s.bn) {
      w.str(b.layer);
      w.put(b.count);
      w.floats(b.batch_mean);
      w.floats(b.batch_var);
      w.floats(b.local_mean);
      w.floats(b.local_var);
      w.floats(b.running_mean);
      w.floats(b.running_var);
      w.put(b.num_batches_tracked);
    }
    w.put<uint64_t>(s.memory.size());
    for (const MemorySample& m : s.memory) {
      w.str(m.point);
      for (int c = 0; c < kMemCategories; ++c) w.put(m.bytes[c]);
    }
  }
  // Event names once each, then events referring to them by index.
  std::map<std::string, uint32_t> index;
  std::vector<std::string> names;
  auto name_of = [&](const char* s) {
    const std::string key = s ? s : "";
    auto it = index.find(key);
    if (it != index.end()) return it->second;
    const uint32_t i = static_cast<uint32_t>(names.size());
    index.emplace(key, i);
    names.push_back(key);
    return i;
  };
  std::vector<std::array<uint32_t, 3>> event_names;
  event_names.reserve(r.events.size());
  for (const Event& e : r.events) {
    const uint32_t op = name_of(e.op);
    const uint32_t what = name_of(e.what);
    event_names.push_back({op, what, name_of(e.group)});
  }
  w.put<uint64_t>(names.size());
  for (const std::string& n : names) w.str(n);
  w.put<uint64_t>(r.events.size());
  for (size_t i = 0; i < r.events.size(); ++i) {
    const Event& e = r.events[i];
    w.put(static_cast<uint8_t>(e.kind));
    w.put(static_cast<uint8_t>(e.phase));
    w.put(event_names[i][0]);
    w.put(event_names[i][1]);
    w.put(event_names[i][2]);
    w.put(e.tag);
    w.put(e.rank);
    w.put(e.src);
    w.put(e.dst);
    w.put(e.chunk);
    w.put(e.ring_step);
    w.put(e.op_seq);
    w.put(e.train_step);
    w.put(e.bytes);
    w.put(e.t_start);
    w.put(e.t_end);
  }
  w.put<uint64_t>(r.tensors.size());
  for (const SafeTensor& t : r.tensors) {
    w.str(t.name);
    w.str(t.dtype);
    w.put<uint64_t>(t.shape.size());
    for (int64_t d : t.shape) w.put(d);
    w.bytes(t.bytes.data(), t.bytes.size());
  }
  return w.take();
}

RankReport decode_rank_report(const std::vector<char>& bytes, int from_rank,
                              const std::function<const char*(const std::string&)>& intern) {
  Reader rd(bytes, from_rank);
  if (rd.get<uint32_t>() != kMagic) rd.bad("wrong magic");
  const uint32_t version = rd.get<uint32_t>();
  if (version != kVersion) rd.bad("version " + std::to_string(version) + ", expected " + std::to_string(kVersion));
  RankReport r;
  r.clock_origin = rd.get<double>();
  r.t0 = rd.get<double>();
  r.trained_samples = rd.get<int64_t>();
  r.records.resize(rd.count(64));
  for (StepRecord& s : r.records) {
    s.rank = rd.get<int32_t>();
    s.step = rd.get<int64_t>();
    s.epoch = rd.get<int64_t>();
    s.batch = rd.get<int64_t>();
    s.batch_size = rd.get<int64_t>();
    s.loss = rd.get<float>();
    s.correct = rd.get<int64_t>();
    s.bytes_sent = rd.get<uint64_t>();
    s.t = rd.get<double>();
    s.chunks.resize(rd.count(8));
    for (int64_t& c : s.chunks) c = rd.get<int64_t>();
    s.param_drift = rd.get<double>();
    s.grad_sync = rd.get<uint8_t>() != 0;
    s.staleness = rd.get<int64_t>();
    s.version = rd.get<int64_t>();
    s.param_checksum = rd.get<double>();
    s.skipped = rd.get<uint8_t>() != 0;
    s.nonfinite = rd.str();
    s.bn.resize(rd.count(64));
    for (BnLayerRecord& b : s.bn) {
      b.layer = rd.str();
      b.count = rd.get<int64_t>();
      b.batch_mean = rd.floats();
      b.batch_var = rd.floats();
      b.local_mean = rd.floats();
      b.local_var = rd.floats();
      b.running_mean = rd.floats();
      b.running_var = rd.floats();
      b.num_batches_tracked = rd.get<int64_t>();
    }
    s.memory.resize(rd.count(8 + 8 * kMemCategories));
    for (MemorySample& m : s.memory) {
      m.point = rd.str();
      for (int c = 0; c < kMemCategories; ++c) m.bytes[c] = rd.get<int64_t>();
    }
  }
  std::vector<const char*> names(rd.count(8));
  for (const char*& n : names) n = intern(rd.str());
  r.events.resize(rd.count(64));
  for (Event& e : r.events) {
    const uint8_t kind = rd.get<uint8_t>(), phase = rd.get<uint8_t>();
    if (kind > static_cast<uint8_t>(EventKind::kLastKind) || phase > static_cast<uint8_t>(Phase::kLast))
      rd.bad("an event of kind " + std::to_string(kind) + ", phase " + std::to_string(phase));
    e.kind = static_cast<EventKind>(kind);
    e.phase = static_cast<Phase>(phase);
    const uint32_t op = rd.get<uint32_t>(), what = rd.get<uint32_t>(), group = rd.get<uint32_t>();
    if (op >= names.size() || what >= names.size() || group >= names.size()) rd.bad("an event name index out of range");
    e.op = names[op];
    e.what = names[what];
    e.group = names[group];
    e.tag = rd.get<int32_t>();
    e.rank = rd.get<int32_t>();
    e.src = rd.get<int32_t>();
    e.dst = rd.get<int32_t>();
    e.chunk = rd.get<int32_t>();
    e.ring_step = rd.get<int32_t>();
    e.op_seq = rd.get<uint64_t>();
    e.train_step = rd.get<int64_t>();
    e.bytes = rd.get<uint64_t>();
    e.t_start = rd.get<double>();
    e.t_end = rd.get<double>();
  }
  r.tensors.resize(rd.count(24));
  for (SafeTensor& t : r.tensors) {
    t.name = rd.str();
    t.dtype = rd.str();
    t.shape.resize(rd.count(8));
    for (int64_t& d : t.shape) d = rd.get<int64_t>();
    t.bytes = rd.raw();
  }
  if (!rd.at_end()) rd.bad("trailing bytes");
  return r;
}

}  // namespace lab
