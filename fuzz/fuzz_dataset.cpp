// Fuzzes the Fashion-MNIST reader (lab/data/dataset.h: load_fashion_mnist, check_fashion_mnist),
// which reads four gzipped IDX files from a directory. There is no in-memory entry point, so the
// harness writes them into its scratch directory: three small valid files and the fuzzed one.
//
// Input: byte 0 = mode, byte 1 = limit, then the payload.
//   mode & 3: which file the payload replaces: 0 train-images, 1 train-labels, 2 t10k-images,
//             3 t10k-labels (the split read is the one the file belongs to);
//   mode & 4: set: the payload is the IDX content and the harness gzips it (fuzzes the IDX
//             layer); clear: the payload is written as is (fuzzes the gzip layer too);
//   mode & 8: also run check_fashion_mnist (every file, header only) on the directory.
//   limit:    load_fashion_mnist's sample limit (0: all).
// The valid files: train 2 images with labels 3, 7; test 1 image with label 9.
// Expected errors: lab::DataError (any lab::Error). Anything else is a finding.
#include <zlib.h>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "dataset.h"
#include "errors.h"
#include "fuzz_util.h"

namespace {

using Bytes = std::vector<uint8_t>;

const char* const kFiles[4] = {"train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
                               "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"};

void put_be32(Bytes& b, uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8) b.push_back(static_cast<uint8_t>(v >> shift));
}

Bytes idx_images(uint32_t count) {
  Bytes b;
  put_be32(b, 0x803);
  put_be32(b, count);
  put_be32(b, 28);
  put_be32(b, 28);
  for (uint32_t i = 0; i < count * 28 * 28; ++i) b.push_back(static_cast<uint8_t>(i * 7));
  return b;
}

Bytes idx_labels(const Bytes& labels) {
  Bytes b;
  put_be32(b, 0x801);
  put_be32(b, static_cast<uint32_t>(labels.size()));
  b.insert(b.end(), labels.begin(), labels.end());
  return b;
}

// One gzip member.
Bytes gzip(const uint8_t* data, size_t size) {
  z_stream zs{};
  if (deflateInit2(&zs, 1, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) != Z_OK) std::abort();
  Bytes out(deflateBound(&zs, static_cast<uLong>(size)) + 32);
  zs.next_in = const_cast<Bytef*>(data);
  zs.avail_in = static_cast<uInt>(size);
  zs.next_out = out.data();
  zs.avail_out = static_cast<uInt>(out.size());
  if (deflate(&zs, Z_FINISH) != Z_STREAM_END) std::abort();
  out.resize(zs.total_out);
  deflateEnd(&zs);
  return out;
}

Bytes gzip(const Bytes& b) { return gzip(b.data(), b.size()); }

const std::vector<Bytes>& valid_files() {
  static const std::vector<Bytes> files = {gzip(idx_images(2)), gzip(idx_labels({3, 7})), gzip(idx_images(1)),
                                           gzip(idx_labels({9}))};
  return files;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const int which = data[0] & 3;
  const bool gzip_payload = data[0] & 4;
  const bool check_all = data[0] & 8;
  const int64_t limit = data[1];
  const fuzz::ScratchDir& dir = fuzz::scratch();
  for (int f = 0; f < 4; ++f) {
    const std::string path = dir.file(kFiles[f]);
    if (f != which) {
      fuzz::write_file(path, valid_files()[f].data(), valid_files()[f].size());
    } else if (gzip_payload) {
      const Bytes z = gzip(data + 2, size - 2);
      fuzz::write_file(path, z.data(), z.size());
    } else {
      fuzz::write_file(path, data + 2, size - 2);
    }
  }
  try {
    const lab::Dataset d = lab::load_fashion_mnist(dir.path(), /*train=*/which < 2, limit);
    if (d.images.size() != d.raw.size() || d.labels.size() != static_cast<size_t>(d.size) ||
        d.raw.size() != static_cast<size_t>(d.size) * 784)
      std::abort();  // an accepted file must give a consistent dataset
  } catch (const lab::Error&) {
  }
  if (check_all) {
    try {
      lab::check_fashion_mnist(dir.path());
    } catch (const lab::Error&) {
    }
  }
  return 0;
}
