#include "conv2d.h"

#include <algorithm>
#include <cassert>
#include <cstring>
#include <vector>

#include "bf16.h"
#include "gemm.h"
#include "gemm_bf16.h"
#include "parallel.h"

namespace lab {

namespace {

struct Geometry {
  int n, cin, h, w, k, pad, ho, wo;
};

// in_shape: (N, Cin, H, W)
Geometry geometry_of(const std::vector<int64_t>& in_shape, int k, int pad) {
  const int h = static_cast<int>(in_shape[2]), w = static_cast<int>(in_shape[3]);
  const Geometry g{static_cast<int>(in_shape[0]), static_cast<int>(in_shape[1]), h, w, k, pad, h + 2 * pad - k + 1,
                   w + 2 * pad - k + 1};
  assert(g.ho > 0 && g.wo > 0);
  return g;
}

// The same layer on one sample of the batch.
Geometry single(Geometry g) {
  g.n = 1;
  return g;
}

// With "same" padding (2 * pad == k - 1, so Ho == H and Wo == W), the column row (c, kh, kw) of
// sample n is the input plane shifted by shift = (kh - pad) * W + (kw - pad) in flattened index,
// except at the borders. Copying whole planes (one memcpy of ~H*W values) and then zeroing the
// border is far cheaper than a call per output row. This describes the shifted plane.
struct PlaneShift {
  int64_t shift;   // source index = destination index + shift
  int64_t p0, p1;  // destination range [p0, p1) copied from the source
  int64_t row0, row1;  // destination rows [row0, row1) are inside the image, the others are zero
  int64_t col0, col1;  // and within them, columns outside [col0, col1) are zero
};

PlaneShift plane_shift(int64_t h, int64_t w, int64_t dr, int64_t dc) {
  PlaneShift s;
  s.shift = dr * w + dc;
  s.row0 = std::max<int64_t>(0, -dr);
  s.row1 = std::min<int64_t>(h, h - dr);
  s.col0 = std::max<int64_t>(0, -dc);
  s.col1 = std::min<int64_t>(w, w - dc);
  // The clamps cut only positions in zero columns of the first and last inside rows.
  s.p0 = std::max(s.row0 * w, -s.shift);
  s.p1 = std::min(s.row1 * w, h * w - s.shift);
  return s;
}

// Zeroes dst's positions that lie outside the image for this shift. dst: (H, W)
void zero_border(float* dst, int64_t h, int64_t w, const PlaneShift& s) {
  if (s.row0 > 0) std::fill(dst, dst + s.row0 * w, 0.0f);
  if (s.row1 < h) std::fill(dst + s.row1 * w, dst + h * w, 0.0f);
  for (int64_t r = s.row0; r < s.row1; ++r) {
    float* row = dst + r * w;
    for (int64_t c = 0; c < s.col0; ++c) row[c] = 0.0f;
    for (int64_t c = s.col1; c < w; ++c) row[c] = 0.0f;
  }
}

// dst[p] += src[p] over a run (the adjoint of the shifted copy).
void add_run(float* __restrict dst, const float* __restrict src, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] += src[i];
}

// cols: (Cin*k*k, N*Ho*Wo). Row (c, kh, kw) holds, for every output pixel (n, oh, ow), the input
// x[n, c, oh + kh - pad, ow + kw - pad] or 0 outside the image.
void im2col(const float* x, const Geometry& g, float* cols) {
  const size_t plane_out = static_cast<size_t>(g.ho) * g.wo;
  const size_t row_len = static_cast<size_t>(g.n) * plane_out;
  const bool same = 2 * g.pad == g.k - 1;
  for (int c = 0; c < g.cin; ++c) {
    for (int kh = 0; kh < g.k; ++kh) {
      for (int kw = 0; kw < g.k; ++kw) {
        float* row = cols + (static_cast<size_t>(c * g.k + kh) * g.k + kw) * row_len;
        if (same) {
          const PlaneShift s = plane_shift(g.h, g.w, kh - g.pad, kw - g.pad);
          for (int n = 0; n < g.n; ++n) {
            const float* src = x + (static_cast<size_t>(n) * g.cin + c) * g.h * g.w;
            float* dst = row + n * plane_out;
            if (s.p1 > s.p0)
              std::memcpy(dst + s.p0, src + s.p0 + s.shift, sizeof(float) * static_cast<size_t>(s.p1 - s.p0));
            zero_border(dst, g.h, g.w, s);
          }
          continue;
        }
        // General case: output columns whose input column iw = ow + kw - pad lies in [0, W).
        const int ow0 = std::max(0, g.pad - kw);
        const int ow1 = std::min(g.wo, g.w + g.pad - kw);
        for (int n = 0; n < g.n; ++n) {
          const float* src = x + (static_cast<size_t>(n) * g.cin + c) * g.h * g.w;
          float* dst = row + n * plane_out;
          for (int oh = 0; oh < g.ho; ++oh, dst += g.wo) {
            const int ih = oh + kh - g.pad;
            if (ih < 0 || ih >= g.h || ow0 >= ow1) {
              std::fill(dst, dst + g.wo, 0.0f);
              continue;
            }
            std::fill(dst, dst + ow0, 0.0f);
            std::memcpy(dst + ow0, src + static_cast<size_t>(ih) * g.w + (ow0 + kw - g.pad),
                        sizeof(float) * static_cast<size_t>(ow1 - ow0));
            std::fill(dst + ow1, dst + g.wo, 0.0f);
          }
        }
      }
    }
  }
}

// The adjoint of im2col: dx (N, Cin, H, W) = sum of every column entry into the input it came from.
// cols is scratch and is modified (its border entries are zeroed on the "same" path).
void col2im(float* cols, const Geometry& g, float* dx) {
  const size_t plane_out = static_cast<size_t>(g.ho) * g.wo;
  const size_t row_len = static_cast<size_t>(g.n) * plane_out;
  const bool same = 2 * g.pad == g.k - 1;
  std::fill(dx, dx + static_cast<size_t>(g.n) * g.cin * g.h * g.w, 0.0f);
  for (int c = 0; c < g.cin; ++c) {
    for (int kh = 0; kh < g.k; ++kh) {
      for (int kw = 0; kw < g.k; ++kw) {
        float* row = cols + (static_cast<size_t>(c * g.k + kh) * g.k + kw) * row_len;
        if (same) {
          const PlaneShift s = plane_shift(g.h, g.w, kh - g.pad, kw - g.pad);
          for (int n = 0; n < g.n; ++n) {
            float* src = row + n * plane_out;
            float* dst = dx + (static_cast<size_t>(n) * g.cin + c) * g.h * g.w;
            // Border entries belong to no input; zero them so one shifted add covers the rest.
            zero_border(src, g.h, g.w, s);
            if (s.p1 > s.p0) add_run(dst + s.p0 + s.shift, src + s.p0, s.p1 - s.p0);
          }
          continue;
        }
        const int ow0 = std::max(0, g.pad - kw);
        const int ow1 = std::min(g.wo, g.w + g.pad - kw);
        if (ow0 >= ow1) continue;
        for (int n = 0; n < g.n; ++n) {
          float* dst = dx + (static_cast<size_t>(n) * g.cin + c) * g.h * g.w;
          const float* src = row + n * plane_out;
          for (int oh = 0; oh < g.ho; ++oh, src += g.wo) {
            const int ih = oh + kh - g.pad;
            if (ih < 0 || ih >= g.h) continue;
            float* d = dst + static_cast<size_t>(ih) * g.w;
            const int shift = kw - g.pad;  // iw = ow + shift
            for (int ow = ow0; ow < ow1; ++ow) d[ow + shift] += src[ow];
          }
        }
      }
    }
  }
}

}  // namespace

int64_t Conv2d::forward_macs(const std::vector<int64_t>& in_shape) const {
  const int64_t ho = in_shape[2] + 2 * m_pad - m_k + 1, wo = in_shape[3] + 2 * m_pad - m_k + 1;
  return int64_t{m_cout} * m_cin * m_k * m_k * ho * wo;
}

Conv2d::Conv2d(int in_channels, int out_channels, int kernel_size, int padding, bool bias)
    : m_cin(in_channels), m_cout(out_channels), m_k(kernel_size), m_pad(padding), m_has_bias(bias) {
  const std::vector<int64_t> wshape{out_channels, in_channels, kernel_size, kernel_size};
  m_weight = {"weight", Tensor(wshape), Tensor(wshape)};
  if (bias) m_bias = {"bias", Tensor({out_channels}), Tensor({out_channels})};
}

std::string Conv2d::describe() const {
  std::string s = "Conv2d(" + std::to_string(m_cin) + ", " + std::to_string(m_cout) + ", " + std::to_string(m_k);
  if (m_pad) s += ", padding=" + std::to_string(m_pad);
  if (!m_has_bias) s += ", bias=False";
  return s + ")";
}

std::vector<Param*> Conv2d::params() {
  if (m_has_bias) return {&m_weight, &m_bias};
  return {&m_weight};
}

void Conv2d::reset_parameters(TorchGenerator& g) {
  const int64_t fan_in = static_cast<int64_t>(m_cin) * m_k * m_k;
  kaiming_uniform_default(m_weight.value.ptr(), m_weight.value.numel(), fan_in, g);
  if (m_has_bias) bias_uniform_default(m_bias.value.ptr(), m_bias.value.numel(), fan_in, g);
}

// One sample at a time: its columns (Cin*k*k, Ho*Wo) stay in the core's cache, and the product
// W (Cout, Cin*k*k) x cols is the sample's output plane block (Cout, Ho*Wo) in NCHW already, so
// no permute follows. (Unfolding the whole batch first wrote Cin*k*k*N*Ho*Wo floats, 14 MB for the
// cnn's second conv at batch 64, and read them back from memory; per sample it is 225 KB.)
void Conv2d::forward(const Tensor& x, Tensor& y, Mode mode) {
  assert(x.ndim() == 4 && x.dim(1) == m_cin);
  const Geometry g = geometry_of(x.shape, m_k, m_pad);
  assert(mode == Mode::Eval || m_autocast == Autocast::None);  // Model::forward refuses Train under autocast
  if (mode == Mode::Train) {
    m_in_shape = x.shape;
    m_x = x;  // backward unfolds the input again, sample by sample
  }
  const int kk = m_cin * m_k * m_k;
  const int plane = g.ho * g.wo;
  const size_t in_sample = static_cast<size_t>(m_cin) * g.h * g.w;
  const size_t out_sample = static_cast<size_t>(m_cout) * plane;
  const Geometry one = single(g);
  y.resize({g.n, m_cout, g.ho, g.wo});
  m_scratch.resize(static_cast<size_t>(compute_threads()));
  std::vector<float> bias_bf16;  // (Cout,) under autocast: bf16(b)
  if (m_autocast == Autocast::BF16 && m_has_bias)
    for (int co = 0; co < m_cout; ++co) bias_bf16.push_back(round_bf16(m_bias.value.ptr()[co]));
  parallel_for(g.n, [&](int64_t begin, int64_t end, int slot) {
    Tensor& cols = m_scratch[static_cast<size_t>(slot)].cols;
    cols.resize({kk, plane});
    for (int64_t n = begin; n < end; ++n) {
      im2col(x.ptr() + n * in_sample, one, cols.ptr());
      float* out = y.ptr() + n * out_sample;
      if (m_autocast == Autocast::BF16) {
        // y[n] (Cout, Ho*Wo) = bf16(bf16(W) bf16(cols) + bf16(b)), sums in float32
        Bf16Epilogue ep;
        ep.bias = m_has_bias ? bias_bf16.data() : nullptr;
        ep.bias_per_row = true;
        ep.round = true;
        gemm_bf16(false, m_cout, plane, kk, m_weight.value.ptr(), kk, cols.ptr(), plane, out, plane, ep);
        continue;
      }
      // y[n] (Cout, Ho*Wo) = W (Cout, Cin*k*k) cols (Cin*k*k, Ho*Wo)
      sgemm(false, false, m_cout, plane, kk, 1.0f, m_weight.value.ptr(), kk, cols.ptr(), plane, 0.0f, out, plane);
      if (m_has_bias)
        for (int co = 0; co < m_cout; ++co) {
          const float b = m_bias.value.ptr()[co];
          for (float *p = out + static_cast<size_t>(co) * plane, *e = p + plane; p != e; ++p) *p += b;
        }
    }
  });
}

// The weight gradient is a sum over samples. It is summed per block of kSamplesPerBlock samples
// and the blocks' sums are added in block order, so the bits depend on the batch alone, not on
// how many threads share the blocks.
void Conv2d::backward(const Tensor& dy, Tensor* dx) {
  if (nondeterministic()) return backward_in_arrival_order(dy, dx);
  const Geometry g = geometry_of(m_in_shape, m_k, m_pad);
  assert(dy.ndim() == 4 && dy.dim(0) == g.n && dy.dim(1) == m_cout && dy.dim(2) == g.ho && dy.dim(3) == g.wo);
  const int kk = m_cin * m_k * m_k;
  const int plane = g.ho * g.wo;
  const size_t in_sample = static_cast<size_t>(m_cin) * g.h * g.w;
  const size_t out_sample = static_cast<size_t>(m_cout) * plane;
  const size_t wsize = static_cast<size_t>(m_cout) * kk;
  const Geometry one = single(g);
  const int blocks = (g.n + kSamplesPerBlock - 1) / kSamplesPerBlock;
  m_dw_blocks.resize({blocks, m_cout, kk});
  if (dx) dx->resize(m_in_shape);
  m_scratch.resize(static_cast<size_t>(compute_threads()));
  float* grad = m_weight.grad.ptr();
  parallel_for(blocks, [&](int64_t block_begin, int64_t block_end, int slot) {
    Tensor& cols = m_scratch[static_cast<size_t>(slot)].cols;
    Tensor& dcols = m_scratch[static_cast<size_t>(slot)].dcols;
    cols.resize({kk, plane});
    if (dx) dcols.resize({kk, plane});
    for (int64_t b = block_begin; b < block_end; ++b) {
      float* dw = m_dw_blocks.ptr() + b * wsize;
      const int64_t first = b * kSamplesPerBlock, last = std::min<int64_t>(g.n, first + kSamplesPerBlock);
      for (int64_t n = first; n < last; ++n) {
        const float* dyn = dy.ptr() + n * out_sample;
        im2col(m_x.ptr() + n * in_sample, one, cols.ptr());
        // dW block (Cout, Cin*k*k) += dy[n] (Cout, Ho*Wo) cols^T (Ho*Wo, Cin*k*k)
        sgemm(false, true, m_cout, kk, plane, 1.0f, dyn, plane, cols.ptr(), plane, n == first ? 0.0f : 1.0f, dw, kk);
        if (dx) {
          // dcols (Cin*k*k, Ho*Wo) = W^T (Cin*k*k, Cout) dy[n] (Cout, Ho*Wo), folded back into dx[n]
          sgemm(true, false, kk, plane, m_cout, 1.0f, m_weight.value.ptr(), kk, dyn, plane, 0.0f, dcols.ptr(), plane);
          col2im(dcols.ptr(), one, dx->ptr() + n * in_sample);
        }
      }
    }
  });
  for (int b = 0; b < blocks; ++b) {
    const float* dw = m_dw_blocks.ptr() + b * wsize;
    for (size_t i = 0; i < wsize; ++i) grad[i] += dw[i];
  }
  if (m_has_bias) {
    for (int co = 0; co < m_cout; ++co) {
      double s = 0.0;
      for (int n = 0; n < g.n; ++n) {
        const float* row = dy.ptr() + n * out_sample + static_cast<size_t>(co) * plane;
        for (int p = 0; p < plane; ++p) s += row[p];
      }
      m_bias.grad.ptr()[co] += static_cast<float>(s);
    }
  }
}

// --nondeterministic (parallel.h): the weight and bias gradients as partial sums, one per sample
// (a batch of one or two: per chunk of a sample's output positions), each added into the gradient
// when it is done, in float. The partials are taken in an order drawn per call; with several
// compute threads each thread adds its partials atomically as it finishes them, so their order
// also depends on which thread gets there first, as GPU atomics do.
void Conv2d::backward_in_arrival_order(const Tensor& dy, Tensor* dx) {
  const Geometry g = geometry_of(m_in_shape, m_k, m_pad);
  assert(dy.ndim() == 4 && dy.dim(0) == g.n && dy.dim(1) == m_cout && dy.dim(2) == g.ho && dy.dim(3) == g.wo);
  const int kk = m_cin * m_k * m_k;
  const int plane = g.ho * g.wo;
  const size_t in_sample = static_cast<size_t>(m_cin) * g.h * g.w;
  const size_t out_sample = static_cast<size_t>(m_cout) * plane;
  const size_t wsize = static_cast<size_t>(m_cout) * kk;
  const Geometry one = single(g);
  const ReductionSplit split = split_reduction(g.n, plane, g.n);
  arrival_order(split.count(), m_order);
  if (dx) dx->resize(m_in_shape);
  m_scratch.resize(static_cast<size_t>(compute_threads()));
  const bool atomics = compute_threads() > 1;
  float* grad = m_weight.grad.ptr();
  float* bias_grad = m_has_bias ? m_bias.grad.ptr() : nullptr;
  parallel_for(split.count(), [&](int64_t k0, int64_t k1, int slot) {
    Scratch& s = m_scratch[static_cast<size_t>(slot)];
    s.cols.resize({kk, plane});
    if (dx) s.dcols.resize({kk, plane});
    s.dw.resize({m_cout, kk});
    s.db.resize(static_cast<size_t>(m_cout));
    int64_t unfolded = -1;  // the sample whose columns s.cols holds
    for (int64_t k = k0; k < k1; ++k) {
      int64_t n0, n1, i0, i1;
      split.range(m_order[static_cast<size_t>(k)], n0, n1, i0, i1);
      const int positions = static_cast<int>(i1 - i0);
      std::fill(s.db.begin(), s.db.end(), 0.0);
      for (int64_t n = n0; n < n1; ++n) {
        const float* dyn = dy.ptr() + n * out_sample;
        if (unfolded != n) im2col(m_x.ptr() + n * in_sample, one, s.cols.ptr());
        unfolded = n;
        // partial dW (Cout, Cin*k*k) (+)= dy[n] positions i0..i1 (Cout, positions) cols^T (positions, Cin*k*k)
        sgemm(false, true, m_cout, kk, positions, 1.0f, dyn + i0, plane, s.cols.ptr() + i0, plane,
              n == n0 ? 0.0f : 1.0f, s.dw.ptr(), kk);
        if (m_has_bias)
          for (int co = 0; co < m_cout; ++co) {
            const float* row = dyn + static_cast<size_t>(co) * plane;
            for (int64_t p = i0; p < i1; ++p) s.db[static_cast<size_t>(co)] += row[p];
          }
        if (dx && i0 == 0) {  // dx[n] once per sample, as in backward()
          sgemm(true, false, kk, plane, m_cout, 1.0f, m_weight.value.ptr(), kk, dyn, plane, 0.0f, s.dcols.ptr(), plane);
          col2im(s.dcols.ptr(), one, dx->ptr() + n * in_sample);
        }
      }
      const float* dw = s.dw.ptr();
      if (atomics) {
        for (size_t i = 0; i < wsize; ++i) atomic_add(grad + i, dw[i]);
        if (bias_grad)
          for (int co = 0; co < m_cout; ++co) atomic_add(bias_grad + co, static_cast<float>(s.db[static_cast<size_t>(co)]));
      } else {
        for (size_t i = 0; i < wsize; ++i) grad[i] += dw[i];
        if (bias_grad)
          for (int co = 0; co < m_cout; ++co) bias_grad[co] += static_cast<float>(s.db[static_cast<size_t>(co)]);
      }
    }
  });
}

void conv2d_forward_naive(const Tensor& x, const Tensor& weight, const float* bias, int padding, Tensor& y) {
  const int64_t n = x.dim(0), cin = x.dim(1), h = x.dim(2), w = x.dim(3);
  const int64_t cout = weight.dim(0), k = weight.dim(2);
  assert(weight.dim(1) == cin && weight.dim(3) == k);
  const int64_t ho = h + 2 * padding - k + 1, wo = w + 2 * padding - k + 1;
  y.resize({n, cout, ho, wo});
  for (int64_t b = 0; b < n; ++b)
    for (int64_t co = 0; co < cout; ++co)
      for (int64_t oh = 0; oh < ho; ++oh)
        for (int64_t ow = 0; ow < wo; ++ow) {
          double acc = bias ? bias[co] : 0.0;
          for (int64_t ci = 0; ci < cin; ++ci)
            for (int64_t kh = 0; kh < k; ++kh)
              for (int64_t kw = 0; kw < k; ++kw) {
                const int64_t ih = oh + kh - padding, iw = ow + kw - padding;
                if (ih < 0 || ih >= h || iw < 0 || iw >= w) continue;
                acc += static_cast<double>(x.data[((b * cin + ci) * h + ih) * w + iw]) *
                       weight.data[((co * cin + ci) * k + kh) * k + kw];
              }
          y.data[((b * cout + co) * ho + oh) * wo + ow] = static_cast<float>(acc);
        }
}

}  // namespace lab
