// f32 -> bf16 rounding, the one rule every kernel that stores bf16 uses: to nearest, ties to
// even (as oneDNN's reorders round), a NaN kept a NaN and made quiet. Branch-free, so that loops
// storing it vectorise; and 16 lanes at a time in AVX-512 registers, for the kernels compiled
// for it (GCC inlines a function of a narrower target into one of a wider).
#pragma once

#include <bit>
#include <cstdint>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace minidl::ops {

/// The bf16 bits of v.
[[gnu::always_inline]] inline std::uint16_t bf16_round(float v) {
  const auto u = std::bit_cast<std::uint32_t>(v);
  const std::uint32_t rounded = u + 0x7fffu + ((u >> 16) & 1u), quiet = u | 0x400000u;
  return static_cast<std::uint16_t>((v != v ? quiet : rounded) >> 16);
}

#if defined(__x86_64__)
/// The bf16 bits of each lane of v, in the low half of the lane (bf16_round, 16 at a time). The
/// masked forms with every lane selected: GCC 12's plain ones trip -Wmaybe-uninitialized.
[[gnu::always_inline, gnu::target("avx512f")]] inline __m512i bf16_round16(__m512 v) {
  const __m512i u = _mm512_castps_si512(v);
  const __m512i lsb =
      _mm512_and_si512(_mm512_maskz_srli_epi32(0xffff, u, 16), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb);
  const __m512i quiet = _mm512_or_si512(u, _mm512_set1_epi32(0x400000));
  const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  return _mm512_maskz_srli_epi32(0xffff, _mm512_mask_mov_epi32(rounded, nan, quiet), 16);
}
#endif

}  // namespace minidl::ops
