// A 16 x 16 transpose of 32-bit values in AVX-512 registers, for the kernels that cross between
// layouts a register at a time (max pooling's plain <-> blocked paths, the bf16 matrix packs).
// The masked forms with every lane selected: GCC 12's plain ones trip -Wmaybe-uninitialized.
#pragma once

#if defined(__x86_64__)
#include <immintrin.h>

namespace minidl::ops {

/// r[i] = column i of the 16x16 matrix of 32-bit values whose row i was r[i].
[[gnu::always_inline, gnu::target("avx512f")]] inline void transpose16(__m512 r[16]) {
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

}  // namespace minidl::ops
#endif
