#include "state_pack.h"

#include <algorithm>
#include <cassert>
#include <cstring>

namespace lab {

StatePack::StatePack(Model& model, unsigned parts, size_t begin, size_t end) {
  assert(!((parts & kPackParams) && (parts & kPackGrads)));
  end = std::min(end, model.size());
  for (size_t i = begin; i < end; ++i) {
    Module& m = model.module(i);
    if (parts & (kPackParams | kPackGrads))
      for (Param* p : m.params()) {
        if ((parts & kPackGrads) && p->grad.numel() != p->value.numel()) p->grad = Tensor(p->value.shape);
        m_pieces.push_back({(parts & kPackGrads) ? &p->grad : &p->value, nullptr});
      }
    if (parts & kPackBuffers)
      for (Buffer* b : m.buffers()) m_pieces.push_back(b->is_int64 ? Piece{nullptr, &b->i64} : Piece{&b->value, nullptr});
  }
  for (const Piece& p : m_pieces) m_bytes += p.bytes();
}

void StatePack::pack(void* out) const {
  char* o = static_cast<char*>(out);
  for (const Piece& p : m_pieces) {
    const size_t n = p.bytes();
    std::memcpy(o, p.tensor ? static_cast<const void*>(p.tensor->ptr()) : p.count, n);
    o += n;
  }
}

std::vector<uint8_t> StatePack::pack() const {
  std::vector<uint8_t> out(m_bytes);
  pack(out.data());
  return out;
}

void StatePack::unpack(const void* in) const {
  const char* i = static_cast<const char*>(in);
  for (const Piece& p : m_pieces) {
    const size_t n = p.bytes();
    std::memcpy(p.tensor ? static_cast<void*>(p.tensor->ptr()) : p.count, i, n);
    i += n;
  }
}

}  // namespace lab
