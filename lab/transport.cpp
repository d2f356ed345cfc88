#include "transport.h"

namespace lab {

void Transport::sendrecv_reduce(int dst, const float* sbuf, size_t scount, int src, float* acc, size_t rcount,
                                uint64_t tag) {
  if (m_scratch.size() < rcount) m_scratch.resize(rcount);
  sendrecv(dst, sbuf, scount * sizeof(float), src, m_scratch.data(), rcount * sizeof(float), tag);
  for (size_t i = 0; i < rcount; ++i) acc[i] += m_scratch[i];
}

}  // namespace lab
