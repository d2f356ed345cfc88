// A model's state laid end to end in one byte buffer, in state_dict() order: what travels when
// ranks exchange state (DataParallel's replicate, DDP's buffer broadcast, the parameter server's
// messages, a pipeline stage's parameters and buffers). A float tensor goes as its floats, an int64
// buffer (num_batches_tracked) as its 8 bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "model.h"

namespace lab {

enum StatePackParts : unsigned {
  kPackParams = 1,   // the parameters' values
  kPackGrads = 2,    // the parameters' gradients (not with kPackParams)
  kPackBuffers = 4,  // BatchNorm's running statistics and counters
};

class StatePack {
 public:
  // The chosen parts of modules [begin, end) (end past the model: to its last). Gradients that are
  // not allocated are allocated (zeros), so that packing and unpacking both see the parameter's size.
  StatePack(Model& model, unsigned parts, size_t begin = 0, size_t end = SIZE_MAX);
  size_t bytes() const { return m_bytes; }
  void pack(void* out) const;            // bytes() bytes
  std::vector<uint8_t> pack() const;
  void unpack(const void* in) const;     // bytes() bytes, as pack() wrote them

 private:
  struct Piece {
    Tensor* tensor = nullptr;   // or
    int64_t* count = nullptr;
    size_t bytes() const { return tensor ? tensor->data.size() * sizeof(float) : sizeof(int64_t); }
  };
  std::vector<Piece> m_pieces;
  size_t m_bytes = 0;
};

}  // namespace lab
