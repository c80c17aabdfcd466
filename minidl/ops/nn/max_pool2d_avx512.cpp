// The AVX-512 kernels of max_pool2d (declared in max_pool2d_lanes.hpp, chosen at run time by
// max_pool2d.cpp when the CPU has AVX-512 F, BW and VL). Each keeps the running maximum and its
// index of 16 outputs in two registers, so a window tap is one load, two compares and two masked
// moves (a 2x2 window without NaNs: one compare per tap, and the backward of 2x2 windows of
// stride 2 writes both input rows of a window row at once); tails of fewer than 16 channels or
// outputs are masked loads and stores, which touch no lane they skip. The portable kernels
// compiled with target_clones kept their per-lane accumulators in stack arrays reloaded at every
// tap, behind loops whose trip count (8 or 16 lanes) was known only at run time; they stay for
// every other CPU and are the tests' reference.
#include <algorithm>
#include <atomic>
#include <bit>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "minidl/ops/bf16_round.hpp"
#include "minidl/ops/native/dot_bf16.hpp"
#include "minidl/ops/nn/max_pool2d_lanes.hpp"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace minidl::ops::pool {

using std::int64_t;

namespace {
std::atomic<bool> g_force_portable{false};
}  // namespace

void force_portable(bool portable) { g_force_portable.store(portable); }

#if defined(__x86_64__)

bool avx512_kernels() {
  static const bool yes = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512vl");
  return yes && !g_force_portable.load(std::memory_order_relaxed);
}

// GCC 12's unmasked forms of some intrinsics start from an undefined vector and trip
// -Wmaybe-uninitialized: the masked forms with every lane selected are used instead.
// Everything below is compiled for AVX-512 (F, BW, VL) and only called when avx512_kernels().
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl")
#define MINIDL_AVX512
#define MINIDL_AVX512_INLINE __attribute__((always_inline)) inline

namespace {

MINIDL_AVX512_INLINE __mmask16 first_lanes(int64_t n) {
  return n >= 16 ? __mmask16{0xffff} : static_cast<__mmask16>((1u << n) - 1u);
}

// 16 values as f32 (bf16 -> f32 is exact: the upper half of an f32).
MINIDL_AVX512_INLINE __m512 load16(const float* p, __mmask16 m) {
  return _mm512_maskz_loadu_ps(m, p);
}
MINIDL_AVX512_INLINE __m512 load16(const std::uint16_t* p, __mmask16 m) {
  return native::dot_bf16::widen16(_mm256_maskz_loadu_epi16(m, p));
}

MINIDL_AVX512_INLINE void store16(float* p, __mmask16 m, __m512 v) {
  _mm512_mask_storeu_ps(p, m, v);
}
MINIDL_AVX512_INLINE void store16(std::uint16_t* p, __mmask16 m, __m512 v) {
  _mm256_mask_storeu_epi16(p, m, _mm512_maskz_cvtepi32_epi16(0xffff, bf16_round16(v)));
}

MINIDL_AVX512_INLINE void store1(float* p, float v) { *p = v; }
MINIDL_AVX512_INLINE void store1(std::uint16_t* p, float v) { *p = bf16_round(v); }

// Bits of an element of dx (f32, or bf16 in the low half): stored as they are.
MINIDL_AVX512_INLINE void store_bits(float* p, __mmask16 m, __m512i v) {
  _mm512_mask_storeu_epi32(p, m, v);
}
MINIDL_AVX512_INLINE void store_bits(std::uint16_t* p, __mmask16 m, __m512i v) {
  _mm256_mask_storeu_epi16(p, m, _mm512_maskz_cvtepi32_epi16(0xffff, v));
}

// The bits dx takes where the argmax names it: 0.0f + dy (a -0 becomes +0) in dx's type; between
// bf16 values the bits of dy but for -0, in integers, as the portable grad_value.
template <typename TD, typename TY>
MINIDL_AVX512_INLINE __m512i grad_bits(const TY* p, __mmask16 m) {
  if constexpr (std::is_same_v<TD, std::uint16_t> && std::is_same_v<TY, std::uint16_t>) {
    const __m512i h = _mm512_maskz_cvtepu16_epi32(0xffff, _mm256_maskz_loadu_epi16(m, p));
    const __mmask16 neg0 = _mm512_cmpeq_epi32_mask(h, _mm512_set1_epi32(0x8000));
    return _mm512_maskz_mov_epi32(static_cast<__mmask16>(~neg0), h);
  } else {
    const __m512 g = _mm512_add_ps(_mm512_setzero_ps(), load16(p, m));
    if constexpr (std::is_same_v<TD, float>) {
      return _mm512_castps_si512(g);
    } else {
      return bf16_round16(g);
    }
  }
}

// One tap: take v where it beats the running maximum (strict >) or is a NaN.
MINIDL_AVX512_INLINE void tap(__m512 v, __m512i at, __m512& acc, __m512i& idx) {
  const __mmask16 take =
      _mm512_cmp_ps_mask(v, acc, _CMP_GT_OQ) | _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  acc = _mm512_mask_mov_ps(acc, take, v);
  idx = _mm512_mask_mov_epi32(idx, take, at);
}

// A fused relu: acc where acc > 0, else +0 (a NaN or -0 included: relu's rule), and the argmax
// of a clamped output kClamped, so that the backward routes it nowhere (relu's mask).
MINIDL_AVX512_INLINE void relu_clamp(__m512& acc, __m512i& idx) {
  const __mmask16 pass = _mm512_cmp_ps_mask(acc, _mm512_setzero_ps(), _CMP_GT_OQ);
  acc = _mm512_maskz_mov_ps(pass, acc);
  idx = _mm512_mask_mov_epi32(_mm512_set1_epi32(kClamped), pass, idx);
}

// r[i] = column i of the 16x16 matrix of 32-bit values whose row i was r[i].
MINIDL_AVX512_INLINE void transpose16(__m512 r[16]) {
  const __m512 z = _mm512_setzero_ps();
  __m512 t[16];
  for (int k = 0; k < 8; ++k) {
    t[2 * k] = _mm512_mask_unpacklo_ps(z, 0xffff, r[2 * k], r[2 * k + 1]);
    t[2 * k + 1] = _mm512_mask_unpackhi_ps(z, 0xffff, r[2 * k], r[2 * k + 1]);
  }
  // r[4q + k]: in each 128-bit lane L, column 4L + k of rows 4q .. 4q + 3.
  for (int q = 0; q < 4; ++q) {
    r[4 * q] = _mm512_mask_shuffle_ps(z, 0xffff, t[4 * q], t[4 * q + 2], 0x44);
    r[4 * q + 1] = _mm512_mask_shuffle_ps(z, 0xffff, t[4 * q], t[4 * q + 2], 0xee);
    r[4 * q + 2] = _mm512_mask_shuffle_ps(z, 0xffff, t[4 * q + 1], t[4 * q + 3], 0x44);
    r[4 * q + 3] = _mm512_mask_shuffle_ps(z, 0xffff, t[4 * q + 1], t[4 * q + 3], 0xee);
  }
  for (int k = 0; k < 4; ++k) {
    t[k] = _mm512_mask_shuffle_f32x4(z, 0xffff, r[k], r[4 + k], 0x88);
    t[4 + k] = _mm512_mask_shuffle_f32x4(z, 0xffff, r[k], r[4 + k], 0xdd);
    t[8 + k] = _mm512_mask_shuffle_f32x4(z, 0xffff, r[8 + k], r[12 + k], 0x88);
    t[12 + k] = _mm512_mask_shuffle_f32x4(z, 0xffff, r[8 + k], r[12 + k], 0xdd);
  }
  for (int k = 0; k < 4; ++k) {
    r[k] = _mm512_mask_shuffle_f32x4(z, 0xffff, t[k], t[8 + k], 0x88);
    r[8 + k] = _mm512_mask_shuffle_f32x4(z, 0xffff, t[k], t[8 + k], 0xdd);
    r[4 + k] = _mm512_mask_shuffle_f32x4(z, 0xffff, t[4 + k], t[12 + k], 0x88);
    r[12 + k] = _mm512_mask_shuffle_f32x4(z, 0xffff, t[4 + k], t[12 + k], 0xdd);
  }
}

// 2x2 windows of stride 2 without padding: the CNNs' poolings, which have paths of their own.
MINIDL_AVX512_INLINE bool stride_2x2(const native::ConvGeom& g) {
  return g.KH == 2 && g.KW == 2 && g.SH == 2 && g.SW == 2 && g.PH == 0 && g.PW == 0;
}

// The offsets of a 2x2 window's taps from its first, in an input row of w: 1, w and w + 1.
struct Taps2x2 {
  __m512i right, below, below_right;
  explicit Taps2x2(int64_t w)
      : right(_mm512_set1_epi32(1)),
        below(_mm512_set1_epi32(static_cast<std::int32_t>(w))),
        below_right(_mm512_set1_epi32(static_cast<std::int32_t>(w) + 1)) {}
};

// The maximum of a 2x2 window's taps t0 .. t3 (row by row) and its argmax (the first tap's index
// `at` plus the offset of the tap taken), as tap() after tap() gives them: where no tap holds a
// NaN, three strict compares (the first maximum wins) and the offset picked among registers; a
// NaN sends the window through tap(). Returns the lanes where a tap held a NaN.
MINIDL_AVX512_INLINE __mmask16 max_2x2(__m512 t0, __m512 t1, __m512 t2, __m512 t3, __m512i at,
                                       const Taps2x2& o, __m512& acc, __m512i& idx) {
  const __mmask16 nan =
      _mm512_cmp_ps_mask(t0, t1, _CMP_UNORD_Q) | _mm512_cmp_ps_mask(t2, t3, _CMP_UNORD_Q);
  acc = t0;
  if (nan == 0) [[likely]] {
    __mmask16 k = _mm512_cmp_ps_mask(t1, acc, _CMP_GT_OQ);
    acc = _mm512_mask_mov_ps(acc, k, t1);
    __m512i off = _mm512_maskz_mov_epi32(k, o.right);
    k = _mm512_cmp_ps_mask(t2, acc, _CMP_GT_OQ);
    acc = _mm512_mask_mov_ps(acc, k, t2);
    off = _mm512_mask_mov_epi32(off, k, o.below);
    k = _mm512_cmp_ps_mask(t3, acc, _CMP_GT_OQ);
    acc = _mm512_mask_mov_ps(acc, k, t3);
    off = _mm512_mask_mov_epi32(off, k, o.below_right);
    idx = _mm512_add_epi32(at, off);
  } else {
    idx = at;
    tap(t1, _mm512_add_epi32(at, o.right), acc, idx);
    tap(t2, _mm512_add_epi32(at, o.below), acc, idx);
    tap(t3, _mm512_add_epi32(at, o.below_right), acc, idx);
  }
  return nan;
}

// One output row oh of a group's 16 channels (masked by m) whose x starts at xg (step xs);
// emit(pos, acc, idx) stores each output. K2: 2x2 windows, no padding.
template <bool K2, typename TX, typename Emit>
MINIDL_AVX512_INLINE void fwd_row(const FwdArgs& a, const TX* xg, int64_t xs, __mmask16 m,
                                  int64_t oh, Emit&& emit) {
  const native::ConvGeom& g = a.g;
  const int64_t h0 = oh * g.SH - g.PH;
  const int64_t ih0 = std::max<int64_t>(h0, 0), ih1 = std::min(h0 + g.KH, g.H);
  const Taps2x2 taps(g.W);
  for (int64_t ow = 0; ow < g.OW; ++ow) {
    const int64_t w0 = ow * g.SW - g.PW;
    const int64_t iw0 = std::max<int64_t>(w0, 0), iw1 = std::min(w0 + g.KW, g.W);
    __m512 acc;
    __m512i idx;
    if constexpr (K2) {
      // The first tap always wins against -inf's start, or is -inf itself: it starts the window.
      const auto at = static_cast<std::int32_t>(ih0 * g.W + iw0);
      const TX* p = xg + at * xs;
      max_2x2(load16(p, m), load16(p + xs, m), load16(p + g.W * xs, m),
              load16(p + (g.W + 1) * xs, m), _mm512_set1_epi32(at), taps, acc, idx);
    } else {
      acc = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
      idx = _mm512_set1_epi32(static_cast<std::int32_t>(ih0 * g.W + iw0));
      for (int64_t ih = ih0; ih < ih1; ++ih) {
        for (int64_t iw = iw0; iw < iw1; ++iw) {
          const int64_t at = ih * g.W + iw;
          tap(load16(xg + at * xs, m), _mm512_set1_epi32(static_cast<std::int32_t>(at)), acc, idx);
        }
      }
    }
    if (a.relu) relu_clamp(acc, idx);
    emit(oh * g.OW + ow, acc, idx);
  }
}

// How many windows ahead the 2x2 row kernels prefetch what they read and write.
constexpr int64_t kAhead = 8;

// One output row oh of a group's 16 channels (masked by m) under 2x2 windows of stride 2 (no
// padding), each value stored where it lies (x, y and argmax at their group's bases, steps xs, ys
// and as). Between bf16 values the maximum of a window without NaNs is a bf16 value already, stored
// without rounding.
template <typename TX, typename TY>
MINIDL_AVX512_INLINE void fwd_row_2x2(const FwdArgs& a, const TX* xg, int64_t xs, TY* yg,
                                      int64_t ys, std::int32_t* ag, int64_t as, __mmask16 m,
                                      int64_t oh) {
  const native::ConvGeom& g = a.g;
  const TX* r0 = xg + 2 * oh * g.W * xs;
  const TX* r1 = r0 + g.W * xs;
  const Taps2x2 taps(g.W);
  const __m512i two = _mm512_set1_epi32(2);
  __m512i at = _mm512_set1_epi32(static_cast<std::int32_t>(2 * oh * g.W));
  for (int64_t ow = 0; ow < g.OW; ++ow) {
    // Both input rows a few windows ahead: in training x was written a while before, or past
    // the caches (oneDNN's Winograd convolutions), and comes from memory (performance.md).
    __builtin_prefetch(r0 + (2 * ow + kAhead) * xs, 0, 3);
    __builtin_prefetch(r0 + (2 * ow + kAhead + 1) * xs, 0, 3);
    __builtin_prefetch(r1 + (2 * ow + kAhead) * xs, 0, 3);
    __builtin_prefetch(r1 + (2 * ow + kAhead + 1) * xs, 0, 3);
    __m512 acc;
    __m512i idx;
    const __mmask16 nan =
        max_2x2(load16(r0 + 2 * ow * xs, m), load16(r0 + (2 * ow + 1) * xs, m),
                load16(r1 + 2 * ow * xs, m), load16(r1 + (2 * ow + 1) * xs, m), at, taps, acc, idx);
    if (a.relu) relu_clamp(acc, idx);
    if constexpr (std::is_same_v<TX, std::uint16_t> && std::is_same_v<TY, std::uint16_t>) {
      if (nan == 0) [[likely]] {
        store_bits(yg + ow * ys, m, _mm512_maskz_srli_epi32(0xffff, _mm512_castps_si512(acc), 16));
      } else {
        store16(yg + ow * ys, m, acc);
      }
    } else {
      store16(yg + ow * ys, m, acc);
    }
    _mm512_mask_storeu_epi32(ag + ow * as, m, idx);
    at = _mm512_add_epi32(at, two);
  }
}

template <typename TX, typename Emit>
MINIDL_AVX512_INLINE void fwd_row_any(const FwdArgs& a, const TX* xg, int64_t xs, __mmask16 m,
                                      int64_t oh, Emit&& emit) {
  if (a.g.KH == 2 && a.g.KW == 2 && a.g.PH == 0 && a.g.PW == 0) {
    fwd_row<true>(a, xg, xs, m, oh, emit);
  } else {
    fwd_row<false>(a, xg, xs, m, oh, emit);
  }
}

// Groups of 8 channels side by side (nChw8c, or nhwc with 8), 2x2 windows with column stride 2,
// no padding, y and argmax in x's layout: two neighbouring outputs share a vector (lanes 0-7 the
// first, 8-15 the second), whose four input positions are 32 consecutive values.
template <typename TX, typename TY>
MINIDL_AVX512_INLINE void fwd_row_pairs(const FwdArgs& a, const TX* xg, TY* yg, std::int32_t* ag,
                                        int64_t oh) {
  const native::ConvGeom& g = a.g;
  const int64_t ih0 = oh * g.SH, w = g.W;
  const __m512 zero = _mm512_setzero_ps();
  // Index offsets of the pair's first taps: the second output's window starts 2 columns on.
  const __m512i pair = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 2, 2, 2, 2, 2, 2, 2, 2);
  const __m512i one = _mm512_set1_epi32(1), down = _mm512_set1_epi32(static_cast<int>(w));
  for (int64_t ow = 0; ow < g.OW; ow += 2) {
    const __mmask16 m = g.OW - ow >= 2 ? __mmask16{0xffff} : __mmask16{0xff};
    const __mmask16 m_hi = g.OW - ow >= 2 ? __mmask16{0xffff} : __mmask16{0};
    const auto at = static_cast<std::int32_t>(ih0 * w + 2 * ow);
    const TX* p = xg + at * 8;
    // Row r's positions 2ow .. 2ow + 3: [p0 p1] and [p2 p3]; the left taps [p0 p2], the right
    // [p1 p3].
    const __m512i top = _mm512_add_epi32(_mm512_set1_epi32(at), pair);
    const __m512i bottom = _mm512_add_epi32(top, down);
    const __m512 t0 = load16(p, 0xffff), t1 = load16(p + 16, m_hi);
    const __m512 b0 = load16(p + w * 8, 0xffff), b1 = load16(p + w * 8 + 16, m_hi);
    __m512 acc = _mm512_mask_shuffle_f32x4(zero, 0xffff, t0, t1, 0x44);
    __m512i idx = top;
    tap(_mm512_mask_shuffle_f32x4(zero, 0xffff, t0, t1, 0xee), _mm512_add_epi32(top, one), acc,
        idx);
    tap(_mm512_mask_shuffle_f32x4(zero, 0xffff, b0, b1, 0x44), bottom, acc, idx);
    tap(_mm512_mask_shuffle_f32x4(zero, 0xffff, b0, b1, 0xee), _mm512_add_epi32(bottom, one), acc,
        idx);
    if (a.relu) relu_clamp(acc, idx);
    const int64_t pos = oh * g.OW + ow;
    store16(yg + pos * 8, m, acc);
    _mm512_mask_storeu_epi32(ag + pos * 8, m, idx);
  }
}

template <typename TX, typename TY>
void fwd_rows_impl(const FwdArgs& a, const TX* src, TY* dst, std::int32_t* argmax, int64_t u0,
                   int64_t u1) {
  const native::ConvGeom& g = a.g;
  const int64_t lanes = a.x.block, xs = a.x.step(), ys = a.y.step(), as = a.am.step();
  const bool pairs = g.KH == 2 && g.KW == 2 && g.SW == 2 && g.PH == 0 && g.PW == 0;
  for (int64_t u = u0; u < u1; ++u) {
    const int64_t grp = u / g.OH, oh = u % g.OH;
    const int64_t n = grp / a.groups_per_n, c0 = grp % a.groups_per_n * lanes;
    for (int64_t j0 = 0; j0 < lanes; j0 += 16) {
      const int64_t c = c0 + j0;
      const __mmask16 m = first_lanes(lanes - j0);
      if (a.contiguous && lanes == 8 && pairs) {
        fwd_row_pairs(a, src + a.x.base(n, c), dst + a.y.base(n, c), argmax + a.am.base(n, c), oh);
        continue;
      }
      if (a.contiguous && stride_2x2(g)) {
        fwd_row_2x2(a, src + a.x.base(n, c), xs, dst + a.y.base(n, c) + oh * g.OW * ys, ys,
                    argmax + a.am.base(n, c) + oh * g.OW * as, as, m, oh);
        continue;
      }
      if (a.contiguous) {
        TY* yg = dst + a.y.base(n, c);
        std::int32_t* ag = argmax + a.am.base(n, c);
        fwd_row_any(a, src + a.x.base(n, c), xs, m, oh, [&](int64_t pos, __m512 v, __m512i i) {
          store16(yg + pos * ys, m, v);
          _mm512_mask_storeu_epi32(ag + pos * as, m, i);
        });
        continue;
      }
      // Outputs in another layout than x: each lane's own address, from its base computed once.
      const int nl = __builtin_popcount(m);
      int64_t yb[16], ab[16];
      for (int j = 0; j < nl; ++j) yb[j] = a.y.base(n, c + j), ab[j] = a.am.base(n, c + j);
      fwd_row_any(a, src + a.x.base(n, c), xs, m, oh, [&](int64_t pos, __m512 v, __m512i i) {
        alignas(64) float vals[16];
        alignas(64) std::int32_t idxs[16];
        _mm512_store_ps(vals, v);
        _mm512_store_si512(idxs, i);
        for (int j = 0; j < nl; ++j) {
          store1(dst + yb[j] + pos * ys, vals[j]);
          argmax[ab[j] + pos * as] = idxs[j];
        }
      });
    }
  }
}

// This thread's tiles of [position][16 channels] for a plane of `plane` positions (rounded up to
// whole transposes of 16): values and argmax, kept between calls.
struct Tiles {
  float* values;
  std::int32_t* argmax;
};
Tiles thread_tiles(int64_t plane) {
  const auto n = static_cast<std::size_t>((plane + 15) / 16 * 16 * 16);
  thread_local std::vector<float> values;
  thread_local std::vector<std::int32_t> argmax;
  values.resize(n);
  argmax.resize(n);
  return {values.data(), argmax.data()};
}

// fn(n, c, m, nl) for every run of up to 16 channels of groups [g0, g1) of `lanes` channels each
// (groups_per_n to a sample): sample n, first channel c, the mask m of its lanes and their count.
template <typename Fn>
void for_each_lane_run(int64_t groups_per_n, int64_t lanes, int64_t g0, int64_t g1, Fn&& fn) {
  for (int64_t grp = g0; grp < g1; ++grp) {
    const int64_t n = grp / groups_per_n, c0 = grp % groups_per_n * lanes;
    for (int64_t j0 = 0; j0 < lanes; j0 += 16) {
      const __mmask16 m = first_lanes(lanes - j0);
      fn(n, c0 + j0, m, __builtin_popcount(m));
    }
  }
}

// Groups [g0, g1) whose y and argmax are plain: each group's plane of 16 channels is pooled into
// a tile of [position][16 channels], then transposed 16 positions at a time into the channels'
// plain rows (pool2 before the flatten).
template <typename TX, typename TY>
void fwd_planes_to_plain_impl(const FwdArgs& a, const TX* src, TY* dst, std::int32_t* argmax,
                              int64_t g0, int64_t g1) {
  const native::ConvGeom& g = a.g;
  const int64_t lanes = a.x.block, xs = a.x.step(), plane = g.OH * g.OW;
  const Tiles tiles = thread_tiles(plane);
  float* ty = tiles.values;
  std::int32_t* ta = tiles.argmax;
  for_each_lane_run(a.groups_per_n, lanes, g0, g1, [&](int64_t n, int64_t c, __mmask16 m, int nl) {
    for (int64_t oh = 0; oh < g.OH; ++oh) {
      if (stride_2x2(g)) {
        fwd_row_2x2(a, src + a.x.base(n, c), xs, ty + oh * g.OW * 16, 16, ta + oh * g.OW * 16, 16,
                    m, oh);
        continue;
      }
      fwd_row_any(a, src + a.x.base(n, c), xs, m, oh, [&](int64_t pos, __m512 v, __m512i i) {
        _mm512_storeu_ps(ty + pos * 16, v);
        _mm512_storeu_si512(ta + pos * 16, i);
      });
    }
    TY* yj[16];
    std::int32_t* aj[16];
    for (int j = 0; j < nl; ++j)
      yj[j] = dst + a.y.base(n, c + j), aj[j] = argmax + a.am.base(n, c + j);
    for (int64_t p0 = 0; p0 < plane; p0 += 16) {
      const __mmask16 pm = first_lanes(plane - p0);
      __m512 r[16], q[16];
      for (int k = 0; k < 16; ++k) {
        r[k] = _mm512_loadu_ps(ty + (p0 + k) * 16);
        q[k] = _mm512_loadu_ps(reinterpret_cast<const float*>(ta + (p0 + k) * 16));
      }
      transpose16(r);
      transpose16(q);
      for (int j = 0; j < nl; ++j) {
        store16(yj[j] + p0, pm, r[j]);
        _mm512_mask_storeu_epi32(aj[j] + p0, pm, _mm512_castps_si512(q[j]));
      }
    }
  });
}

// Input row ih of a group's 16 channels (masked by m): dx at d (step xs), dy at dy (step ys),
// argmax at am (step as), each at the group's base.
template <typename TD, typename TY>
MINIDL_AVX512_INLINE void bwd_row(const BwdArgs& a, TD* d, int64_t xs, const TY* dy, int64_t ys,
                                  const std::int32_t* am, int64_t as, __mmask16 m, int64_t ih) {
  const native::ConvGeom& g = a.g;
  const __m512i zero = _mm512_setzero_si512();
  const int64_t oh = ih / g.SH;
  d += ih * g.W * xs;
  int64_t iw = 0;
  if (oh < g.OH && ih - oh * g.SH < g.KH) {
    for (int64_t ow = 0; ow < g.OW; ++ow) {
      const int64_t pos = oh * g.OW + ow;
      const __m512i v = grad_bits<TD>(dy + pos * ys, m);
      const __m512i i = _mm512_maskz_loadu_epi32(m, am + pos * as);
      for (int64_t s = 0; s < g.SW && iw < g.W; ++s, ++iw) {
        if (s < g.KW) {
          const __m512i at = _mm512_set1_epi32(static_cast<std::int32_t>(ih * g.W + iw));
          store_bits(d + iw * xs, m, _mm512_maskz_mov_epi32(_mm512_cmpeq_epi32_mask(i, at), v));
        } else {
          store_bits(d + iw * xs, m, zero);
        }
      }
    }
  }
  for (; iw < g.W; ++iw) store_bits(d + iw * xs, m, zero);  // no window covers them
}

// Whether input row ih starts the two rows of a row of 2x2 windows of stride 2 (no padding) that
// bwd_rows_2x2 writes together.
MINIDL_AVX512_INLINE bool rows_2x2(const native::ConvGeom& g, int64_t ih) {
  return stride_2x2(g) && ih % 2 == 0 && ih + 1 < g.H;
}

// Input rows 2 oh and 2 oh + 1 of a group's 16 channels (masked by m) under 2x2 windows of
// stride 2: each output's dy and argmax are loaded once for the four positions of its window.
template <typename TD, typename TY>
MINIDL_AVX512_INLINE void bwd_rows_2x2(const BwdArgs& a, TD* d, int64_t xs, const TY* dy,
                                       int64_t ys, const std::int32_t* am, int64_t as, __mmask16 m,
                                       int64_t oh) {
  const native::ConvGeom& g = a.g;
  const __m512i zero = _mm512_setzero_si512(), two = _mm512_set1_epi32(2);
  const Taps2x2 taps(g.W);
  TD* r0 = d + 2 * oh * g.W * xs;
  TD* r1 = r0 + g.W * xs;
  __m512i at = _mm512_set1_epi32(static_cast<std::int32_t>(2 * oh * g.W));
  const TY* dyr = dy + oh * g.OW * ys;
  const std::int32_t* amr = am + oh * g.OW * as;
  for (int64_t ow = 0; ow < g.OW; ++ow) {
    // dy and argmax a few windows ahead, and the line of each dx row written there (both lines
    // of an f32 row slowed the f32 backward down).
    __builtin_prefetch(dyr + (ow + kAhead) * ys, 0, 3);
    __builtin_prefetch(amr + (ow + kAhead) * as, 0, 3);
    __builtin_prefetch(r0 + (2 * ow + kAhead) * xs, 1, 3);
    __builtin_prefetch(r1 + (2 * ow + kAhead) * xs, 1, 3);
    const __m512i v = grad_bits<TD>(dyr + ow * ys, m);
    const __m512i i = _mm512_maskz_loadu_epi32(m, amr + ow * as);
    // Each of the window's four positions gets dy where the argmax names it, +0 elsewhere.
    const auto routed = [&](__m512i position) {
      return _mm512_maskz_mov_epi32(_mm512_cmpeq_epi32_mask(i, position), v);
    };
    store_bits(r0 + 2 * ow * xs, m, routed(at));
    store_bits(r0 + (2 * ow + 1) * xs, m, routed(_mm512_add_epi32(at, taps.right)));
    store_bits(r1 + 2 * ow * xs, m, routed(_mm512_add_epi32(at, taps.below)));
    store_bits(r1 + (2 * ow + 1) * xs, m, routed(_mm512_add_epi32(at, taps.below_right)));
    at = _mm512_add_epi32(at, two);
  }
  for (int64_t iw = 2 * g.OW; iw < g.W; ++iw) {  // no window covers them
    store_bits(r0 + iw * xs, m, zero);
    store_bits(r1 + iw * xs, m, zero);
  }
}

// The backward of fwd_row_pairs' windows (8 channels side by side, 2x2, column stride 2, dy and
// argmax in dx's layout): input row ih, two neighbouring outputs per vector, whose four columns
// are 32 consecutive values of dx.
template <typename TD, typename TY>
MINIDL_AVX512_INLINE void bwd_row_pairs(const BwdArgs& a, TD* d, const TY* dy,
                                        const std::int32_t* am, int64_t ih) {
  const native::ConvGeom& g = a.g;
  const __m512i zero = _mm512_setzero_si512();
  const __m512i pair = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 2, 2, 2, 2, 2, 2, 2, 2);
  const __m512i one = _mm512_set1_epi32(1);
  const int64_t oh = ih / g.SH;
  d += ih * g.W * 8;
  int64_t iw = 0;
  if (oh < g.OH && ih - oh * g.SH < 2) {
    for (int64_t ow = 0; ow < g.OW; ow += 2, iw += 4) {
      const bool two = g.OW - ow >= 2;
      const __mmask16 m = two ? __mmask16{0xffff} : __mmask16{0xff};
      const int64_t pos = oh * g.OW + ow;
      const __m512i v = grad_bits<TD>(dy + pos * 8, m);
      const __m512i i = _mm512_maskz_loadu_epi32(m, am + pos * 8);
      const __m512i left =
          _mm512_add_epi32(_mm512_set1_epi32(static_cast<std::int32_t>(ih * g.W + iw)), pair);
      // Lanes 0-7 the first output's column, 8-15 the second's.
      const __m512i l = _mm512_maskz_mov_epi32(_mm512_cmpeq_epi32_mask(i, left), v);
      const __m512i r =
          _mm512_maskz_mov_epi32(_mm512_cmpeq_epi32_mask(i, _mm512_add_epi32(left, one)), v);
      store_bits(d + iw * 8, 0xffff, _mm512_mask_shuffle_i32x4(zero, 0xffff, l, r, 0x44));
      if (two)
        store_bits(d + iw * 8 + 16, 0xffff, _mm512_mask_shuffle_i32x4(zero, 0xffff, l, r, 0xee));
    }
    iw = std::min(iw, 2 * g.OW);
  }
  for (; iw < g.W; ++iw) store_bits(d + iw * 8, 0xff, zero);  // no window covers them
}

template <typename TD, typename TY>
void bwd_rows_disjoint_impl(const BwdArgs& a, TD* dst, const TY* src, const std::int32_t* argmax,
                            int64_t u0, int64_t u1) {
  const native::ConvGeom& g = a.g;
  const int64_t lanes = a.dx.block, xs = a.dx.step(), ys = a.dy.step(), as = a.am.step();
  const bool pairs = lanes == 8 && g.KH == 2 && g.KW == 2 && g.SW == 2;  // disjoint: no padding
  for (int64_t u = u0; u < u1; ++u) {
    const int64_t grp = u / g.H, ih = u % g.H;
    const int64_t n = grp / a.groups_per_n, c0 = grp % a.groups_per_n * lanes;
    if (pairs) {
      bwd_row_pairs(a, dst + a.dx.base(n, c0), src + a.dy.base(n, c0), argmax + a.am.base(n, c0),
                    ih);
      continue;
    }
    const bool both = rows_2x2(g, ih) && u + 1 < u1;  // this thread has both rows
    for (int64_t j0 = 0; j0 < lanes; j0 += 16) {
      const int64_t c = c0 + j0;
      if (both) {
        bwd_rows_2x2(a, dst + a.dx.base(n, c), xs, src + a.dy.base(n, c), ys,
                     argmax + a.am.base(n, c), as, first_lanes(lanes - j0), ih / 2);
      } else {
        bwd_row(a, dst + a.dx.base(n, c), xs, src + a.dy.base(n, c), ys, argmax + a.am.base(n, c),
                as, first_lanes(lanes - j0), ih);
      }
    }
    if (both) ++u;
  }
}

// Groups [g0, g1) whose dy (f32) and argmax are plain (after the flatten): each group's planes of
// dy and argmax are transposed 16 positions at a time into tiles of [position][16 channels],
// which the rows then read as if they lay in dx's layout.
template <typename TD>
void bwd_planes_from_plain_impl(const BwdArgs& a, TD* dst, const float* src,
                                const std::int32_t* argmax, int64_t g0, int64_t g1) {
  const native::ConvGeom& g = a.g;
  const int64_t lanes = a.dx.block, xs = a.dx.step(), plane = g.OH * g.OW;
  const Tiles tiles = thread_tiles(plane);
  float* td = tiles.values;
  std::int32_t* ta = tiles.argmax;
  for_each_lane_run(a.groups_per_n, lanes, g0, g1, [&](int64_t n, int64_t c, __mmask16 m, int nl) {
    const float* yj[16];
    const std::int32_t* aj[16];
    for (int j = 0; j < nl; ++j)
      yj[j] = src + a.dy.base(n, c + j), aj[j] = argmax + a.am.base(n, c + j);
    for (int64_t p0 = 0; p0 < plane; p0 += 16) {
      const __mmask16 pm = first_lanes(plane - p0);
      __m512 r[16], q[16];
      for (int j = 0; j < 16; ++j) {
        if (j < nl) {
          r[j] = _mm512_maskz_loadu_ps(pm, yj[j] + p0);
          q[j] = _mm512_castsi512_ps(_mm512_maskz_loadu_epi32(pm, aj[j] + p0));
        } else {
          r[j] = q[j] = _mm512_setzero_ps();
        }
      }
      transpose16(r);
      transpose16(q);
      for (int k = 0; k < 16; ++k) {
        _mm512_storeu_ps(td + (p0 + k) * 16, r[k]);
        _mm512_storeu_ps(reinterpret_cast<float*>(ta + (p0 + k) * 16), q[k]);
      }
    }
    for (int64_t ih = 0; ih < g.H; ++ih) {
      if (rows_2x2(g, ih)) {
        bwd_rows_2x2(a, dst + a.dx.base(n, c), xs, td, int64_t{16}, ta, int64_t{16}, m, ih / 2);
        ++ih;
      } else {
        bwd_row(a, dst + a.dx.base(n, c), xs, td, int64_t{16}, ta, int64_t{16}, m, ih);
      }
    }
  });
}

}  // namespace

void fwd_plain_2x2_avx512(const native::ConvGeom& g, const float* src, float* dst,
                          std::int32_t* argmax, int64_t p0, int64_t p1, bool relu) {
  const int64_t in_plane = g.H * g.W, out_plane = g.OH * g.OW, w = g.W;
  // Lanes 0..15 of a pair of 16-float loads holding 32 consecutive columns: the even columns
  // (each window's left tap) and the odd ones (its right tap).
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
  const __m512i twice =
      _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  for (int64_t p = p0; p < p1; ++p) {
    for (int64_t oh = 0; oh < g.OH; ++oh) {
      const float* r0 = src + p * in_plane + 2 * oh * w;
      const float* r1 = r0 + w;
      float* y = dst + p * out_plane + oh * g.OW;
      std::int32_t* am = argmax + p * out_plane + oh * g.OW;
      for (int64_t ow = 0; ow < g.OW; ow += 16) {
        const int64_t rem = std::min<int64_t>(16, g.OW - ow);
        const __mmask16 m = first_lanes(rem), lo = first_lanes(2 * rem),
                        hi = first_lanes(std::max<int64_t>(2 * rem - 16, 0));
        const __m512 t0 = _mm512_maskz_loadu_ps(lo, r0 + 2 * ow);
        const __m512 t1 = _mm512_maskz_loadu_ps(hi, r0 + 2 * ow + 16);
        const __m512 b0 = _mm512_maskz_loadu_ps(lo, r1 + 2 * ow);
        const __m512 b1 = _mm512_maskz_loadu_ps(hi, r1 + 2 * ow + 16);
        const __m512i at = _mm512_add_epi32(
            _mm512_set1_epi32(static_cast<std::int32_t>(2 * oh * w + 2 * ow)), twice);
        const __m512i one = _mm512_set1_epi32(1), down = _mm512_set1_epi32(static_cast<int>(w));
        __m512 acc = _mm512_permutex2var_ps(t0, even, t1);
        __m512i idx = at;
        tap(_mm512_permutex2var_ps(t0, odd, t1), _mm512_add_epi32(at, one), acc, idx);
        tap(_mm512_permutex2var_ps(b0, even, b1), _mm512_add_epi32(at, down), acc, idx);
        tap(_mm512_permutex2var_ps(b0, odd, b1), _mm512_add_epi32(_mm512_add_epi32(at, down), one),
            acc, idx);
        if (relu) relu_clamp(acc, idx);
        _mm512_mask_storeu_ps(y + ow, m, acc);
        _mm512_mask_storeu_epi32(am + ow, m, idx);
      }
    }
  }
}

void bwd_plain_2x2_avx512(const native::ConvGeom& g, const float* dy, const std::int32_t* argmax,
                          float* dx, int64_t p0, int64_t p1) {
  const int64_t in_plane = g.H * g.W, out_plane = g.OH * g.OW, w = g.W;
  // Interleaving a window's left and right values back into 32 consecutive columns.
  const __m512i ilv_lo = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
  const __m512i ilv_hi =
      _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
  const __m512i twice =
      _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i one = _mm512_set1_epi32(1), down = _mm512_set1_epi32(static_cast<int>(w));
  const __m512 zero = _mm512_setzero_ps();
  for (int64_t p = p0; p < p1; ++p) {
    float* d = dx + p * in_plane;
    for (int64_t oh = 0; oh < g.OH; ++oh) {
      float* r0 = d + 2 * oh * w;
      float* r1 = r0 + w;
      const float* gy = dy + p * out_plane + oh * g.OW;
      const std::int32_t* am = argmax + p * out_plane + oh * g.OW;
      for (int64_t ow = 0; ow < g.OW; ow += 16) {
        const int64_t rem = std::min<int64_t>(16, g.OW - ow);
        const __mmask16 m = first_lanes(rem), lo = first_lanes(2 * rem),
                        hi = first_lanes(std::max<int64_t>(2 * rem - 16, 0));
        const __m512 v = _mm512_add_ps(zero, _mm512_maskz_loadu_ps(m, gy + ow));
        const __m512i i = _mm512_maskz_loadu_epi32(m, am + ow);
        const __m512i at = _mm512_add_epi32(
            _mm512_set1_epi32(static_cast<std::int32_t>(2 * oh * w + 2 * ow)), twice);
        const __m512i at_b = _mm512_add_epi32(at, down);
        const __m512 tl = _mm512_maskz_mov_ps(_mm512_cmpeq_epi32_mask(i, at), v);
        const __m512 tr =
            _mm512_maskz_mov_ps(_mm512_cmpeq_epi32_mask(i, _mm512_add_epi32(at, one)), v);
        const __m512 bl = _mm512_maskz_mov_ps(_mm512_cmpeq_epi32_mask(i, at_b), v);
        const __m512 br =
            _mm512_maskz_mov_ps(_mm512_cmpeq_epi32_mask(i, _mm512_add_epi32(at_b, one)), v);
        _mm512_mask_storeu_ps(r0 + 2 * ow, lo, _mm512_permutex2var_ps(tl, ilv_lo, tr));
        _mm512_mask_storeu_ps(r0 + 2 * ow + 16, hi, _mm512_permutex2var_ps(tl, ilv_hi, tr));
        _mm512_mask_storeu_ps(r1 + 2 * ow, lo, _mm512_permutex2var_ps(bl, ilv_lo, br));
        _mm512_mask_storeu_ps(r1 + 2 * ow + 16, hi, _mm512_permutex2var_ps(bl, ilv_hi, br));
      }
      for (int64_t iw = 2 * g.OW; iw < w; ++iw) r0[iw] = r1[iw] = 0.0f;  // no window covers them
    }
    std::fill(d + 2 * g.OH * w, d + in_plane, 0.0f);
  }
}

#define MINIDL_POOL_DEFINE(T1, T2)                                                                 \
  void fwd_rows_avx512(const FwdArgs& a, const T1* src, T2* dst, std::int32_t* argmax, int64_t u0, \
                       int64_t u1) {                                                               \
    fwd_rows_impl(a, src, dst, argmax, u0, u1);                                                    \
  }                                                                                                \
  void fwd_planes_to_plain_avx512(const FwdArgs& a, const T1* src, T2* dst, std::int32_t* argmax,  \
                                  int64_t g0, int64_t g1) {                                        \
    fwd_planes_to_plain_impl(a, src, dst, argmax, g0, g1);                                         \
  }                                                                                                \
  void bwd_rows_disjoint_avx512(const BwdArgs& a, T1* dst, const T2* src,                          \
                                const std::int32_t* argmax, int64_t u0, int64_t u1) {              \
    bwd_rows_disjoint_impl(a, dst, src, argmax, u0, u1);                                           \
  }

MINIDL_POOL_DEFINE(float, float)
MINIDL_POOL_DEFINE(float, std::uint16_t)
MINIDL_POOL_DEFINE(std::uint16_t, float)
MINIDL_POOL_DEFINE(std::uint16_t, std::uint16_t)

void bwd_planes_from_plain_avx512(const BwdArgs& a, float* dst, const float* src,
                                  const std::int32_t* argmax, int64_t g0, int64_t g1) {
  bwd_planes_from_plain_impl(a, dst, src, argmax, g0, g1);
}
void bwd_planes_from_plain_avx512(const BwdArgs& a, std::uint16_t* dst, const float* src,
                                  const std::int32_t* argmax, int64_t g0, int64_t g1) {
  bwd_planes_from_plain_impl(a, dst, src, argmax, g0, g1);
}

#pragma GCC pop_options

#else  // not x86-64: the portable kernels run everywhere

bool avx512_kernels() { return false; }

#define MINIDL_POOL_DEFINE(T1, T2)                                                            \
  void fwd_rows_avx512(const FwdArgs&, const T1*, T2*, std::int32_t*, int64_t, int64_t) {}    \
  void fwd_planes_to_plain_avx512(const FwdArgs&, const T1*, T2*, std::int32_t*, int64_t,     \
                                  int64_t) {}                                                 \
  void bwd_rows_disjoint_avx512(const BwdArgs&, T1*, const T2*, const std::int32_t*, int64_t, \
                                int64_t) {}

MINIDL_POOL_DEFINE(float, float)
MINIDL_POOL_DEFINE(float, std::uint16_t)
MINIDL_POOL_DEFINE(std::uint16_t, float)
MINIDL_POOL_DEFINE(std::uint16_t, std::uint16_t)

void bwd_planes_from_plain_avx512(const BwdArgs&, float*, const float*, const std::int32_t*,
                                  int64_t, int64_t) {}
void bwd_planes_from_plain_avx512(const BwdArgs&, std::uint16_t*, const float*, const std::int32_t*,
                                  int64_t, int64_t) {}
void fwd_plain_2x2_avx512(const native::ConvGeom&, const float*, float*, std::int32_t*, int64_t,
                          int64_t, bool) {}
void bwd_plain_2x2_avx512(const native::ConvGeom&, const float*, const std::int32_t*, float*,
                          int64_t, int64_t) {}

#endif

}  // namespace minidl::ops::pool
