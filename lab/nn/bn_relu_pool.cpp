#include "bn_relu_pool.h"

#include <cassert>
#include <cstring>

#include "elementwise.h"
#include "parallel.h"

namespace lab {

namespace {

// MaxPool2d's rule (pool_takes), ReLU (relu_value, relu_passes) and BatchNorm's affine map and
// input gradient (bn_affine, bn_input_grad) are elementwise.h's, shared with the layers and the GPU.

// Branch-free selects written with bit masks: the form the vectorizer accepts when one condition
// picks several values (plain ?: there stays a branch).
inline uint32_t mask_of(bool t) { return 0u - static_cast<uint32_t>(t); }
inline float pick(uint32_t mask, float a, float b) {  // mask ? a : b
  uint32_t ua, ub;
  std::memcpy(&ua, &a, sizeof ua);
  std::memcpy(&ub, &b, sizeof ub);
  const uint32_t u = (ua & mask) | (ub & ~mask);
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

constexpr int32_t kPassed = 4;  // m_win bit: ReLU let the winner's gradient through


// One plane (H, W) of one channel: BatchNorm's affine map, ReLU and the 2x2 tournament. Written
// as two flat passes so the compiler vectorizes both: the horizontal pairs of the whole plane
// (H * W / 2 of them, consecutive in memory since W is even), then the vertical pairs of pair
// winners, row by row. pair_* are scratch of H * W / 2. win/xwin: null in Eval.
void plane_forward(const float* __restrict in, int64_t h, int64_t w, float a, float b, float* __restrict out,
                   int32_t* __restrict win, float* __restrict xwin, float* __restrict pair_r,
                   float* __restrict pair_v, float* __restrict pair_x, int32_t* __restrict pair_i) {
  const int64_t pairs = h * w / 2, wo = w / 2, ho = h / 2;
  for (int64_t j = 0; j < pairs; ++j) {
    const float x0 = in[2 * j], x1 = in[2 * j + 1];
    const float v0 = bn_affine(x0, a, b), v1 = bn_affine(x1, a, b);
    const float r0 = relu_value(v0), r1 = relu_value(v1);
    const int32_t t = pool_takes(r1, r0);
    pair_r[j] = t ? r1 : r0;
    pair_v[j] = t ? v1 : v0;
    pair_x[j] = t ? x1 : x0;
    pair_i[j] = t;
  }
  for (int64_t oh = 0; oh < ho; ++oh) {
    const float* __restrict tr = pair_r + 2 * oh * wo;
    const float* __restrict br = tr + wo;
    float* __restrict o = out + oh * wo;
    if (!win) {
      for (int64_t ow = 0; ow < wo; ++ow) o[ow] = pool_takes(br[ow], tr[ow]) ? br[ow] : tr[ow];
      continue;
    }
    const float* __restrict tv = pair_v + 2 * oh * wo;
    const float* __restrict bv = tv + wo;
    const float* __restrict tx = pair_x + 2 * oh * wo;
    const float* __restrict bx = tx + wo;
    const int32_t* __restrict ti = pair_i + 2 * oh * wo;
    const int32_t* __restrict bi = ti + wo;
    int32_t* __restrict wn = win + oh * wo;
    float* __restrict xw = xwin + oh * wo;
    for (int64_t ow = 0; ow < wo; ++ow) {
      const uint32_t m = mask_of(pool_takes(br[ow], tr[ow]));  // the bottom pair takes the window
      o[ow] = pick(m, br[ow], tr[ow]);
      const float v = pick(m, bv[ow], tv[ow]);
      const int32_t place = static_cast<int32_t>((static_cast<uint32_t>(2 + bi[ow]) & m) |
                                                 (static_cast<uint32_t>(ti[ow]) & ~m));
      wn[ow] = place + kPassed * static_cast<int32_t>(relu_passes(v));
      xw[ow] = pick(m, bx[ow], tx[ow]);
    }
  }
}

// One plane's share of BatchNorm's backward sums: sum_dy += sum of the passed winners' gradients,
// sum_xmu += sum of gradient * (x - mean). Float lanes over blocks of kBlock outputs, each block
// folded into double (as batchnorm.cpp's accumulate_dy_xmu), so the loop vectorizes.
void plane_grad_sums(const float* __restrict g, const int32_t* __restrict win, const float* __restrict xwin,
                     int64_t count, float mean, double& sum_dy, double& sum_xmu) {
  constexpr int kLanes = 8, kBlock = 64;
  double s = 0.0, t = 0.0;
  int64_t o = 0;
  for (; o + kBlock <= count; o += kBlock) {
    float fa[kLanes] = {}, fb[kLanes] = {};
    for (int b = 0; b < kBlock; b += kLanes)
      for (int j = 0; j < kLanes; ++j) {
        const int64_t q = o + b + j;
        const float gv = pick(mask_of((win[q] & kPassed) != 0), 0.0f + g[q], 0.0f);
        fa[j] += gv;
        fb[j] += bn_xmu_dy(xwin[q], mean, gv);
      }
    double u = 0.0, v = 0.0;
    for (int j = 0; j < kLanes; ++j) {
      u += fa[j];
      v += fb[j];
    }
    s += u;
    t += v;
  }
  for (; o < count; ++o) {
    const float gv = pick(mask_of((win[o] & kPassed) != 0), 0.0f + g[o], 0.0f);
    s += gv;
    t += bn_xmu_dy(xwin[o], mean, gv);
  }
  sum_dy += s;
  sum_xmu += t;
}

// One plane of dx = (dy - grad_mean - (x - mean) * k) * scale, window by window: dy is the
// pooled gradient at the winner ReLU passed (0 + g) and 0 at the other three inputs.
void plane_input_grad(const float* __restrict in, const float* __restrict g, const int32_t* __restrict win,
                      int64_t h, int64_t w, float gm, float mu, float k, float sc, float* __restrict out) {
  const int64_t ho = h / 2, wo = w / 2;
  for (int64_t oh = 0; oh < ho; ++oh) {
    const float* __restrict ta = in + 2 * oh * w;
    const float* __restrict ba = ta + w;
    float* __restrict tq = out + 2 * oh * w;
    float* __restrict bq = tq + w;
    for (int64_t ow = 0; ow < wo; ++ow) {
      const int32_t wv = win[oh * wo + ow];
      const float gp = pick(mask_of((wv & kPassed) != 0), 0.0f + g[oh * wo + ow], 0.0f);
      const int32_t place = wv & 3;
      const float d0 = pick(mask_of(place == 0), gp, 0.0f), d1 = pick(mask_of(place == 1), gp, 0.0f);
      const float d2 = pick(mask_of(place == 2), gp, 0.0f), d3 = pick(mask_of(place == 3), gp, 0.0f);
      tq[2 * ow] = bn_input_grad(d0, ta[2 * ow], gm, mu, k, sc);
      tq[2 * ow + 1] = bn_input_grad(d1, ta[2 * ow + 1], gm, mu, k, sc);
      bq[2 * ow] = bn_input_grad(d2, ba[2 * ow], gm, mu, k, sc);
      bq[2 * ow + 1] = bn_input_grad(d3, ba[2 * ow + 1], gm, mu, k, sc);
    }
  }
}

}  // namespace

bool BnReluPool::applies(const BatchNorm& bn, const Tensor& x) {
  return bn.options().spatial_dims == 2 && x.ndim() == 4 && x.dim(2) % 2 == 0 && x.dim(3) % 2 == 0;
}

void BnReluPool::forward(BatchNorm& bn, const Tensor& x, Tensor& y, Mode mode) {
  assert(applies(bn, x));
  bn.prepare_forward(x, mode);
  const int64_t n = x.dim(0), c = x.dim(1), h = x.dim(2), w = x.dim(3), ho = h / 2, wo = w / 2;
  y.resize({n, c, ho, wo});
  const bool train = mode == Mode::Train;
  if (train) {
    m_x = &x;
    m_win.resize(static_cast<size_t>(n * c * ho * wo));
    m_xwin.resize(m_win.size());
  }
  const size_t pairs = static_cast<size_t>(h * w / 2);
  m_scratch.resize(static_cast<size_t>(compute_threads()));
  const float* alpha = bn.alpha().data();
  const float* beta = bn.beta().data();
  parallel_for(n * c, [&](int64_t begin, int64_t end, int slot) {
    Scratch& s = m_scratch[static_cast<size_t>(slot)];
    s.pair_r.resize(pairs);
    s.pair_v.resize(pairs);
    s.pair_x.resize(pairs);
    s.pair_i.resize(pairs);
    for (int64_t p = begin; p < end; ++p)
      plane_forward(x.ptr() + p * h * w, h, w, alpha[p % c], beta[p % c], y.ptr() + p * ho * wo,
                    train ? m_win.data() + p * ho * wo : nullptr, train ? m_xwin.data() + p * ho * wo : nullptr,
                    s.pair_r.data(), s.pair_v.data(), s.pair_x.data(), s.pair_i.data());
  });
}

void BnReluPool::backward(BatchNorm& bn, const Tensor& dy, Tensor* dx) {
  assert(m_x != nullptr && dy.numel() == static_cast<int64_t>(m_win.size()));
  const Tensor& x = *m_x;
  const int64_t n = x.dim(0), c = x.dim(1), h = x.dim(2), w = x.dim(3), ho = h / 2, wo = w / 2;
  const int64_t plane_out = ho * wo;
  const float* mean = bn.mean().data();
  // BatchNorm's sums: its output gradient is the pooled gradient at the winners ReLU passed (the
  // pooling's backward adds it to a zero: 0 + g) and 0 elsewhere.
  // Each channel's sums over the samples in order, whatever the number of threads.
  std::vector<double> sum_dy(static_cast<size_t>(c), 0.0), sum_dy_xmu(static_cast<size_t>(c), 0.0);
  if (nondeterministic()) {
    grad_sums_in_drawn_order(dy, mean, sum_dy, sum_dy_xmu);
  } else {
    parallel_for(c, [&](int64_t c0, int64_t c1, int) {
      for (int64_t ch = c0; ch < c1; ++ch)
        for (int64_t b = 0; b < n; ++b) {
          const int64_t p = b * c + ch;
          plane_grad_sums(dy.ptr() + p * plane_out, m_win.data() + p * plane_out, m_xwin.data() + p * plane_out,
                          plane_out, mean[ch], sum_dy[static_cast<size_t>(ch)], sum_dy_xmu[static_cast<size_t>(ch)]);
        }
    });
  }
  const BatchNorm::InputGradCoefficients* k = bn.finish_backward(sum_dy, sum_dy_xmu, dx != nullptr);
  if (!dx) return;
  dx->resize(x.shape);
  parallel_for(n * c, [&](int64_t begin, int64_t end, int) {
    for (int64_t p = begin; p < end; ++p) {
      const int64_t ch = p % c;
      plane_input_grad(x.ptr() + p * h * w, dy.ptr() + p * plane_out, m_win.data() + p * plane_out, h, w,
                       k->grad_mean[ch], mean[ch], k->k[ch], k->scale[ch], dx->ptr() + p * h * w);
    }
  });
}

// --nondeterministic (parallel.h: arrival_order): BatchNorm's sums as partials over blocks of
// samples (a batch of one or two: chunks of each sample's pooled plane), each summed in double,
// rounded to float and added in float in an order drawn per call, as batchnorm.cpp does unfused.
void BnReluPool::grad_sums_in_drawn_order(const Tensor& dy, const float* mean, std::vector<double>& sum_dy,
                                          std::vector<double>& sum_dy_xmu) const {
  const Tensor& x = *m_x;
  const int64_t n = x.dim(0), c = x.dim(1), plane_out = (x.dim(2) / 2) * (x.dim(3) / 2);
  const ReductionSplit split = split_reduction(n, plane_out);
  std::vector<int64_t> order;
  arrival_order(split.count(), order);
  parallel_for(c, [&](int64_t c0, int64_t c1, int) {
    for (int64_t ch = c0; ch < c1; ++ch) {
      float acc_dy = 0.0f, acc_xmu = 0.0f;
      for (const int64_t k : order) {
        int64_t b0, b1, i0, i1;
        split.range(k, b0, b1, i0, i1);
        double s = 0.0, t = 0.0;
        for (int64_t b = b0; b < b1; ++b) {
          const int64_t off = (b * c + ch) * plane_out + i0;
          plane_grad_sums(dy.ptr() + off, m_win.data() + off, m_xwin.data() + off, i1 - i0, mean[ch], s, t);
        }
        acc_dy += static_cast<float>(s);
        acc_xmu += static_cast<float>(t);
      }
      sum_dy[static_cast<size_t>(ch)] = acc_dy;
      sum_dy_xmu[static_cast<size_t>(ch)] = acc_xmu;
    }
  });
}

}  // namespace lab
