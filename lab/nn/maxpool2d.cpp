#include "maxpool2d.h"

#include <cassert>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "elementwise.h"

namespace lab {

namespace {

// PyTorch's CPU kernel scans a window from -inf and takes a value when it is strictly greater than
// the best so far (so the first of equal maxima stays) or NaN (so the last NaN wins): pool_takes()
// of elementwise.h, shared with the GPU kernels.

// Branch-free select: after a ReLU the comparisons are coin flips and a branch would mispredict.
inline void select(bool take, float v, int32_t i, float& best, int32_t& best_i) {
  const uint32_t m = 0u - static_cast<uint32_t>(take);
  uint32_t vb, bb;
  std::memcpy(&vb, &v, sizeof vb);
  std::memcpy(&bb, &best, sizeof bb);
  bb = (vb & m) | (bb & ~m);
  std::memcpy(&best, &bb, sizeof bb);
  best_i = static_cast<int32_t>((static_cast<uint32_t>(i) & m) | (static_cast<uint32_t>(best_i) & ~m));
}

// The 2x2 fast path is a tournament over the scan order a b / c d: (a, b) and (c, d), then the
// bottom winner replaces the top one only if it takes over it (elementwise.h's pool2x2_place, which
// the GPU kernel uses). That gives the same answer as the sequential scan (first maximum, last NaN)
// and splits into two loops of fixed-size blocks that GCC vectorizes at -O2 (the plain per-window
// loop stays scalar).
constexpr int kLanes = 16;

// Horizontal pairs of a contiguous run: pv[i] = winner of (x[2i], x[2i+1]), pf[i] = 1 if x[2i+1].
void pair_max(const float* __restrict x, float* __restrict pv, uint8_t* __restrict pf, int64_t pairs) {
  int64_t i = 0;
  for (; i + kLanes <= pairs; i += kLanes) {
    for (int j = 0; j < kLanes; ++j) {
      const float a = x[2 * (i + j)], b = x[2 * (i + j) + 1];
      const bool t = pool_takes(b, a);
      pv[i + j] = t ? b : a;
      pf[i + j] = t;
    }
  }
  for (; i < pairs; ++i) {
    const float a = x[2 * i], b = x[2 * i + 1];
    const bool t = pool_takes(b, a);
    pv[i] = t ? b : a;
    pf[i] = t;
  }
}

// One output row from the pair winners of its top and bottom input rows (wo each; short rows,
// so this stays scalar, branch-free through select()).
// base: index of the window row's first input within the plane; w: input row length.
void row_max(const float* __restrict tv, const uint8_t* __restrict tf, const float* __restrict bv,
             const uint8_t* __restrict bf, float* __restrict out, int32_t* __restrict arg, int32_t base, int32_t w,
             int64_t wo) {
  for (int64_t o = 0; o < wo; ++o) {
    float best = tv[o];
    int32_t best_i = base + 2 * static_cast<int32_t>(o) + tf[o];
    select(pool_takes(bv[o], best), bv[o], base + w + 2 * static_cast<int32_t>(o) + bf[o], best, best_i);
    out[o] = best;
    arg[o] = best_i;
  }
}

}  // namespace

void MaxPool2d::forward(const Tensor& x, Tensor& y, Mode /*mode*/) {
  assert(x.ndim() == 4);
  const int64_t n = x.dim(0), c = x.dim(1), h = x.dim(2), w = x.dim(3);
  const int64_t ho = h / m_k, wo = w / m_k;
  m_in_shape = x.shape;
  y.resize({n, c, ho, wo});
  m_argmax.resize(static_cast<size_t>(n * c * ho * wo));
  if (m_k == 2 && w % 2 == 0) {
    // With an even width, every row splits into whole pairs: one pass over the whole tensor.
    const int64_t pairs = x.numel() / 2;
    m_pair_value.resize(static_cast<size_t>(pairs));
    m_pair_flag.resize(static_cast<size_t>(pairs));
    pair_max(x.ptr(), m_pair_value.data(), m_pair_flag.data(), pairs);
    for (int64_t p = 0; p < n * c; ++p) {
      const float* pv = m_pair_value.data() + p * h * wo;
      const uint8_t* pf = m_pair_flag.data() + p * h * wo;
      for (int64_t oh = 0; oh < ho; ++oh) {
        const int64_t top = 2 * oh * wo, bottom = top + wo;
        row_max(pv + top, pf + top, pv + bottom, pf + bottom, y.ptr() + (p * ho + oh) * wo,
                m_argmax.data() + (p * ho + oh) * wo, static_cast<int32_t>(2 * oh * w), static_cast<int32_t>(w), wo);
      }
    }
    return;
  }
  for (int64_t p = 0; p < n * c; ++p) {
    const float* in = x.ptr() + p * h * w;
    float* out = y.ptr() + p * ho * wo;
    int32_t* arg = m_argmax.data() + p * ho * wo;
    for (int64_t oh = 0; oh < ho; ++oh) {
      for (int64_t ow = 0; ow < wo; ++ow) {
        int32_t best_i = static_cast<int32_t>(oh * m_k * w + ow * m_k);
        float best = -INFINITY;
        for (int64_t kh = 0; kh < m_k; ++kh) {
          for (int64_t kw = 0; kw < m_k; ++kw) {
            const int32_t i = static_cast<int32_t>((oh * m_k + kh) * w + ow * m_k + kw);
            select(pool_takes(in[i], best), in[i], i, best, best_i);
          }
        }
        out[oh * wo + ow] = best;
        arg[oh * wo + ow] = best_i;
      }
    }
  }
}

void MaxPool2d::backward(const Tensor& dy, Tensor* dx) {
  assert(dy.numel() == static_cast<int64_t>(m_argmax.size()));
  if (!dx) return;
  const int64_t n = m_in_shape[0], c = m_in_shape[1], h = m_in_shape[2], w = m_in_shape[3];
  const int64_t plane_out = (h / m_k) * (w / m_k);
  dx->resize(m_in_shape);
  // A zero fill and a scatter: measured faster than writing each window's zeros around its max.
  dx->zero();
  for (int64_t p = 0; p < n * c; ++p) {
    float* d = dx->ptr() + p * h * w;
    const float* g = dy.ptr() + p * plane_out;
    const int32_t* arg = m_argmax.data() + p * plane_out;
    for (int64_t i = 0; i < plane_out; ++i) d[arg[i]] += g[i];
  }
}

}  // namespace lab
