#include "minidl/ops/native/im2col.hpp"

#include <immintrin.h>

#include <algorithm>
#include <atomic>
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

// ---- AVX-512 paths for unit column stride ----------------------------------------------------
// The library is built for baseline x86-64, where the row copies above compile to 128-bit moves
// and leave im2col at a quarter of a 3x3 convolution's forward time. As the GEMM does, the
// common unit-stride case gets an AVX-512 version chosen once at run time: each row is whole
// 16-float vectors and one masked vector (masked loads do not touch the lanes they skip).

#define MINIDL_TARGET_AVX512 __attribute__((target("avx512f")))

namespace {

std::atomic<bool> g_force_portable{false};

bool use_avx512() {
  static const bool yes = __builtin_cpu_supports("avx512f");
  return yes && !g_force_portable.load(std::memory_order_relaxed);
}

/// The first n % 16 lanes.
MINIDL_TARGET_AVX512 inline __mmask16 tail_mask(int64_t n) {
  return static_cast<__mmask16>((1u << (n % 16)) - 1);
}

/// out[0:n] = in[0:n], n = full + popcount(tail)
MINIDL_TARGET_AVX512 inline void copy_row(const float* in, float* out, int64_t full,
                                          __mmask16 tail) {
  int64_t j = 0;
  for (; j < full; j += 16) _mm512_storeu_ps(out + j, _mm512_loadu_ps(in + j));
  if (tail != 0) _mm512_mask_storeu_ps(out + j, tail, _mm512_maskz_loadu_ps(tail, in + j));
}

/// acc[0:n] += in[0:n], n = full + popcount(tail)
MINIDL_TARGET_AVX512 inline void add_row(const float* in, float* acc, int64_t full,
                                         __mmask16 tail) {
  int64_t j = 0;
  for (; j < full; j += 16) {
    _mm512_storeu_ps(acc + j, _mm512_add_ps(_mm512_loadu_ps(acc + j), _mm512_loadu_ps(in + j)));
  }
  if (tail != 0) {
    const __m512 sum =
        _mm512_add_ps(_mm512_maskz_loadu_ps(tail, acc + j), _mm512_maskz_loadu_ps(tail, in + j));
    _mm512_mask_storeu_ps(acc + j, tail, sum);
  }
}

/// padded_plane with vector row copies.
MINIDL_TARGET_AVX512 const float* padded_plane_avx512(const ConvGeom& g, const float* src,
                                                      float* buf) {
  if (g.PH == 0 && g.PW == 0) return src;
  const int64_t wp = g.W + 2 * g.PW, full = g.W / 16 * 16;
  const __mmask16 tail = tail_mask(g.W);
  std::fill_n(buf, g.PH * wp, 0.0f);
  for (int64_t h = 0; h < g.H; ++h) {
    float* row = buf + (g.PH + h) * wp;
    for (int64_t i = 0; i < g.PW; ++i) row[i] = row[g.PW + g.W + i] = 0.0f;
    copy_row(src + h * g.W, row + g.PW, full, tail);
  }
  std::fill_n(buf + (g.PH + g.H) * wp, g.PH * wp, 0.0f);
  return buf;
}

/// copy_row with the whole-vector count kFull known at compile time (kFull < 0: not known), so
/// that the row loop of a small map is straight-line code.
template <int kFull>
MINIDL_TARGET_AVX512 inline void copy_row_n(const float* in, float* out, int64_t full,
                                            __mmask16 tail) {
  if constexpr (kFull < 0) {
    copy_row(in, out, full, tail);
  } else {
#pragma GCC unroll 4
    for (int j = 0; j < kFull; ++j) _mm512_storeu_ps(out + 16 * j, _mm512_loadu_ps(in + 16 * j));
    if (tail != 0) {
      _mm512_mask_storeu_ps(out + 16 * kFull, tail, _mm512_maskz_loadu_ps(tail, in + 16 * kFull));
    }
  }
}

// src [C,H,W] -> dst [C*KH*KW, OH*OW], SW == 1
template <int kFull>
MINIDL_TARGET_AVX512 void im2col_unit_avx512(const ConvGeom& g, const float* src, float* dst,
                                             int64_t c0, int64_t c1) {
  float* buf = g.PH > 0 || g.PW > 0 ? plane_buffer(g) : nullptr;
  const int64_t wp = g.W + 2 * g.PW, ow_n = g.OW, full = ow_n / 16 * 16, sh = g.SH;
  const __mmask16 tail = tail_mask(ow_n);
  for (int64_t c = c0; c < c1; ++c) {
    const float* plane = padded_plane_avx512(g, src + c * g.H * g.W, buf);
    float* d = dst + c * g.KH * g.KW * g.cols();
    for (int64_t r = 0; r < g.KH; ++r) {
      for (int64_t s = 0; s < g.KW; ++s) {
        const float* in = plane + r * wp + s;
        for (int64_t oh = 0; oh < g.OH; ++oh, d += ow_n, in += sh * wp) {
          copy_row_n<kFull>(in, d, full, tail);
        }
      }
    }
  }
}

void im2col_unit(const ConvGeom& g, const float* src, float* dst, int64_t c0, int64_t c1) {
  switch (g.OW / 16) {
    case 0:
      return im2col_unit_avx512<0>(g, src, dst, c0, c1);
    case 1:
      return im2col_unit_avx512<1>(g, src, dst, c0, c1);
    case 2:
      return im2col_unit_avx512<2>(g, src, dst, c0, c1);
    default:
      return im2col_unit_avx512<-1>(g, src, dst, c0, c1);
  }
}

// src [C*KH*KW, OH*OW] -> dst [C,H,W], SW == 1
MINIDL_TARGET_AVX512 void col2im_unit_avx512(const ConvGeom& g, const float* src, float* dst,
                                             int64_t c0, int64_t c1) {
  const bool padded = g.PH > 0 || g.PW > 0;
  const int64_t wp = g.W + 2 * g.PW, hp = g.H + 2 * g.PH;
  const int64_t ow_n = g.OW, full = ow_n / 16 * 16, w_full = g.W / 16 * 16;
  const __mmask16 tail = tail_mask(ow_n), w_tail = tail_mask(g.W);
  float* buf = padded ? plane_buffer(g) : nullptr;
  const int64_t per_channel = g.KH * g.KW * g.cols();
  for (int64_t c = c0; c < c1; ++c) {
    float* out = dst + c * g.H * g.W;
    float* acc = padded ? buf : out;
    std::fill_n(acc, hp * wp, 0.0f);
    const float* d = src + c * per_channel;
    for (int64_t r = 0; r < g.KH; ++r) {
      for (int64_t s = 0; s < g.KW; ++s) {
        for (int64_t oh = 0; oh < g.OH; ++oh, d += ow_n) {
          add_row(d, acc + (oh * g.SH + r) * wp + s, full, tail);
        }
      }
    }
    if (!padded) continue;
    for (int64_t h = 0; h < g.H; ++h) {
      copy_row(acc + (g.PH + h) * wp + g.PW, out + h * g.W, w_full, w_tail);
    }
  }
}

}  // namespace

// src [C,H,W] -> dst [C*KH*KW, OH*OW]
void im2col(const ConvGeom& g, const float* src, float* dst, int64_t c0, int64_t c1) {
  if (g.SW == 1 && use_avx512()) return im2col_unit(g, src, dst, c0, c1);
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
  // Rows of whole vectors, or one masked vector: measured 1.7-2x faster than the portable loop.
  // A row of whole vectors and a masked tail measured up to 2x slower (the next tap's unaligned
  // load overlaps the masked store before it), so those rows keep the portable loop.
  const bool vector_rows = g.OW % 16 == 0 || g.OW < 16;
  if (g.SW == 1 && vector_rows && use_avx512()) return col2im_unit_avx512(g, src, dst, c0, c1);
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

bool im2col_uses_avx512() { return use_avx512(); }
void im2col_force_portable(bool portable) { g_force_portable.store(portable); }

float* thread_scratch(std::size_t floats) {
  thread_local Scratch buffer;
  return buffer.get(floats);
}

}  // namespace minidl::native
