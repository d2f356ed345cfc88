// Fashion-MNIST reader: gzip (zlib inflate) -> IDX parsing -> ToTensor + Normalize.
//
// IDX layout (all integers big-endian):
//   images: magic 0x00000803 (unsigned bytes, 3 dims), count, rows, cols, then count*rows*cols
//           pixels, row-major;
//   labels: magic 0x00000801 (unsigned bytes, 1 dim), count, then count label bytes.
// Every file is validated completely (gzip stream, header, payload length, label range) even
// when `limit` keeps only a prefix: a damaged file fails the same way whatever the limit.
#include "dataset.h"

#include <zlib.h>

#include <algorithm>
#include <array>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include "errors.h"

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace lab {
namespace {

namespace fs = std::filesystem;

constexpr uint32_t kImagesMagic = 0x00000803;
constexpr uint32_t kLabelsMagic = 0x00000801;
constexpr uint32_t kRows = 28;
constexpr uint32_t kCols = 28;
constexpr int64_t kPixels = kRows * kCols;
constexpr int kNumClasses = 10;
constexpr size_t kImagesHeaderBytes = 16;  // magic, count, rows, cols
constexpr size_t kLabelsHeaderBytes = 8;   // magic, count

constexpr const char* kInstallHint = "install it with: sudo apt-get install dataset-fashion-mnist";

std::string hex32(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", v);
  return buf;
}

uint32_t read_be32(const std::vector<uint8_t>& b, size_t at) {
  return (uint32_t{b[at]} << 24) | (uint32_t{b[at + 1]} << 16) | (uint32_t{b[at + 2]} << 8) |
         uint32_t{b[at + 3]};
}

bool is_default_dir(const std::string& dir) {
  std::string d = dir;
  while (d.size() > 1 && d.back() == '/') d.pop_back();
  return d == kDefaultDataDir;
}

void check_dir(const std::string& dir) {
  std::error_code ec;
  if (fs::is_directory(dir, ec)) return;
  if (fs::exists(dir, ec)) {
    throw DataError("Fashion-MNIST directory " + dir + " is not a directory", missing_data_hint(dir));
  }
  throw DataError("Fashion-MNIST directory not found: " + dir, missing_data_hint(dir));
}

// Hint: back a large buffer with transparent huge pages before first touching it. Faulting in
// the 188 MB of float images 4 KiB at a time took about a third of the load time. With THP in
// "madvise" mode (common on Linux distributions) loading the training split went from 0.37 s to
// 0.25 s (best of 5, same binary with THP disabled by prctl). Ignored where unsupported.
void advise_huge_pages(const void* p, size_t bytes) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  constexpr uintptr_t kHuge = uintptr_t{2} << 20;
  const uintptr_t begin = (reinterpret_cast<uintptr_t>(p) + kHuge - 1) & ~(kHuge - 1);
  const uintptr_t end = (reinterpret_cast<uintptr_t>(p) + bytes) & ~(kHuge - 1);
  if (end > begin) madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);
#else
  (void)p;
  (void)bytes;
#endif
}

// v.resize(n) for a fresh vector, asking for huge pages before the zero-fill faults pages in.
template <typename T>
void resize_fresh(std::vector<T>& v, size_t n) {
  v.reserve(n);
  advise_huge_pages(v.data(), n * sizeof(T));
  v.resize(n);
}

constexpr size_t kInputChunk = size_t{1} << 20;    // compressed bytes read at a time
constexpr size_t kScratchBytes = size_t{1} << 20;  // inflate output when only a prefix is kept
constexpr size_t kKeepAll = SIZE_MAX;

// The inflated contents of a .gz file: every byte, or (keep = N) only the first N; `total`
// counts every inflated byte either way, so a header check needs no 47 MB buffer.
struct Inflated {
  std::vector<uint8_t> bytes;
  uint64_t total = 0;
};

// Streams a .gz file through inflate, 1 MiB of compressed input at a time. Concatenated gzip
// members are accepted (as gzip -d does); anything else after the last member, a truncated
// stream or a CRC/length mismatch is an error naming the file.
Inflated gunzip(const std::string& path, const std::string& dir, size_t keep) {
  std::error_code ec;
  if (!fs::exists(path, ec)) throw DataError("Fashion-MNIST file not found: " + path, missing_data_hint(dir));
  if (!fs::is_regular_file(path, ec)) throw DataError(path + ": not a regular file");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw DataError(path + ": cannot open file for reading (check its permissions)");
  in.seekg(0, std::ios::end);
  const uint64_t file_size = static_cast<uint64_t>(in.tellg());
  if (file_size == 0) throw DataError(path + ": corrupt gzip file: the file is empty");

  // ISIZE, the last 4 bytes (little-endian), is the uncompressed size mod 2^32: a first guess for
  // the output buffer, capped in case those bytes are damaged (deflate expands at most ~1032x).
  size_t guess = size_t{1} << 16;
  if (file_size >= 18) {
    uint8_t t[4] = {};
    in.seekg(static_cast<std::streamoff>(file_size - 4));
    in.read(reinterpret_cast<char*>(t), 4);
    const size_t isize = size_t{t[0]} | (size_t{t[1]} << 8) | (size_t{t[2]} << 16) | (size_t{t[3]} << 24);
    guess = std::max<size_t>(guess, std::min<uint64_t>(isize, file_size * 1100));
  }
  in.seekg(0);

  z_stream zs{};
  std::vector<uint8_t> input(static_cast<size_t>(std::min<uint64_t>(kInputChunk, file_size)));
  uint64_t consumed_from_file = 0;
  // Moves the unread input to the front of the buffer and tops it up from the file.
  auto refill = [&] {
    if (zs.avail_in > 0) std::memmove(input.data(), zs.next_in, zs.avail_in);
    in.read(reinterpret_cast<char*>(input.data()) + zs.avail_in,
            static_cast<std::streamsize>(input.size() - zs.avail_in));
    const uint64_t got = static_cast<uint64_t>(in.gcount());
    if (got == 0) {
      throw DataError(path + ": read error after " + std::to_string(consumed_from_file) + " of " +
                      std::to_string(file_size) + " bytes");
    }
    consumed_from_file += got;
    zs.next_in = input.data();
    zs.avail_in += static_cast<uInt>(got);
  };
  refill();
  if (zs.avail_in < 2 || zs.next_in[0] != 0x1f || zs.next_in[1] != 0x8b) {
    throw DataError(path + ": corrupt gzip file: not in gzip format (no 1f 8b signature)");
  }

  Inflated r;
  std::vector<uint8_t> scratch;
  const bool keep_all = keep == kKeepAll;
  if (keep_all) {
    resize_fresh(r.bytes, guess);
  } else {
    scratch.resize(kScratchBytes);
  }
  if (inflateInit2(&zs, 15 + 16) != Z_OK) throw DataError(path + ": zlib inflateInit2 failed");
  std::string problem;
  for (;;) {
    if (zs.avail_in == 0 && consumed_from_file < file_size) refill();
    uint8_t* out = scratch.data();
    size_t room = scratch.size();
    if (keep_all) {
      if (r.total == r.bytes.size()) r.bytes.resize(r.bytes.size() * 2);
      out = r.bytes.data() + r.total;
      room = std::min<size_t>(r.bytes.size() - r.total, UINT_MAX);
    }
    zs.next_out = out;
    zs.avail_out = static_cast<uInt>(room);
    const int ret = inflate(&zs, Z_NO_FLUSH);
    const size_t n = room - zs.avail_out;
    if (!keep_all && r.bytes.size() < keep) {
      r.bytes.insert(r.bytes.end(), out, out + std::min(n, keep - r.bytes.size()));
    }
    r.total += n;
    if (ret == Z_OK) continue;
    if (ret == Z_STREAM_END) {
      const uint64_t left = zs.avail_in + (file_size - consumed_from_file);
      if (left == 0) break;
      if (zs.avail_in < 2 && consumed_from_file < file_size) refill();
      if (zs.avail_in >= 2 && zs.next_in[0] == 0x1f && zs.next_in[1] == 0x8b) {
        inflateReset(&zs);  // another gzip member follows
        continue;
      }
      problem = std::to_string(left) + " bytes of trailing garbage after the gzip stream";
    } else if (ret == Z_BUF_ERROR && zs.avail_in == 0) {
      problem = "truncated gzip stream (the compressed data ends early)";
    } else if (ret == Z_DATA_ERROR) {
      problem = std::string("corrupt gzip data (") + (zs.msg ? zs.msg : "data error") + ")";
    } else if (ret == Z_MEM_ERROR) {
      problem = "out of memory while decompressing";
    } else {
      problem = "zlib error " + std::to_string(ret) + (zs.msg ? std::string(": ") + zs.msg : "");
    }
    break;
  }
  inflateEnd(&zs);
  if (!problem.empty()) throw DataError(path + ": corrupt gzip file: " + problem);
  if (keep_all) r.bytes.resize(static_cast<size_t>(r.total));
  return r;
}

// The decompressed, validated contents of one split, before normalization.
struct RawSplit {
  std::string images_path;
  std::string labels_path;
  int64_t count = 0;
  std::vector<uint8_t> pixels;  // (count, 28, 28); empty when read without pixels
  std::vector<int> labels;      // (count,)
};

// Returns the image count; pixels start at kImagesHeaderBytes. head: at least the first 16 bytes
// of the inflated file (all of them when shorter); total: the inflated length.
int64_t parse_images_header(const std::string& path, const std::vector<uint8_t>& head, uint64_t total) {
  const std::vector<uint8_t>& idx = head;
  if (total < 4) {
    throw DataError(path + ": too short for an IDX header: " + std::to_string(total) +
                    " bytes after decompression");
  }
  const uint32_t magic = read_be32(idx, 0);
  if (magic != kImagesMagic) {
    throw DataError(path + ": bad magic number " + hex32(magic) + ", expected " + hex32(kImagesMagic) +
                    " (IDX images: unsigned bytes, 3 dimensions)" +
                    (magic == kLabelsMagic ? "; this looks like a labels file" : ""));
  }
  if (total < kImagesHeaderBytes) {
    throw DataError(path + ": truncated IDX header: expected " + std::to_string(kImagesHeaderBytes) +
                    " bytes, got " + std::to_string(total));
  }
  const uint32_t count = read_be32(idx, 4);
  const uint32_t rows = read_be32(idx, 8);
  const uint32_t cols = read_be32(idx, 12);
  if (rows != kRows || cols != kCols) {
    throw DataError(path + ": wrong image dimensions " + std::to_string(rows) + "x" + std::to_string(cols) +
                    ", expected 28x28");
  }
  const uint64_t expected = uint64_t{count} * kPixels;
  const uint64_t actual = total - kImagesHeaderBytes;
  if (actual != expected) {
    throw DataError(path + ": " + (actual < expected ? "truncated payload" : "trailing garbage") +
                    ": the header says " + std::to_string(count) +
                    " images of 28x28 = " + std::to_string(expected) + " bytes, but " +
                    std::to_string(actual) + " bytes follow the header");
  }
  return count;
}

std::vector<int> parse_labels(const std::string& path, const std::vector<uint8_t>& idx) {
  if (idx.size() < 4) {
    throw DataError(path + ": too short for an IDX header: " + std::to_string(idx.size()) +
                    " bytes after decompression");
  }
  const uint32_t magic = read_be32(idx, 0);
  if (magic != kLabelsMagic) {
    throw DataError(path + ": bad magic number " + hex32(magic) + ", expected " + hex32(kLabelsMagic) +
                    " (IDX labels: unsigned bytes, 1 dimension)" +
                    (magic == kImagesMagic ? "; this looks like an images file" : ""));
  }
  if (idx.size() < kLabelsHeaderBytes) {
    throw DataError(path + ": truncated IDX header: expected " + std::to_string(kLabelsHeaderBytes) +
                    " bytes, got " + std::to_string(idx.size()));
  }
  const uint32_t count = read_be32(idx, 4);
  const uint64_t actual = idx.size() - kLabelsHeaderBytes;
  if (actual != count) {
    throw DataError(path + ": " + (actual < count ? "truncated payload" : "trailing garbage") +
                    ": the header says " + std::to_string(count) + " labels = " + std::to_string(count) +
                    " bytes, but " + std::to_string(actual) + " bytes follow the header");
  }
  std::vector<int> labels(count);  // (count,)
  for (uint32_t i = 0; i < count; ++i) {
    const int label = idx[kLabelsHeaderBytes + i];
    if (label >= kNumClasses) {
      throw DataError(path + ": label " + std::to_string(label) + " at index " + std::to_string(i) +
                      " is out of range (Fashion-MNIST has 10 classes, 0..9)");
    }
    labels[i] = label;
  }
  return labels;
}

// with_pixels = false validates the images file from its header and inflated length alone.
RawSplit read_split(const std::string& dir, bool train, bool with_pixels) {
  check_dir(dir);
  const std::string prefix = (fs::path(dir) / (train ? "train" : "t10k")).string();
  RawSplit s;
  s.images_path = prefix + "-images-idx3-ubyte.gz";
  s.labels_path = prefix + "-labels-idx1-ubyte.gz";

  Inflated images = gunzip(s.images_path, dir, with_pixels ? kKeepAll : kImagesHeaderBytes);
  s.count = parse_images_header(s.images_path, images.bytes, images.total);
  s.labels = parse_labels(s.labels_path, gunzip(s.labels_path, dir, kKeepAll).bytes);
  if (static_cast<int64_t>(s.labels.size()) != s.count) {
    throw DataError("label count differs from image count: " + s.images_path + " has " +
                    std::to_string(s.count) + " images but " + s.labels_path + " has " +
                    std::to_string(s.labels.size()) + " labels");
  }
  if (with_pixels) {
    // Drop the header in place rather than copying 47 MB.
    images.bytes.erase(images.bytes.begin(), images.bytes.begin() + kImagesHeaderBytes);
    s.pixels = std::move(images.bytes);
  }
  return s;
}

}  // namespace

std::string missing_data_hint(const std::string& dir) {
  if (is_default_dir(dir)) return kInstallHint;
  return "pass --data-dir with the directory holding train-images-idx3-ubyte.gz, "
         "train-labels-idx1-ubyte.gz, t10k-images-idx3-ubyte.gz and t10k-labels-idx1-ubyte.gz "
         "(Debian installs them in " +
         std::string(kDefaultDataDir) + ")";
}

// PyTorch computes img.float().div(255).sub_(mean).div_(std) as three float32 operations, each
// rounded (no reciprocal multiply, no fused multiply-add); tests/fixtures/dataset.json holds
// torch's results for all 256 pixel values, bit for bit.
float normalize_pixel(uint8_t pixel) {
  const float x = static_cast<float>(pixel) / 255.0f;
  const float centered = x - kFashionMean;
  return centered / kFashionStd;
}

Dataset load_fashion_mnist(const std::string& dir, bool train, int64_t limit) {
  if (limit < 0) {
    throw ConfigError("invalid sample limit " + std::to_string(limit) +
                      ": it must be >= 0 (0 keeps the whole dataset)");
  }
  RawSplit s = read_split(dir, train, /*with_pixels=*/true);
  const int64_t n = (limit > 0 && limit < s.count) ? limit : s.count;

  Dataset d;
  d.name = train ? "train" : "test";
  d.images_path = s.images_path;
  d.labels_path = s.labels_path;
  d.size = n;
  s.pixels.resize(static_cast<size_t>(n * kPixels));
  s.labels.resize(static_cast<size_t>(n));
  if (n < s.count) {
    s.pixels.shrink_to_fit();
    s.labels.shrink_to_fit();
  }
  d.raw = std::move(s.pixels);     // (n, 28, 28)
  d.labels = std::move(s.labels);  // (n,)
  std::array<float, 256> table;    // pixel value -> normalized
  for (int p = 0; p < 256; ++p) table[static_cast<size_t>(p)] = normalize_pixel(static_cast<uint8_t>(p));
  resize_fresh(d.images, d.raw.size());  // (n, 1, 28, 28)
  for (size_t i = 0; i < d.raw.size(); ++i) d.images[i] = table[d.raw[i]];
  return d;
}

void check_fashion_mnist(const std::string& dir) {
  read_split(dir, true, /*with_pixels=*/false);
  read_split(dir, false, /*with_pixels=*/false);
}

void gather_batch(const Dataset& data, const std::vector<int64_t>& idx, Tensor& x, std::vector<int>& labels) {
  const int64_t n = static_cast<int64_t>(idx.size());
  x.resize({n, 1, 28, 28});
  labels.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const int64_t s = idx[static_cast<size_t>(i)];
    std::memcpy(x.ptr() + i * 784, data.images.data() + s * 784, 784 * sizeof(float));
    labels[static_cast<size_t>(i)] = data.labels[static_cast<size_t>(s)];
  }
}

}  // namespace lab
