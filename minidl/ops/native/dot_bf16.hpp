// What the native AVX512-BF16 kernels share (conv_bf16.cpp, gemm_bf16.cpp): whether this CPU runs
// them, the size of their register tiles, and the two packing steps: 16 values as bf16 bits, and
// two such runs interleaved into the pairs that vdpbf16ps multiplies (lane i of the result adds
// a[2i] * b[2i] + a[2i + 1] * b[2i + 1] to an f32 sum).
#pragma once

#include <bit>
#include <cstdint>
#include <string>
#include <type_traits>

#include "minidl/ops/bf16_round.hpp"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace minidl::native {

/// "" when this CPU runs the native AVX512-BF16 kernels (AVX512-BF16 with AVX-512 F, BW and VL,
/// and no AMX-BF16, whose tile kernels (native/amx_bf16.hpp) are faster than any dot-product loop)
/// and MINIDL_NATIVE_BF16 (read once) is not off; else why not.
std::string dot_bf16_unavailable();

namespace dot_bf16 {

constexpr std::int64_t kLanes = 16;  // f32 sums (and pairs of bf16) in a vector
constexpr int kMaxVectors = 4;       // vectors of 16 columns in a register tile
constexpr int kMaxRows = 12;         // rows in a register tile

/// The rows of a tile of `vectors` vectors: about 24 accumulators of the 32 registers.
constexpr int tile_rows(int vectors) { return vectors >= 3 ? 24 / vectors : kMaxRows; }

/// v as bf16 bits: stored bf16 as it is, f32 rounded (ops::bf16_round).
template <typename T>
inline std::uint16_t to_bf16(T v) {
  if constexpr (sizeof(T) == 2) {
    return v;
  } else {
    return ops::bf16_round(v);
  }
}

/// The f32 value of bf16 bits.
inline float widened(std::uint16_t bits) { return std::bit_cast<float>(std::uint32_t{bits} << 16); }

/// The 32-bit word vdpbf16ps reads as the pair (lo, hi).
inline std::uint32_t pair(std::uint16_t lo, std::uint16_t hi) {
  return std::uint32_t{lo} | (std::uint32_t{hi} << 16);
}

#if defined(__x86_64__)
// GCC 12's unmasked forms of some intrinsics start from an undefined vector and trip
// -Wmaybe-uninitialized: the masked forms with every lane selected are used instead.
#define MINIDL_DOT_BF16_INLINE \
  __attribute__((always_inline, target("avx512f,avx512bw,avx512vl,avx512bf16"))) inline

/// 16 values at p as bf16 bits: stored bf16 as they are, f32 rounded (ops::bf16_round16).
MINIDL_DOT_BF16_INLINE __m256i load16(const std::uint16_t* p) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}
MINIDL_DOT_BF16_INLINE __m256i load16(const float* p) {
  return _mm512_maskz_cvtepi32_epi16(0xffff, ops::bf16_round16(_mm512_loadu_ps(p)));
}

/// 16 bf16 values as f32 (exact: a bf16 is the upper half of an f32). AVX-512F only, so that
/// kernels compiled for AVX-512F alone inline it too.
__attribute__((always_inline, target("avx512f"))) inline __m512 widen16(__m256i bf16) {
  return _mm512_castsi512_ps(
      _mm512_maskz_slli_epi32(0xffff, _mm512_maskz_cvtepu16_epi32(0xffff, bf16), 16));
}

/// The 16 pairs (a[i], b[i]), lane i holding a[i] in its low half.
MINIDL_DOT_BF16_INLINE __m512i interleave(__m256i a, __m256i b) {
  const __m512i idx = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8,
                                       23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  const __m512i lo = _mm512_maskz_inserti64x4(0xff, _mm512_setzero_si512(), a, 0);
  const __m512i ab = _mm512_maskz_inserti64x4(0xff, lo, b, 1);
  return _mm512_maskz_permutexvar_epi16(~__mmask32{0}, idx, ab);
}

/// n values from src as bf16 bits into dst: bf16 copied, f32 rounded 16 at a time.
template <typename T>
MINIDL_DOT_BF16_INLINE void to_bf16_row(const T* src, std::int64_t n, std::uint16_t* dst) {
  if constexpr (sizeof(T) == 2) {
    for (std::int64_t i = 0; i < n; ++i) dst[i] = src[i];
  } else {
    std::int64_t i = 0;
    for (; i + kLanes <= n; i += kLanes)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), load16(src + i));
    for (; i < n; ++i) dst[i] = ops::bf16_round(src[i]);
  }
}

#undef MINIDL_DOT_BF16_INLINE
#endif

/// fn(p) with p typed as its values are stored: bf16 bits (std::uint16_t) or f32; const as given.
template <typename P, typename Fn>
void with_stored(P* p, bool bf16, Fn&& fn) {
  using U16 = std::conditional_t<std::is_const_v<P>, const std::uint16_t, std::uint16_t>;
  using F32 = std::conditional_t<std::is_const_v<P>, const float, float>;
  if (bf16) {
    fn(static_cast<U16*>(p));
  } else {
    fn(static_cast<F32*>(p));
  }
}

/// fn(p, q), each typed as its values are stored (the kernels' entry points over two tensors).
template <typename P, typename Q, typename Fn>
void with_stored(P* p, bool p_bf16, Q* q, bool q_bf16, Fn&& fn) {
  with_stored(p, p_bf16, [&](auto* tp) { with_stored(q, q_bf16, [&](auto* tq) { fn(tp, tq); }); });
}

}  // namespace dot_bf16
}  // namespace minidl::native
