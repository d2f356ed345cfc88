// Fashion-MNIST reader: every error case on small synthetic .gz IDX files written to a temporary
// directory, and the real dataset (when installed) against tests/fixtures/dataset.json, which
// tools/fixtures/gen_dataset.py writes with PyTorch.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <zlib.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "dataset.h"
#include "errors.h"

namespace {

namespace fs = std::filesystem;
using Bytes = std::vector<uint8_t>;

constexpr int kPixels = 28 * 28;

// A fresh directory under the system temp dir, removed with everything in it at scope exit.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "dtlab_test_dataset_XXXXXX").string();
    if (!mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed for " + tmpl);
    m_path = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(m_path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return m_path; }
  std::string file(const std::string& name) const { return (fs::path(m_path) / name).string(); }

 private:
  std::string m_path;
};

void put_be32(Bytes& b, uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8) b.push_back(static_cast<uint8_t>(v >> shift));
}

// IDX images: magic 0x803, count, rows, cols, then pixels; pixel (i, k) = (7 * i + k) mod 256 so
// every image differs. `payload_images` may differ from `count` to build short/long payloads.
Bytes idx_images(uint32_t count, uint32_t rows = 28, uint32_t cols = 28, int64_t payload_images = -1,
                 uint32_t magic = 0x00000803) {
  Bytes b;
  put_be32(b, magic);
  put_be32(b, count);
  put_be32(b, rows);
  put_be32(b, cols);
  const int64_t n = payload_images < 0 ? count : payload_images;
  for (int64_t i = 0; i < n; ++i) {
    for (uint32_t k = 0; k < rows * cols; ++k) b.push_back(static_cast<uint8_t>((7 * i + k) % 256));
  }
  return b;
}

Bytes idx_labels(const std::vector<uint8_t>& labels, uint32_t magic = 0x00000801) {
  Bytes b;
  put_be32(b, magic);
  put_be32(b, static_cast<uint32_t>(labels.size()));
  b.insert(b.end(), labels.begin(), labels.end());
  return b;
}

// One gzip member (deflate with a gzip wrapper), in memory.
Bytes gzip_bytes(const Bytes& plain) {
  z_stream zs{};
  if (deflateInit2(&zs, Z_DEFAULT_COMPRESSION, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) != Z_OK) {
    throw std::runtime_error("deflateInit2 failed");
  }
  Bytes out(deflateBound(&zs, static_cast<uLong>(plain.size())) + 32);
  zs.next_in = const_cast<Bytef*>(plain.data());
  zs.avail_in = static_cast<uInt>(plain.size());
  zs.next_out = out.data();
  zs.avail_out = static_cast<uInt>(out.size());
  const int ret = deflate(&zs, Z_FINISH);
  deflateEnd(&zs);
  if (ret != Z_STREAM_END) throw std::runtime_error("deflate did not finish");
  out.resize(zs.total_out);
  return out;
}

void write_file(const std::string& path, const Bytes& bytes) {
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

const char* const kTrainImages = "train-images-idx3-ubyte.gz";
const char* const kTrainLabels = "train-labels-idx1-ubyte.gz";
const char* const kTestImages = "t10k-images-idx3-ubyte.gz";
const char* const kTestLabels = "t10k-labels-idx1-ubyte.gz";

// A valid directory: 5 train samples with labels 0..4, 3 test samples with labels 9, 8, 7.
void write_valid_dataset(const TempDir& dir) {
  write_file(dir.file(kTrainImages), gzip_bytes(idx_images(5)));
  write_file(dir.file(kTrainLabels), gzip_bytes(idx_labels({0, 1, 2, 3, 4})));
  write_file(dir.file(kTestImages), gzip_bytes(idx_images(3)));
  write_file(dir.file(kTestLabels), gzip_bytes(idx_labels({9, 8, 7})));
}

// Runs fn, expects a DataError, and checks its message holds every one of `parts`.
template <typename Fn>
lab::DataError expect_data_error(Fn fn, const std::vector<std::string>& parts) {
  try {
    fn();
  } catch (const lab::DataError& e) {
    const std::string what = e.what();
    for (const std::string& p : parts) {
      EXPECT_NE(what.find(p), std::string::npos) << "message lacks \"" << p << "\":\n  " << what;
    }
    EXPECT_EQ(e.exit_code(), lab::kExitData);
    return e;
  }
  ADD_FAILURE() << "expected lab::DataError";
  return lab::DataError("none");
}

uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

nlohmann::json load_fixture(const std::string& name) {
  std::ifstream f(std::string(DTLAB_FIXTURES_DIR) + "/" + name);
  if (!f) throw std::runtime_error("missing fixture " + name + " (tools/fixtures/gen_dataset.py)");
  return nlohmann::json::parse(f);
}

}  // namespace

// ---- synthetic files: the happy path and limit ----

TEST(Dataset, LoadsSyntheticFiles) {
  TempDir dir;
  write_valid_dataset(dir);
  const lab::Dataset train = lab::load_fashion_mnist(dir.path(), true);
  EXPECT_EQ(train.name, "train");
  EXPECT_EQ(train.images_path, dir.file(kTrainImages));
  EXPECT_EQ(train.labels_path, dir.file(kTrainLabels));
  ASSERT_EQ(train.size, 5);
  ASSERT_EQ(train.raw.size(), 5u * kPixels);
  ASSERT_EQ(train.images.size(), 5u * kPixels);
  EXPECT_EQ(train.labels, (std::vector<int>{0, 1, 2, 3, 4}));
  for (size_t i = 0; i < train.raw.size(); ++i) {
    const size_t sample = i / kPixels, k = i % kPixels;
    ASSERT_EQ(train.raw[i], (7 * sample + k) % 256) << "pixel " << i;
    ASSERT_EQ(float_bits(train.images[i]), float_bits(lab::normalize_pixel(train.raw[i]))) << "pixel " << i;
  }
  const lab::Dataset test = lab::load_fashion_mnist(dir.path(), false);
  EXPECT_EQ(test.name, "test");
  EXPECT_EQ(test.size, 3);
  EXPECT_EQ(test.labels, (std::vector<int>{9, 8, 7}));
  EXPECT_NO_THROW(lab::check_fashion_mnist(dir.path()));
}

TEST(Dataset, LimitKeepsTheFirstSamples) {
  TempDir dir;
  write_valid_dataset(dir);
  const lab::Dataset full = lab::load_fashion_mnist(dir.path(), true);
  const lab::Dataset two = lab::load_fashion_mnist(dir.path(), true, 2);
  EXPECT_EQ(two.size, 2);
  EXPECT_EQ(two.labels, (std::vector<int>{0, 1}));
  ASSERT_EQ(two.raw.size(), 2u * kPixels);
  ASSERT_EQ(two.images.size(), 2u * kPixels);
  EXPECT_TRUE(std::equal(two.raw.begin(), two.raw.end(), full.raw.begin()));
  EXPECT_EQ(lab::load_fashion_mnist(dir.path(), true, 5).size, 5);
  EXPECT_EQ(lab::load_fashion_mnist(dir.path(), true, 1000).size, 5);  // larger than L: all
  EXPECT_EQ(lab::load_fashion_mnist(dir.path(), true, 0).size, 5);     // 0: all
  EXPECT_THROW(lab::load_fashion_mnist(dir.path(), true, -1), lab::ConfigError);
}

TEST(Dataset, LimitStillValidatesTheWholeFile) {
  TempDir dir;
  write_valid_dataset(dir);
  write_file(dir.file(kTrainLabels), gzip_bytes(idx_labels({0, 1, 2, 3, 11})));
  expect_data_error([&] { lab::load_fashion_mnist(dir.path(), true, 1); }, {"label 11 at index 4"});
}

// ---- missing directory / file ----

TEST(Dataset, MissingDirectoryHintsAtDataDir) {
  TempDir dir;
  const std::string missing = dir.file("no-such-dir");
  const lab::DataError e =
      expect_data_error([&] { lab::load_fashion_mnist(missing, true); }, {missing, "not found"});
  EXPECT_NE(e.hint().find("--data-dir"), std::string::npos) << e.hint();
  expect_data_error([&] { lab::check_fashion_mnist(missing); }, {missing, "not found"});
}

TEST(Dataset, DefaultDirectoryHintIsTheDebianPackage) {
  // The default directory is installed on dev machines, so check the hint it would get directly.
  EXPECT_EQ(lab::missing_data_hint(lab::kDefaultDataDir),
            "install it with: sudo apt-get install dataset-fashion-mnist");
  EXPECT_EQ(lab::missing_data_hint(std::string(lab::kDefaultDataDir) + "/"),
            "install it with: sudo apt-get install dataset-fashion-mnist");
  EXPECT_NE(lab::missing_data_hint("/tmp/elsewhere").find("--data-dir"), std::string::npos);
  if (!fs::exists(lab::kDefaultDataDir)) {
    const lab::DataError e = expect_data_error([] { lab::load_fashion_mnist(lab::kDefaultDataDir, true); },
                                               {lab::kDefaultDataDir, "not found"});
    EXPECT_NE(e.hint().find("apt-get install dataset-fashion-mnist"), std::string::npos);
  }
}

TEST(Dataset, MissingFileIsNamed) {
  TempDir dir;
  write_valid_dataset(dir);
  fs::remove(dir.file(kTestLabels));
  EXPECT_NO_THROW(lab::load_fashion_mnist(dir.path(), true));
  expect_data_error([&] { lab::load_fashion_mnist(dir.path(), false); },
                    {dir.file(kTestLabels), "not found"});
  expect_data_error([&] { lab::check_fashion_mnist(dir.path()); }, {dir.file(kTestLabels), "not found"});
}

// ---- gzip layer ----

TEST(Dataset, CorruptGzipIsReported) {
  TempDir dir;
  write_valid_dataset(dir);
  const std::string path = dir.file(kTrainImages);
  const Bytes good = gzip_bytes(idx_images(5));
  auto load = [&] { lab::load_fashion_mnist(dir.path(), true); };

  write_file(path, {});
  expect_data_error(load, {path, "corrupt gzip", "empty"});

  write_file(path, idx_images(5));  // uncompressed IDX under a .gz name
  expect_data_error(load, {path, "corrupt gzip", "not in gzip format"});

  Bytes flipped = good;  // damage the deflate data after the 10-byte gzip header
  for (size_t i = 10; i < 40 && i < flipped.size(); ++i) flipped[i] ^= 0xA5;
  write_file(path, flipped);
  expect_data_error(load, {path, "corrupt gzip"});

  Bytes bad_crc = good;  // the trailer is CRC32 then ISIZE
  bad_crc[bad_crc.size() - 8] ^= 0xFF;
  write_file(path, bad_crc);
  expect_data_error(load, {path, "corrupt gzip", "incorrect data check"});

  write_file(path, Bytes(good.begin(), good.begin() + static_cast<std::ptrdiff_t>(good.size() / 2)));
  expect_data_error(load, {path, "corrupt gzip", "truncated"});

  Bytes trailing = good;
  trailing.insert(trailing.end(), {'j', 'u', 'n', 'k'});
  write_file(path, trailing);
  expect_data_error(load, {path, "corrupt gzip", "4 bytes of trailing garbage"});
}

TEST(Dataset, ConcatenatedGzipMembersAreOneFile) {
  // gzip -d accepts several members back to back; so do we.
  TempDir dir;
  write_valid_dataset(dir);
  const Bytes plain = idx_labels({0, 1, 2, 3, 4});
  Bytes two = gzip_bytes(Bytes(plain.begin(), plain.begin() + 6));
  const Bytes rest = gzip_bytes(Bytes(plain.begin() + 6, plain.end()));
  two.insert(two.end(), rest.begin(), rest.end());
  write_file(dir.file(kTrainLabels), two);
  EXPECT_EQ(lab::load_fashion_mnist(dir.path(), true).labels, (std::vector<int>{0, 1, 2, 3, 4}));
}

// ---- IDX layer ----

TEST(Dataset, BadMagicNamesExpectedAndFound) {
  TempDir dir;
  write_valid_dataset(dir);
  write_file(dir.file(kTrainImages), gzip_bytes(idx_images(5, 28, 28, -1, 0x00000801)));
  expect_data_error([&] { lab::load_fashion_mnist(dir.path(), true); },
                    {dir.file(kTrainImages), "bad magic", "0x00000801", "expected 0x00000803"});

  write_valid_dataset(dir);
  write_file(dir.file(kTestLabels), gzip_bytes(idx_labels({9, 8, 7}, 0x12345678)));
  expect_data_error([&] { lab::load_fashion_mnist(dir.path(), false); },
                    {dir.file(kTestLabels), "bad magic", "0x12345678", "expected 0x00000801"});
}

TEST(Dataset, WrongImageDimensions) {
  TempDir dir;
  write_valid_dataset(dir);
  write_file(dir.file(kTrainImages), gzip_bytes(idx_images(5, 28, 27)));
  expect_data_error([&] { lab::load_fashion_mnist(dir.path(), true); },
                    {dir.file(kTrainImages), "28x27", "expected 28x28"});
}

TEST(Dataset, TruncatedHeader) {
  TempDir dir;
  write_valid_dataset(dir);
  Bytes header = idx_images(5);
  header.resize(10);
  write_file(dir.file(kTrainImages), gzip_bytes(header));
  expect_data_error([&] { lab::load_fashion_mnist(dir.path(), true); },
                    {dir.file(kTrainImages), "truncated IDX header", "expected 16 bytes, got 10"});
  write_file(dir.file(kTrainImages), gzip_bytes({0x00, 0x00}));
  expect_data_error([&] { lab::load_fashion_mnist(dir.path(), true); },
                    {dir.file(kTrainImages), "too short for an IDX header"});
}

TEST(Dataset, ShortPayloadSaysExpectedAndActualBytes) {
  TempDir dir;
  write_valid_dataset(dir);
  write_file(dir.file(kTrainImages), gzip_bytes(idx_images(5, 28, 28, 4)));  // header says 5
  expect_data_error([&] { lab::load_fashion_mnist(dir.path(), true); },
                    {dir.file(kTrainImages), "truncated payload", "3920 bytes", "3136 bytes"});

  write_valid_dataset(dir);
  Bytes labels = idx_labels({9, 8, 7});
  labels.pop_back();
  write_file(dir.file(kTestLabels), gzip_bytes(labels));
  expect_data_error([&] { lab::load_fashion_mnist(dir.path(), false); },
                    {dir.file(kTestLabels), "truncated payload", "3 bytes", "2 bytes"});
}

TEST(Dataset, TrailingGarbageInPayload) {
  TempDir dir;
  write_valid_dataset(dir);
  Bytes images = idx_images(5);
  images.push_back(0);
  write_file(dir.file(kTrainImages), gzip_bytes(images));
  expect_data_error([&] { lab::load_fashion_mnist(dir.path(), true); },
                    {dir.file(kTrainImages), "trailing garbage", "3920 bytes", "3921 bytes"});

  write_valid_dataset(dir);
  Bytes labels = idx_labels({0, 1, 2, 3, 4});
  labels.push_back(1);
  write_file(dir.file(kTrainLabels), gzip_bytes(labels));
  expect_data_error([&] { lab::load_fashion_mnist(dir.path(), true); },
                    {dir.file(kTrainLabels), "trailing garbage"});
}

TEST(Dataset, LabelCountMismatchNamesBothFiles) {
  TempDir dir;
  write_valid_dataset(dir);
  write_file(dir.file(kTrainLabels), gzip_bytes(idx_labels({0, 1, 2, 3})));
  expect_data_error([&] { lab::load_fashion_mnist(dir.path(), true); },
                    {dir.file(kTrainImages), dir.file(kTrainLabels), "has 5 images", "has 4 labels"});
}

TEST(Dataset, LabelOutOfRange) {
  TempDir dir;
  write_valid_dataset(dir);
  write_file(dir.file(kTestLabels), gzip_bytes(idx_labels({9, 10, 7})));
  expect_data_error([&] { lab::load_fashion_mnist(dir.path(), false); },
                    {dir.file(kTestLabels), "label 10 at index 1", "0..9"});
  // check_fashion_mnist looks at the test split too.
  expect_data_error([&] { lab::check_fashion_mnist(dir.path()); }, {dir.file(kTestLabels), "label 10"});
}

// ---- normalization and the real dataset against PyTorch ----

TEST(Dataset, NormalizationMatchesTorchBitForBit) {
  // torch: uint8 0..255 -> .float().div(255).sub_(0.2860).div_(0.3530), all 256 values.
  const nlohmann::json fx = load_fixture("dataset.json");
  const auto& bits = fx.at("normalize_bits");
  ASSERT_EQ(bits.size(), 256u);
  for (int p = 0; p < 256; ++p) {
    EXPECT_EQ(float_bits(lab::normalize_pixel(static_cast<uint8_t>(p))), bits[p].get<uint32_t>())
        << "pixel value " << p;
  }
}

class FashionMnistReal : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(lab::kDefaultDataDir)) {
      GTEST_SKIP() << lab::kDefaultDataDir << " missing (apt-get install dataset-fashion-mnist)";
    }
  }
  // Each split is loaded once per process and only by the tests that need it (ctest runs every
  // test in its own process; inflating the 60k training images takes a few tenths of a second).
  static const lab::Dataset& split(bool train) {
    static std::unique_ptr<lab::Dataset> loaded[2];
    std::unique_ptr<lab::Dataset>& d = loaded[train ? 1 : 0];
    if (!d) d = std::make_unique<lab::Dataset>(lab::load_fashion_mnist(lab::kDefaultDataDir, train));
    return *d;
  }

  static void check_split(const lab::Dataset& d, const nlohmann::json& fx) {
    const int64_t n = fx.at("size").get<int64_t>();
    ASSERT_EQ(d.size, n);
    ASSERT_EQ(static_cast<int64_t>(d.raw.size()), n * kPixels);
    ASSERT_EQ(static_cast<int64_t>(d.images.size()), n * kPixels);
    ASSERT_EQ(static_cast<int64_t>(d.labels.size()), n);
    EXPECT_EQ(fs::path(d.images_path).filename(), fx.at("images_file").get<std::string>());
    EXPECT_EQ(fs::path(d.labels_path).filename(), fx.at("labels_file").get<std::string>());

    const auto first = fx.at("first_labels").get<std::vector<int>>();
    EXPECT_EQ(
        std::vector<int>(d.labels.begin(), d.labels.begin() + static_cast<std::ptrdiff_t>(first.size())),
        first);
    std::vector<int64_t> counts(10, 0);
    for (int label : d.labels) ++counts[static_cast<size_t>(label)];
    EXPECT_EQ(counts, fx.at("label_counts").get<std::vector<int64_t>>());
    int64_t raw_sum = 0;
    for (uint8_t p : d.raw) raw_sum += p;
    EXPECT_EQ(raw_sum, fx.at("raw_pixel_sum").get<int64_t>());

    for (const auto& px : fx.at("pixels")) {
      const int64_t at = px.at("sample").get<int64_t>() * kPixels + px.at("row").get<int64_t>() * 28 +
                         px.at("col").get<int64_t>();
      EXPECT_EQ(d.raw[static_cast<size_t>(at)], px.at("raw").get<int>()) << px.dump();
      EXPECT_EQ(float_bits(d.images[static_cast<size_t>(at)]), px.at("bits").get<uint32_t>()) << px.dump();
    }
    // Exact in any order (see gen_dataset.py), so torch's double sum is matched exactly.
    double sum0 = 0;
    for (int k = 0; k < kPixels; ++k) sum0 += d.images[static_cast<size_t>(k)];
    EXPECT_EQ(sum0, fx.at("sample0_sum").get<double>());
  }
};

TEST_F(FashionMnistReal, TrainMatchesTorch) {
  check_split(split(true), load_fixture("dataset.json").at("train"));
}

TEST_F(FashionMnistReal, TestMatchesTorch) {
  check_split(split(false), load_fixture("dataset.json").at("test"));
}

TEST_F(FashionMnistReal, LimitIsAPrefix) {
  const lab::Dataset head = lab::load_fashion_mnist(lab::kDefaultDataDir, false, 100);
  ASSERT_EQ(head.size, 100);
  EXPECT_TRUE(std::equal(head.images.begin(), head.images.end(), split(false).images.begin()));
  EXPECT_TRUE(std::equal(head.labels.begin(), head.labels.end(), split(false).labels.begin()));
}

TEST_F(FashionMnistReal, CheckAcceptsTheInstalledFiles) {
  EXPECT_NO_THROW(lab::check_fashion_mnist(lab::kDefaultDataDir));
}
