#include "minidl/ops/native/im2col.hpp"

#include <algorithm>
#include <cstdlib>
#include <new>

namespace minidl::native {
namespace {

using std::int64_t;

class Scratch {
 public:
  Scratch() = default;
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  ~Scratch() { std::free(data_); }

  float* get(std::size_t floats) {
    if (floats > capacity_) {
      const std::size_t bytes = (std::max<std::size_t>(floats, 16) * 4 + 63) / 64 * 64;
      void* p = std::aligned_alloc(64, bytes);
      if (p == nullptr) throw std::bad_alloc();
      std::free(data_);
      data_ = static_cast<float*>(p);
      capacity_ = bytes / 4;
    }
    return data_;
  }

 private:
  float* data_ = nullptr;
  std::size_t capacity_ = 0;
};

/// The calling thread's buffer for one zero-padded input plane (L1-sized for common layers).
float* plane_buffer(const ConvGeom& g) {
  thread_local Scratch buffer;
  return buffer.get(static_cast<std::size_t>((g.H + 2 * g.PH) * (g.W + 2 * g.PW)));
}

/// One input plane with its zero border, so that every tap's reads are in bounds and the copy
/// loops below have no edge cases. Without padding that is the plane itself.
// src [H,W] -> buf [H+2PH, W+2PW]
const float* padded_plane(const ConvGeom& g, const float* src, float* buf) {
  if (g.PH == 0 && g.PW == 0) return src;
  const int64_t wp = g.W + 2 * g.PW;
  std::fill_n(buf, g.PH * wp, 0.0f);
  for (int64_t h = 0; h < g.H; ++h) {
    float* row = buf + (g.PH + h) * wp;
    const float* in = src + h * g.W;
    for (int64_t i = 0; i < g.PW; ++i) row[i] = row[g.PW + g.W + i] = 0.0f;
#pragma omp simd
    for (int64_t w = 0; w < g.W; ++w) row[g.PW + w] = in[w];
  }
  std::fill_n(buf + (g.PH + g.H) * wp, g.PH * wp, 0.0f);
  return buf;
}

}  // namespace

/// One channel's KH*KW rows of the column matrix, each [OH, OW] reads of the padded plane. SW is
/// a template parameter so that the unit-stride case is a contiguous copy.
template <int64_t kSW>
void taps_to_cols(const ConvGeom& g, const float* plane, float* d) {
  const int64_t wp = g.W + 2 * g.PW, oh_n = g.OH, ow_n = g.OW, sh = g.SH;
  const int64_t sw = kSW > 0 ? kSW : g.SW;
  for (int64_t r = 0; r < g.KH; ++r) {
    for (int64_t s = 0; s < g.KW; ++s) {
      for (int64_t oh = 0; oh < oh_n; ++oh, d += ow_n) {
        const float* in = plane + (oh * sh + r) * wp + s;
#pragma omp simd
        for (int64_t ow = 0; ow < ow_n; ++ow) d[ow] = in[ow * sw];
      }
    }
  }
}

// src [C,H,W] -> dst [C*KH*KW, OH*OW]
void im2col(const ConvGeom& g, const float* src, float* dst, int64_t c0, int64_t c1) {
  float* buf = g.PH > 0 || g.PW > 0 ? plane_buffer(g) : nullptr;
  const int64_t per_channel = g.KH * g.KW * g.cols();
  for (int64_t c = c0; c < c1; ++c) {
    const float* plane = padded_plane(g, src + c * g.H * g.W, buf);
    if (g.SW == 1) {
      taps_to_cols<1>(g, plane, dst + c * per_channel);
    } else {
      taps_to_cols<0>(g, plane, dst + c * per_channel);
    }
  }
}

/// The adjoint of taps_to_cols: adds one channel's column rows into its padded plane.
template <int64_t kSW>
void cols_to_taps(const ConvGeom& g, const float* d, float* plane) {
  const int64_t wp = g.W + 2 * g.PW, oh_n = g.OH, ow_n = g.OW, sh = g.SH;
  const int64_t sw = kSW > 0 ? kSW : g.SW;
  for (int64_t r = 0; r < g.KH; ++r) {
    for (int64_t s = 0; s < g.KW; ++s) {
      for (int64_t oh = 0; oh < oh_n; ++oh, d += ow_n) {
        float* a = plane + (oh * sh + r) * wp + s;
        // Within one row distinct ow hit distinct elements (SW > 0): the lanes never collide.
#pragma omp simd
        for (int64_t ow = 0; ow < ow_n; ++ow) a[ow * sw] += d[ow];
      }
    }
  }
}

// src [C*KH*KW, OH*OW] -> dst [C,H,W]
void col2im(const ConvGeom& g, const float* src, float* dst, int64_t c0, int64_t c1) {
  const bool padded = g.PH > 0 || g.PW > 0;
  const int64_t wp = g.W + 2 * g.PW, hp = g.H + 2 * g.PH;
  float* buf = padded ? plane_buffer(g) : nullptr;
  const int64_t per_channel = g.KH * g.KW * g.cols();
  for (int64_t c = c0; c < c1; ++c) {
    // Sum into the padded plane, whose border absorbs the taps that fall in the padding.
    float* out = dst + c * g.H * g.W;
    float* acc = padded ? buf : out;
    std::fill_n(acc, hp * wp, 0.0f);
    if (g.SW == 1) {
      cols_to_taps<1>(g, src + c * per_channel, acc);
    } else {
      cols_to_taps<0>(g, src + c * per_channel, acc);
    }
    if (!padded) continue;
    for (int64_t h = 0; h < g.H; ++h) {
      const float* row = acc + (g.PH + h) * wp + g.PW;
#pragma omp simd
      for (int64_t w = 0; w < g.W; ++w) out[h * g.W + w] = row[w];
    }
  }
}

float* thread_scratch(std::size_t floats) {
  thread_local Scratch buffer;
  return buffer.get(floats);
}

}  // namespace minidl::native
