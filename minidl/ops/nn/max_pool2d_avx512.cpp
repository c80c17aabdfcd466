// The AVX-512 kernels of max_pool2d (declared in max_pool2d_lanes.hpp, chosen at run time by
// max_pool2d.cpp when the CPU has AVX-512 F, BW and VL). Each keeps the running maximum and its
// index of 16 outputs in two registers, so a window tap is one load, two compares and two masked
// moves; tails of fewer than 16 channels or outputs are masked loads and stores, which touch no
// lane they skip. The portable kernels compiled with target_clones kept their per-lane
// accumulators in stack arrays reloaded at every tap, behind loops whose trip count (8 or 16
// lanes) was known only at run time; they stay for every other CPU and are the tests' reference.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <limits>
#include <type_traits>

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
  const __m512i h = _mm512_maskz_cvtepu16_epi32(0xffff, _mm256_maskz_loadu_epi16(m, p));
  return _mm512_castsi512_ps(_mm512_maskz_slli_epi32(0xffff, h, 16));
}

// f32 -> bf16 bits (in the low half of each lane): round to nearest even, a NaN made quiet, as
// the portable store().
MINIDL_AVX512_INLINE __m512i bf16_bits(__m512 v) {
  const __m512i u = _mm512_castps_si512(v);
  const __m512i lsb =
      _mm512_and_si512(_mm512_maskz_srli_epi32(0xffff, u, 16), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb);
  const __m512i quiet = _mm512_or_si512(u, _mm512_set1_epi32(0x400000));
  const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  return _mm512_maskz_srli_epi32(0xffff, _mm512_mask_mov_epi32(rounded, nan, quiet), 16);
}

MINIDL_AVX512_INLINE void store16(float* p, __mmask16 m, __m512 v) {
  _mm512_mask_storeu_ps(p, m, v);
}
MINIDL_AVX512_INLINE void store16(std::uint16_t* p, __mmask16 m, __m512 v) {
  _mm256_mask_storeu_epi16(p, m, _mm512_maskz_cvtepi32_epi16(0xffff, bf16_bits(v)));
}

MINIDL_AVX512_INLINE void store1(float* p, float v) { *p = v; }
MINIDL_AVX512_INLINE void store1(std::uint16_t* p, float v) {
  *p = static_cast<std::uint16_t>(
      _mm_cvtsi128_si32(_mm512_castsi512_si128(bf16_bits(_mm512_set1_ps(v)))));
}

// Bits of an element of dx (f32, or bf16 in the low half): stored as they are.
MINIDL_AVX512_INLINE void store_bits(float* p, __mmask16 m, __m512i v) {
  _mm512_mask_storeu_epi32(p, m, v);
}
MINIDL_AVX512_INLINE void store_bits(std::uint16_t* p, __mmask16 m, __m512i v) {
  _mm256_mask_storeu_epi16(p, m, _mm512_maskz_cvtepi32_epi16(0xffff, v));
}

// The bits dx takes where the argmax names it: 0.0f + dy (a -0 becomes +0) in dx's type; between
// bf16 values the bits of dy but for -0, in integers, as the portable store_grad.
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
      return bf16_bits(g);
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

// One output row of a group, channels [j0, j0 + 16) masked by m. K2: 2x2 windows, no padding.
template <bool K2, typename TX, typename TY>
MINIDL_AVX512_INLINE void fwd_row(const FwdArgs& a, const TX* src, TY* dst, std::int32_t* argmax,
                                  int64_t n, int64_t c, __mmask16 m, int64_t oh) {
  const native::ConvGeom& g = a.g;
  const int64_t xs = a.x.step(), ys = a.y.step(), as = a.am.step();
  const TX* xg = src + a.x.base(n, c);
  const int64_t h0 = oh * g.SH - g.PH;
  const int64_t ih0 = std::max<int64_t>(h0, 0), ih1 = std::min(h0 + g.KH, g.H);
  const __m512 zero = _mm512_setzero_ps();
  // Outputs in another layout than x: each lane's own address, from its base computed once.
  int64_t yb[16], ab[16];
  const int nl = __builtin_popcount(m);
  if (!a.contiguous) {
    for (int j = 0; j < nl; ++j) yb[j] = a.y.base(n, c + j), ab[j] = a.am.base(n, c + j);
  }
  for (int64_t ow = 0; ow < g.OW; ++ow) {
    const int64_t w0 = ow * g.SW - g.PW;
    const int64_t iw0 = std::max<int64_t>(w0, 0), iw1 = std::min(w0 + g.KW, g.W);
    __m512 acc;
    __m512i idx;
    if constexpr (K2) {
      const auto at = static_cast<std::int32_t>(ih0 * g.W + iw0);
      const TX* p = xg + at * xs;
      acc = load16(p, m);  // the first tap always wins against -inf's start, or is -inf itself
      idx = _mm512_set1_epi32(at);
      tap(load16(p + xs, m), _mm512_set1_epi32(at + 1), acc, idx);
      tap(load16(p + g.W * xs, m), _mm512_set1_epi32(at + static_cast<std::int32_t>(g.W)), acc,
          idx);
      tap(load16(p + (g.W + 1) * xs, m), _mm512_set1_epi32(at + static_cast<std::int32_t>(g.W) + 1),
          acc, idx);
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
    // acc where acc > 0, else +0 (a NaN or -0 included): relu's rule.
    if (a.relu) acc = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(acc, zero, _CMP_GT_OQ), acc);
    const int64_t pos = oh * g.OW + ow;
    if (a.contiguous) {
      store16(dst + a.y.base(n, c) + pos * ys, m, acc);
      _mm512_mask_storeu_epi32(argmax + a.am.base(n, c) + pos * as, m, idx);
    } else {
      alignas(64) float vals[16];
      alignas(64) std::int32_t idxs[16];
      _mm512_store_ps(vals, acc);
      _mm512_store_si512(idxs, idx);
      for (int j = 0; j < nl; ++j) {
        store1(dst + yb[j] + pos * ys, vals[j]);
        argmax[ab[j] + pos * as] = idxs[j];
      }
    }
  }
}

template <typename TX, typename TY>
void fwd_rows_impl(const FwdArgs& a, const TX* src, TY* dst, std::int32_t* argmax, int64_t u0,
                   int64_t u1) {
  const native::ConvGeom& g = a.g;
  const bool k2 = g.KH == 2 && g.KW == 2 && g.PH == 0 && g.PW == 0;
  const int64_t lanes = a.x.block;
  for (int64_t u = u0; u < u1; ++u) {
    const int64_t grp = u / g.OH, oh = u % g.OH;
    const int64_t n = grp / a.groups_per_n, c0 = grp % a.groups_per_n * lanes;
    for (int64_t j0 = 0; j0 < lanes; j0 += 16) {
      const __mmask16 m = first_lanes(lanes - j0);
      if (k2) {
        fwd_row<true>(a, src, dst, argmax, n, c0 + j0, m, oh);
      } else {
        fwd_row<false>(a, src, dst, argmax, n, c0 + j0, m, oh);
      }
    }
  }
}

template <typename TD, typename TY>
void bwd_rows_disjoint_impl(const BwdArgs& a, TD* dst, const TY* src, const std::int32_t* argmax,
                            int64_t u0, int64_t u1) {
  const native::ConvGeom& g = a.g;
  const int64_t lanes = a.dx.block, xs = a.dx.step(), ys = a.dy.step(), as = a.am.step();
  const __m512i zero = _mm512_setzero_si512();
  for (int64_t u = u0; u < u1; ++u) {
    const int64_t grp = u / g.H, ih = u % g.H;
    const int64_t n = grp / a.groups_per_n, c0 = grp % a.groups_per_n * lanes;
    const int64_t oh = ih / g.SH;
    const bool row = oh < g.OH && ih - oh * g.SH < g.KH;
    for (int64_t j0 = 0; j0 < lanes; j0 += 16) {
      const __mmask16 m = first_lanes(lanes - j0);
      TD* d = dst + a.dx.base(n, c0 + j0) + ih * g.W * xs;
      int64_t iw = 0;
      if (row) {
        const TY* dy = src + a.dy.base(n, c0 + j0);
        const std::int32_t* am = argmax + a.am.base(n, c0 + j0);
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
  }
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
  const __m512 zero = _mm512_setzero_ps();
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
        if (relu) acc = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(acc, zero, _CMP_GT_OQ), acc);
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
  void bwd_rows_disjoint_avx512(const BwdArgs& a, T1* dst, const T2* src,                          \
                                const std::int32_t* argmax, int64_t u0, int64_t u1) {              \
    bwd_rows_disjoint_impl(a, dst, src, argmax, u0, u1);                                           \
  }

MINIDL_POOL_DEFINE(float, float)
MINIDL_POOL_DEFINE(float, std::uint16_t)
MINIDL_POOL_DEFINE(std::uint16_t, float)
MINIDL_POOL_DEFINE(std::uint16_t, std::uint16_t)

#pragma GCC pop_options

#else  // not x86-64: the portable kernels run everywhere

bool avx512_kernels() { return false; }

#define MINIDL_POOL_DEFINE(T1, T2)                                                            \
  void fwd_rows_avx512(const FwdArgs&, const T1*, T2*, std::int32_t*, int64_t, int64_t) {}    \
  void bwd_rows_disjoint_avx512(const BwdArgs&, T1*, const T2*, const std::int32_t*, int64_t, \
                                int64_t) {}

MINIDL_POOL_DEFINE(float, float)
MINIDL_POOL_DEFINE(float, std::uint16_t)
MINIDL_POOL_DEFINE(std::uint16_t, float)
MINIDL_POOL_DEFINE(std::uint16_t, std::uint16_t)

void fwd_plain_2x2_avx512(const native::ConvGeom&, const float*, float*, std::int32_t*, int64_t,
                          int64_t, bool) {}
void bwd_plain_2x2_avx512(const native::ConvGeom&, const float*, const std::int32_t*, float*,
                          int64_t, int64_t) {}

#endif

}  // namespace minidl::ops::pool
