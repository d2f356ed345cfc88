#include "bn_stats.h"

#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <sstream>

#include "errors.h"

namespace lab {

namespace {

constexpr char kMagic[8] = {'D', 'T', 'L', 'A', 'B', 'B', 'N', '1'};
constexpr int kFields = 6;

// The six arrays of a layer record, in file order.
std::vector<float>& field(BnLayerRecord& b, int f) {
  switch (f) {
    case 0: return b.batch_mean;
    case 1: return b.batch_var;
    case 2: return b.local_mean;
    case 3: return b.local_var;
    case 4: return b.running_mean;
    default: return b.running_var;
  }
}
const std::vector<float>& field(const BnLayerRecord& b, int f) { return field(const_cast<BnLayerRecord&>(b), f); }

template <class T>
void put(std::string& out, T v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof v);
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

}  // namespace

bool bn_recorded(const std::string& policy, int64_t step, int64_t epoch) {
  if (policy == "all") return true;
  if (policy == "off") return false;
  if (policy == "auto") return epoch == 0 || step % kBnAutoEvery == 0;
  const int64_t every = std::stoll(policy);
  return step % every == 0;
}

BnStatsWriter::BnStatsWriter(const std::string& path, int world_size, uint64_t keep_bytes)
    : m_path(path), m_world(world_size) {
  if (keep_bytes > 0) {
    std::error_code ec;
    const uint64_t have = std::filesystem::file_size(path, ec);
    if (ec || have < keep_bytes)
      throw IoError(path + " has " + (ec ? std::string("no") : std::to_string(have)) + " bytes, the checkpoint expects " +
                    std::to_string(keep_bytes) + " (the file was cut or replaced after the checkpoint)");
    std::filesystem::resize_file(path, keep_bytes, ec);
    if (ec) throw IoError("cannot cut " + path + " to the checkpoint's " + std::to_string(keep_bytes) + " bytes: " + ec.message());
    m_header = true;
    m_out.open(path, std::ios::binary | std::ios::app);
  } else {
    m_out.open(path, std::ios::binary | std::ios::trunc);
  }
  if (!m_out) throw IoError("cannot write " + path + ": " + std::strerror(errno));
}

void BnStatsWriter::flush() {
  m_out.flush();
  if (!m_out) throw IoError("cannot write " + m_path);
}

void BnStatsWriter::append(const std::vector<const StepRecord*>& records) {
  // the layers: from the first rank that has statistics this step
  const StepRecord* any = nullptr;
  for (const StepRecord* r : records)
    if (r && !r->bn.empty()) any = r;
  if (!any) return;
  std::string out;
  const size_t layers = any->bn.size();
  if (!m_header) {
    out.append(kMagic, sizeof kMagic);
    put<uint32_t>(out, kBnStatsFormatVersion);
    put<uint32_t>(out, static_cast<uint32_t>(m_world));
    put<uint32_t>(out, static_cast<uint32_t>(layers));
    for (const BnLayerRecord& b : any->bn) {
      put<uint32_t>(out, static_cast<uint32_t>(b.layer.size()));
      out += b.layer;
      put<uint32_t>(out, static_cast<uint32_t>(b.batch_mean.size()));
    }
    m_header = true;
  }
  put<int64_t>(out, any->step);
  put<int64_t>(out, any->epoch);
  put<uint32_t>(out, static_cast<uint32_t>(layers));
  for (size_t l = 0; l < layers; ++l) {
    const size_t channels = any->bn[l].batch_mean.size();
    auto layer_of = [&](int r) -> const BnLayerRecord* {
      const StepRecord* rec = r < static_cast<int>(records.size()) ? records[static_cast<size_t>(r)] : nullptr;
      return rec && l < rec->bn.size() ? &rec->bn[l] : nullptr;
    };
    for (int r = 0; r < m_world; ++r) put<int64_t>(out, layer_of(r) ? layer_of(r)->count : 0);
    for (int r = 0; r < m_world; ++r) put<int64_t>(out, layer_of(r) ? layer_of(r)->num_batches_tracked : 0);
    for (int f = 0; f < kFields; ++f) {
      // absent everywhere, the same everywhere (stored once), or per rank
      bool present = false, shared = true;
      const std::vector<float>* first = nullptr;
      for (int r = 0; r < m_world; ++r) {
        const BnLayerRecord* b = layer_of(r);
        const std::vector<float>* v = b ? &field(*b, f) : nullptr;
        if (v && v->empty()) v = nullptr;
        present |= v != nullptr;
        if (!v || v->size() != channels) {
          shared = false;
          continue;
        }
        if (!first) first = v;
        else if (!same_bits(*first, *v)) shared = false;
      }
      if (!present) {
        put<uint8_t>(out, 0);
      } else if (shared && first) {
        put<uint8_t>(out, 1);
        out.append(reinterpret_cast<const char*>(first->data()), channels * sizeof(float));
      } else {
        put<uint8_t>(out, 2);
        const std::vector<float> none(channels, std::numeric_limits<float>::quiet_NaN());
        for (int r = 0; r < m_world; ++r) {
          const BnLayerRecord* b = layer_of(r);
          const std::vector<float>* v = b ? &field(*b, f) : nullptr;
          const std::vector<float>& w = v && v->size() == channels ? *v : none;
          out.append(reinterpret_cast<const char*>(w.data()), channels * sizeof(float));
        }
      }
    }
  }
  m_out.write(out.data(), static_cast<std::streamsize>(out.size()));
  m_out.flush();
  if (!m_out) throw IoError("cannot write " + m_path + ": " + std::strerror(errno));
}

// ---- reading ----

namespace {

class Cursor {
 public:
  Cursor(const std::string& b, const std::string& name) : m_b(b), m_name(name) {}
  template <class T>
  T get(const char* what) {
    if (m_pos + sizeof(T) > m_b.size()) fail(std::string("truncated in ") + what);
    T v;
    std::memcpy(&v, m_b.data() + m_pos, sizeof v);
    m_pos += sizeof v;
    return v;
  }
  void floats(std::vector<float>& out, size_t n, const char* what) {
    if (n > (m_b.size() - m_pos) / sizeof(float)) fail(std::string("truncated in ") + what);
    out.resize(n);
    if (n) std::memcpy(out.data(), m_b.data() + m_pos, n * sizeof(float));
    m_pos += n * sizeof(float);
  }
  std::string bytes(size_t n, const char* what) {
    if (n > m_b.size() - m_pos) fail(std::string("truncated in ") + what);
    std::string s = m_b.substr(m_pos, n);
    m_pos += n;
    return s;
  }
  bool done() const { return m_pos == m_b.size(); }
  size_t pos() const { return m_pos; }
  [[noreturn]] void fail(const std::string& why) const {
    throw IoError(m_name + ": " + why + " at byte " + std::to_string(m_pos),
                  "a BatchNorm statistics file of dtlab (bn_stats.bin); a run that was killed may leave its last "
                  "record cut short");
  }

 private:
  const std::string& m_b;
  const std::string& m_name;
  size_t m_pos = 0;
};

bool all_nan(const std::vector<float>& v) {
  for (float x : v)
    if (!std::isnan(x)) return false;
  return !v.empty();
}

}  // namespace

BnStatsFile parse_bn_stats(const std::string& b, const std::string& name) {
  BnStatsFile f;
  if (b.empty()) return f;  // nothing recorded yet: the header is written with the first record
  Cursor c(b, name);
  if (b.size() < sizeof kMagic || std::memcmp(b.data(), kMagic, sizeof kMagic) != 0)
    throw IoError(name + ": not a BatchNorm statistics file (no DTLABBN1 header)");
  c.bytes(sizeof kMagic, "the header");
  const uint32_t version = c.get<uint32_t>("the header");
  if (version != kBnStatsFormatVersion)
    throw IoError(name + ": format version " + std::to_string(version) + ", this dtlab reads " + std::to_string(kBnStatsFormatVersion));
  const uint32_t world = c.get<uint32_t>("the header");
  const uint32_t layers = c.get<uint32_t>("the header");
  if (world < 1 || world > static_cast<uint32_t>(kMaxWorldSize) || layers > 1024) c.fail("an implausible header");
  f.world_size = static_cast<int>(world);
  for (uint32_t l = 0; l < layers; ++l) {
    const uint32_t len = c.get<uint32_t>("a layer name");
    if (len > 256) c.fail("a layer name of " + std::to_string(len) + " bytes");
    const std::string layer = c.bytes(len, "a layer name");
    const uint32_t channels = c.get<uint32_t>("a layer's channels");
    if (channels > (1u << 20)) c.fail("a layer of " + std::to_string(channels) + " channels");
    f.layers.emplace_back(layer, static_cast<int>(channels));
  }
  while (!c.done()) {
    const int64_t step = c.get<int64_t>("a record");
    const int64_t epoch = c.get<int64_t>("a record");
    const uint32_t n = c.get<uint32_t>("a record");
    if (n != layers) c.fail("a record with " + std::to_string(n) + " layers, the header says " + std::to_string(layers));
    std::vector<StepRecord> recs(world);
    for (uint32_t r = 0; r < world; ++r) {
      recs[r].rank = static_cast<int>(r);
      recs[r].step = step;
      recs[r].epoch = epoch;
      recs[r].bn.resize(layers);
    }
    for (uint32_t l = 0; l < layers; ++l) {
      const size_t channels = static_cast<size_t>(f.layers[l].second);
      for (uint32_t r = 0; r < world; ++r) {
        recs[r].bn[l].layer = f.layers[l].first;
        recs[r].bn[l].count = c.get<int64_t>("a count");
      }
      for (uint32_t r = 0; r < world; ++r) recs[r].bn[l].num_batches_tracked = c.get<int64_t>("num_batches_tracked");
      std::vector<float> v;
      for (int fi = 0; fi < kFields; ++fi) {
        const uint8_t how = c.get<uint8_t>("a field");
        if (how == 1) {
          c.floats(v, channels, "a field");
          for (uint32_t r = 0; r < world; ++r) field(recs[r].bn[l], fi) = v;
        } else if (how == 2) {
          for (uint32_t r = 0; r < world; ++r) {
            c.floats(v, channels, "a field");
            if (!all_nan(v)) field(recs[r].bn[l], fi) = v;
          }
        } else if (how != 0) {
          c.fail("an unknown field code " + std::to_string(how));
        }
      }
    }
    // local_* absent: the statistics used are the rank's own (no SyncBN), as metrics.jsonl had it
    for (StepRecord& r : recs)
      for (BnLayerRecord& bl : r.bn) {
        if (bl.local_mean.empty()) bl.local_mean = bl.batch_mean;
        if (bl.local_var.empty()) bl.local_var = bl.batch_var;
      }
    // a rank without any statistics this step (idle DataParallel device) has none
    for (StepRecord& r : recs) {
      bool any = false;
      for (const BnLayerRecord& bl : r.bn) any |= !bl.batch_mean.empty();
      if (!any) r.bn.clear();
    }
    f.steps.push_back(std::move(recs));
  }
  return f;
}

BnStatsFile read_bn_stats(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw IoError("cannot read " + path + ": " + std::strerror(errno));
  std::stringstream s;
  s << in.rdbuf();
  return parse_bn_stats(s.str(), path);
}

}  // namespace lab
